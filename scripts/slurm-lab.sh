#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, from Debian's packages (slurm-wlm, munge), for the
# Slurm tests and for trying `srun tbbench ...` / `sbatch` without a site's cluster.
#
#   scripts/slurm-lab.sh up      start munged, slurmctld and slurmd (idempotent)
#   scripts/slurm-lab.sh down    stop them and remove the lab's files
#   scripts/slurm-lab.sh env     print the line that points srun/sbatch at the lab
#
# Everything lives in one folder ($TBBENCH_SLURM_LAB, default /tmp/tbbench-slurm-lab): its
# own munge key and socket, slurm.conf, state, spool and logs, on ports 6917/6918, so a site's
# own Slurm or munge (/etc/slurm, /run/munge) is neither used nor touched. The lab's commands
# need SLURM_CONF=$lab/slurm.conf (`eval "$(scripts/slurm-lab.sh env)"`).
#
# The node is this host with 8 CPUs whatever it has (Slurm's config_overrides), so `srun -n 4`
# runs on a 2-core machine; processes are tracked without cgroups (proctrack/linuxproc), which
# works in containers. Run as root, or as a user who can start daemons (munged and slurmd run
# as the caller).
set -euo pipefail

lab=${TBBENCH_SLURM_LAB:-/tmp/tbbench-slurm-lab}
conf=$lab/slurm.conf
node=$(hostname -s)

need() {
  local missing=()
  for c in munged slurmctld slurmd srun sbatch scontrol sinfo; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "slurm-lab: ${missing[*]} not installed (apt-get install slurm-wlm munge; scripts/setup.sh --deps does)" >&2
    exit 2
  fi
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
  need
  mkdir -p "$lab"/{state,spool,munge}
  chmod 700 "$lab/munge"
  if [ ! -f "$lab/munge/munge.key" ]; then
    # A key of the lab's own: never the site's /etc/munge/munge.key.
    head -c 1024 /dev/urandom >"$lab/munge/munge.key"
    chmod 400 "$lab/munge/munge.key"
  fi
  if ! pid_alive "$lab/munge/munged.pid"; then
    munged --force --key-file="$lab/munge/munge.key" --socket="$lab/munge/munge.sock" \
      --pid-file="$lab/munge/munged.pid" --log-file="$lab/munge/munged.log" \
      --seed-file="$lab/munge/munged.seed"
  fi
  local user
  user=$(id -un)
  cat >"$conf" <<EOF
# tbbench's Slurm lab (scripts/slurm-lab.sh): one node, this host.
ClusterName=tbbenchlab
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=6917
SlurmdPort=6918
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$lab/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$lab/state
SlurmdSpoolDir=$lab/spool
SlurmctldPidFile=$lab/slurmctld.pid
SlurmdPidFile=$lab/slurmd.pid
SlurmctldLogFile=$lab/slurmctld.log
SlurmdLogFile=$lab/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=5
InactiveLimit=0
NodeName=$node NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  export SLURM_CONF=$conf
  pid_alive "$lab/slurmctld.pid" || slurmctld -f "$conf"
  pid_alive "$lab/slurmd.pid" || slurmd -f "$conf" -N "$node"
  # Up once the node takes jobs.
  local i state=""
  for i in $(seq 100); do
    state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
    case $state in idle*|mix*|alloc*) echo "slurm-lab: up ($node, 8 CPUs; $lab)"; return 0 ;; esac
    if [ "$i" = 20 ]; then scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true; fi
    sleep 0.2
  done
  echo "slurm-lab: the node did not come up (state '${state:-none}'); see $lab/slurmctld.log and $lab/slurmd.log" >&2
  tail -n 5 "$lab/slurmctld.log" "$lab/slurmd.log" >&2 2>/dev/null || true
  exit 1
}

down() {
  local f
  for f in slurmd.pid slurmctld.pid munge/munged.pid; do
    if pid_alive "$lab/$f"; then kill "$(cat "$lab/$f")" 2>/dev/null || true; fi
  done
  sleep 0.5
  for f in slurmd.pid slurmctld.pid munge/munged.pid; do
    if pid_alive "$lab/$f"; then kill -9 "$(cat "$lab/$f")" 2>/dev/null || true; fi
  done
  rm -rf "$lab"
  echo "slurm-lab: down"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) echo "usage: scripts/slurm-lab.sh up|down|env" >&2; exit 2 ;;
esac
