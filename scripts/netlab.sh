#!/usr/bin/env bash
# The network lab: two "hosts" as network namespaces on this machine, joined by one veth pair
# per "network", each in its own subnet and shaped with tc tbf to a profile. netem is not used
# (this kernel lacks it). Needs root.
#
#   scripts/netlab.sh up [PREFIX]     create PREFIXa and PREFIXb (default PREFIX: tbl)
#   scripts/netlab.sh down [PREFIX]   remove them
#   scripts/netlab.sh hostfile [PREFIX] [NET]   print an mlx.launch hostfile for network NET
#
# A cluster as a Thunderbolt cluster is cabled (no switch: each cable its own pair of
# interfaces and /30 subnet, as mlx.distributed_config --over thunderbolt sets them up), plus a
# management network all hosts share (a bridge in its own namespace, 10.69.0.0/24) for
# control traffic. Hosts PREFIX0.. are namespaces, also named in /etc/hosts (their management
# address), so hostfiles without addresses (OpenMPI's, MLX's ring form) reach them:
#
#   scripts/netlab.sh cabled up SHAPE [PREFIX] [RATE...]   SHAPE: mesh3 mesh4 ring4 ring6 pair2
#   scripts/netlab.sh cabled down [PREFIX]
#   scripts/netlab.sh cabled hostfile SHAPE [PREFIX] FORM  FORM: openmpi list jaccl jaccl-ring ring
#
# Cable k joins hosts a < b: 192.168.k.1/30 on a's interface en<b> and 192.168.k.2/30 on b's
# en<a> (a second cable between the same two: en<b>c1 and en<a>c1), each end shaped with tbf
# to the k-th RATE (the last one repeats; default 1gbit). mesh3 and mesh4 cable every pair,
# ring4 cables 0-1 1-2 2-3 3-0 (no diagonals), ring6 six hosts round a ring, pair2 is two hosts with two cables.
#
# Networks (host a is .1, host b is .2):
#   0  10.71.0.0/24  tbf 2500mbit  "ethernet 2.5G" profile
#   1  10.72.0.0/24  tbf 10gbit    "ethernet 10G" profile
#   2  10.73.0.0/24  unshaped
# MTU 9000 on every link, so per-packet header overhead stays under 1% of the shaped rate.
set -euo pipefail

cmd=${1:-}
p=${2:-tbl}
rates=(2500mbit 10gbit "")

up() {
  down >/dev/null 2>&1 || true
  ip netns add "${p}a"
  ip netns add "${p}b"
  for ns in "${p}a" "${p}b"; do ip -n "$ns" link set lo up; done
  for i in 0 1 2; do
    local a="${p}${i}a" b="${p}${i}b"
    ip link add "$a" type veth peer name "$b"
    ip link set "$a" netns "${p}a"
    ip link set "$b" netns "${p}b"
    ip -n "${p}a" addr add "10.7$((i + 1)).0.1/24" dev "$a"
    ip -n "${p}b" addr add "10.7$((i + 1)).0.2/24" dev "$b"
    for end in "${p}a:$a" "${p}b:$b"; do
      local ns=${end%%:*} dev=${end#*:}
      ip -n "$ns" link set "$dev" mtu 9000 up
      if [ -n "${rates[$i]}" ]; then
        # burst: enough for the rate at a 4 ms timer tick; latency bounds the queue.
        tc -n "$ns" qdisc add dev "$dev" root tbf rate "${rates[$i]}" burst 4mb latency 20ms
      fi
    done
  done
  echo "netlab up: namespaces ${p}a ${p}b; networks 10.71.0.0/24 (2500mbit), 10.72.0.0/24 (10gbit), 10.73.0.0/24 (unshaped)"
}

down() {
  ip netns del "${p}a" 2>/dev/null || true
  ip netns del "${p}b" 2>/dev/null || true
}

hostfile() {
  local net=${3:-0}
  printf '[{"ssh": "%sa", "ips": ["10.7%d.0.1"]}, {"ssh": "%sb", "ips": ["10.7%d.0.2"]}]\n' "$p" $((net + 1)) "$p" $((net + 1))
}

# The cables of a shape, "a-b" each, in cable order.
# A cable's tbf burst: 10 ms at its rate (at least 64 KiB, two timer ticks at 250 Hz and
# several jumbo frames). A fixed burst of megabytes lets a slow cable run far above its rate
# for the first tenths of a second after an idle spell, which short measurements (every cable
# at once) would report.
burst_for() {
  local r=$1 n unit bps
  n=${r%%[a-z]*}
  unit=${r#"$n"}
  case "$unit" in
    gbit) bps=$((n * 1000000000)) ;;
    mbit) bps=$((n * 1000000)) ;;
    kbit) bps=$((n * 1000)) ;;
    *) echo "netlab: rate '$r' is not N{kbit,mbit,gbit}" >&2; exit 2 ;;
  esac
  local b=$((bps / 8 / 100))
  echo $((b < 65536 ? 65536 : b))
}

cables_of() {
  case "$1" in
    mesh3) echo "0-1 0-2 1-2" ;;
    mesh4) echo "0-1 0-2 0-3 1-2 1-3 2-3" ;;
    ring4) echo "0-1 1-2 2-3 3-0" ;;
    ring6) echo "0-1 1-2 2-3 3-4 4-5 5-0" ;;
    pair2) echo "0-1 0-1" ;;
    *) echo "netlab: unknown shape '$1' (mesh3, mesh4, ring4, ring6, pair2)" >&2; exit 2 ;;
  esac
}

hosts_of() {
  local n=0 c a b
  for c in $(cables_of "$1"); do
    a=${c%-*}; b=${c#*-}
    [ "$a" -ge "$n" ] && n=$((a + 1))
    [ "$b" -ge "$n" ] && n=$((b + 1))
  done
  echo "$n"
}

# The interface names of cable k (a b) on each end, given the cables before it: en<peer>, then
# en<peer>c<i> for the i-th extra cable between the same two hosts.
cable_ifaces() {
  local shape=$1 k=$2 i=0 j=0 c a b
  local all=($(cables_of "$shape"))
  local this=${all[$k]}
  a=${this%-*}; b=${this#*-}
  for c in "${all[@]:0:$k}"; do
    if [ "$c" = "$this" ] || [ "$c" = "$b-$a" ]; then i=$((i + 1)); fi
  done
  local sa="en$b" sb="en$a"
  [ "$i" -gt 0 ] && sa="en${b}c$i" && sb="en${a}c$i"
  echo "$a $b $sa $sb"
}

cabled_up() {
  local shape=$1; shift
  local p=${1:-tbm}; shift || true
  local rates=("$@"); [ ${#rates[@]} -eq 0 ] && rates=(1gbit)
  cables_of "$shape" >/dev/null
  cabled_down "$p" >/dev/null 2>&1 || true
  local n; n=$(hosts_of "$shape")
  ip netns add "${p}sw"
  ip -n "${p}sw" link add br0 type bridge
  ip -n "${p}sw" link set br0 up
  local h
  for h in $(seq 0 $((n - 1))); do
    ip netns add "$p$h"
    ip -n "$p$h" link set lo up
    ip link add "${p}m$h" type veth peer name "${p}M$h"
    ip link set "${p}m$h" netns "$p$h"
    ip -n "$p$h" link set "${p}m$h" name mgmt
    ip -n "$p$h" addr add "10.69.0.$((h + 1))/24" dev mgmt
    ip -n "$p$h" link set mgmt up
    ip link set "${p}M$h" netns "${p}sw"
    ip -n "${p}sw" link set "${p}M$h" master br0 up
  done
  local k=0 c
  for c in $(cables_of "$shape"); do
    read -r a b ia ib <<<"$(cable_ifaces "$shape" $k)"
    local rate=${rates[$k]:-${rates[-1]}}
    ip link add "${p}t${k}a" type veth peer name "${p}t${k}b"
    ip link set "${p}t${k}a" netns "$p$a"
    ip -n "$p$a" link set "${p}t${k}a" name "$ia"
    ip link set "${p}t${k}b" netns "$p$b"
    ip -n "$p$b" link set "${p}t${k}b" name "$ib"
    ip -n "$p$a" addr add "192.168.$k.1/30" dev "$ia"
    ip -n "$p$b" addr add "192.168.$k.2/30" dev "$ib"
    local end
    for end in "$p$a:$ia" "$p$b:$ib"; do
      ip -n "${end%%:*}" link set "${end#*:}" mtu 9000 up
      tc -n "${end%%:*}" qdisc add dev "${end#*:}" root tbf rate "$rate" burst "$(burst_for "$rate")" latency 20ms
    done
    k=$((k + 1))
  done
  # Names for the hosts, as ssh aliases would give them (flock: labs come up side by side).
  (
    flock 9
    sed -i "/# tbbench-netlab $p\$/d" /etc/hosts
    for h in $(seq 0 $((n - 1))); do
      echo "10.69.0.$((h + 1)) $p$h # tbbench-netlab $p" >>/etc/hosts
    done
  ) 9>/run/tbbench-netlab-hosts.lock
  echo "netlab up: $shape, hosts ${p}0..${p}$((n - 1)), cables $(cables_of "$shape") at ${rates[*]}"
}

cabled_down() {
  local p=${1:-tbm} ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${p}([0-9]+|sw)\$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  (
    flock 9
    sed -i "/# tbbench-netlab $p\$/d" /etc/hosts
  ) 9>/run/tbbench-netlab-hosts.lock
}

# A hostfile for the shape: OpenMPI's form, MLX's list (management addresses; the cables
# found by subnet), jaccl (a device per peer), jaccl-ring (a list per peer, every cable),
# ring (the hosts' addresses on their cables to the previous host, in ring order).
cabled_hostfile() {
  local shape=$1 p=${2:-tbm} form=${3:-list}
  local n; n=$(hosts_of "$shape")
  local all=($(cables_of "$shape")) h j k
  if [ "$form" = openmpi ]; then
    for h in $(seq 0 $((n - 1))); do echo "$p$h slots=1"; done
    return
  fi
  # devs H J: the devices of host H's cables to J, space-separated.
  devs() {
    local out=() k
    for k in "${!all[@]}"; do
      read -r a b ia ib <<<"$(cable_ifaces "$shape" $k)"
      if [ "$a" = "$1" ] && [ "$b" = "$2" ]; then out+=("rdma_$ia"); fi
      if [ "$b" = "$1" ] && [ "$a" = "$2" ]; then out+=("rdma_$ib"); fi
    done
    echo "${out[@]:-}"
  }
  local backend="" hosts=()
  case "$form" in
    list) ;;
    jaccl|jaccl-ring) backend=$form ;;
    ring) backend=ring ;;
    *) echo "netlab: unknown hostfile form '$form' (openmpi list jaccl jaccl-ring ring)" >&2; exit 2 ;;
  esac
  for h in $(seq 0 $((n - 1))); do
    local entry="{\"ssh\": \"$p$h\""
    if [ "$form" = ring ]; then
      # Host h's addresses on its cables to h-1.
      local prev=$(((h + n - 1) % n)) ips=()
      for k in "${!all[@]}"; do
        read -r a b ia ib <<<"$(cable_ifaces "$shape" $k)"
        [ "$a" = "$h" ] && [ "$b" = "$prev" ] && ips+=("\"192.168.$k.1\"")
        [ "$b" = "$h" ] && [ "$a" = "$prev" ] && ips+=("\"192.168.$k.2\"")
      done
      entry="$entry, \"ips\": [$(IFS=,; echo "${ips[*]}")]"
    else
      entry="$entry, \"ips\": [\"10.69.0.$((h + 1))\"]"
    fi
    if [ "$form" = jaccl ] || [ "$form" = jaccl-ring ]; then
      local rdma=()
      for j in $(seq 0 $((n - 1))); do
        local d; d=$(devs "$h" "$j")
        if [ "$h" = "$j" ] || [ -z "$d" ]; then rdma+=(null)
        elif [ "$form" = jaccl ]; then rdma+=("\"${d%% *}\"")
        else rdma+=("[\"${d// /\", \"}\"]"); fi
      done
      entry="$entry, \"rdma\": [$(IFS=,; echo "${rdma[*]}")]"
    fi
    hosts+=("$entry}")
  done
  if [ -z "$backend" ]; then
    echo "[$(IFS=,; echo "${hosts[*]}")]"
  else
    echo "{\"backend\": \"$backend\", \"envs\": [], \"hosts\": [$(IFS=,; echo "${hosts[*]}")]}"
  fi
}

case "$cmd" in
  up) up ;;
  down) down ;;
  hostfile) hostfile "$@" ;;
  cabled)
    sub=${2:-}; shift 2 || true
    case "$sub" in
      up) cabled_up "$@" ;;
      down) cabled_down "$@" ;;
      hostfile) cabled_hostfile "$@" ;;
      *) echo "usage: $0 cabled up SHAPE [PREFIX] [RATE...] | down [PREFIX] | hostfile SHAPE [PREFIX] FORM" >&2; exit 2 ;;
    esac ;;
  *) echo "usage: $0 up|down|hostfile [PREFIX] [NET], or $0 cabled ..." >&2; exit 2 ;;
esac
