#!/usr/bin/env bash
# tbbench coll against OpenMPI's own collectives on this machine, side by side in one run:
# MPI_Allreduce, MPI_Allgather and MPI_Bcast (f32, sum), timed by the program `coll --peer mpi`
# runs (suites/coll/src/peers/mpi_coll.c) exactly as tbbench times its own (barrier, call, the
# slowest rank's time per iteration, median; every element checked),
# and `tbbench coll` with its default algorithm choice (auto) and with every algorithm (the
# fastest shown; broadcast in place, as MPI_Bcast's one buffer is), at the same sizes and
# rank counts, over loopback TCP (OpenMPI: --mca btl tcp,self) and shared memory (--mca btl
# vader,self). Rounds interleave the two tools so drift in the machine's load hits both
# alike; each figure is the median over rounds.
#
# Goals (the collectives issue): busbw >= 1.0x OpenMPI's from 1 MiB up, time <= 1.0x up to
# 8 KiB. "time x" is tbbench's time over OpenMPI's (lower is better), "busbw x" tbbench's
# bus bandwidth over OpenMPI's (higher is better), both from the medians over rounds; "x per
# round" the lowest and highest of the same ratio within single rounds. A row counts as below
# goal only when every round misses; where rounds disagree a "warning:" line says so.
#
#   scripts/bench-coll.sh [ROUNDS] [RANKS...]      (defaults: 3 rounds, 2 and 4 ranks)
#   SIZES="8 1024 8192 1048576 16777216" ITERS=20 SMALL_ITERS=200 scripts/bench-coll.sh
#   CONGESTION=cubic scripts/bench-coll.sh 3 2
#
# Sizes up to 64 KiB run SMALL_ITERS timed iterations (default 1000, after 100 warm-up
# ones), larger ones ITERS (default 20, after 5), for both tools, as OSU's benchmarks do: a
# few dozen iterations of a microsecond call measure how the scheduler placed the ranks when
# the run began more than the call.
#
# OpenMPI's barrier is set to the dissemination algorithm ("bruck"), the one tbbench's
# barrier uses: each rank's clock starts when it leaves the barrier, so the barrier's exit
# order is part of every small-size time (OpenMPI's 4-rank broadcast of 8 B over shared
# memory measures 0.16 us after its linear or tree barrier, where the root leaves first and
# its data is waiting for every other rank, and 4-11 us after dissemination or recursive
# doubling).
#
# With more ranks than cores, tbbench binds each rank to one CPU, dealt round-robin (ranks 0
# and 2 on CPU 0, 1 and 3 on CPU 1 on two cores), and OpenMPI gets the same placement
# (--bind-to core:overload-allowed; mpirun leaves oversubscribed ranks unbound otherwise), so
# the two tools' small-size times are compared on the same core sharing.
#
# TCP's figures follow the kernel's congestion control as much as either tool: BBR paces even
# loopback, and its rate moves from one launch to the next. CONGESTION=cubic (root, Linux)
# runs the whole comparison in a private network namespace whose default is that algorithm,
# since OpenMPI has no per-connection setting. The host's default is left alone; a namespace
# may only default to an algorithm on the host's allowed list, so one missing from it is
# added for the run and the list restored after. The header names the congestion control
# the run had.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${CONGESTION:-}" ] && [ -z "${BENCH_COLL_NETNS:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "bench-coll: CONGESTION needs root (a private network namespace)" >&2; exit 1; }
  ns="bench-coll-$$"
  allowed=/proc/sys/net/ipv4/tcp_allowed_congestion_control
  allowed_before=$(cat "$allowed")
  trap 'ip netns del "$ns" 2>/dev/null || true; echo "$allowed_before" >"$allowed"' EXIT
  case " $allowed_before " in *" $CONGESTION "*) ;; *) echo "$allowed_before $CONGESTION" >"$allowed" ;; esac
  ip netns add "$ns"
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$CONGESTION"
  ip netns exec "$ns" env BENCH_COLL_NETNS=1 "$0" "$@"
  exit
fi
rounds=${1:-3}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
sizes=${SIZES:-8 1024 8192 65536 1048576 16777216 67108864}
iters=${ITERS:-20}
small_iters=${SMALL_ITERS:-1000}
small_sizes="" large_sizes=""
for s in $sizes; do
  if [ "$s" -le 65536 ]; then small_sizes+="$s "; else large_sizes+="$s "; fi
done
for t in mpicc mpirun python3; do
  command -v "$t" >/dev/null || { echo "bench-coll: $t is missing (apt install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
done
cargo build --release -q
tb=target/release/tbbench
peer=target/bench-coll/mpi_coll
mkdir -p "$(dirname "$peer")"
if [ ! -x "$peer" ] || [ suites/coll/src/peers/mpi_coll.c -nt "$peer" ]; then
  mpicc -O2 -o "$peer" suites/coll/src/peers/mpi_coll.c
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)

cores=$(getconf _NPROCESSORS_ONLN)   # nproc is Linux-only
echo "# machine: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p'), $cores cores; $(mpirun --version | head -1)"
echo "# sizes: $sizes; iters $small_iters up to 64 KiB, $iters above; rounds $rounds; f32 sum"
cc=$(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo "the OS's")
echo "# tcp congestion control: $cc${BENCH_COLL_NETNS:+ (a private network namespace)}"

# One round of both tools at one rank count and network, for one group of sizes.
run_group() { # n net round tag sizes iters warmup
  local n=$1 net=$2 round=$3 tag=$4 group=$5 it=$6 warm=$7 btl list bind=()
  [ -n "$group" ] || return 0
  [ "$n" -gt "$cores" ] && bind=(--bind-to core:overload-allowed)
  if [ "$net" = tcp ]; then btl=(--mca btl tcp,self --mca btl_tcp_if_include lo); else btl=(--mca btl vader,self); fi
  for op in all-reduce all-gather broadcast; do
    # The program's rows are element counts as tbbench counts them: f32, per rank for
    # all-gather.
    local rows=() s
    for s in $group; do
      if [ "$op" = all-gather ]; then rows+=("$op:$((s / 4 / n))"); else rows+=("$op:$((s / 4))"); fi
    done
    # ${a[@]+"${a[@]}"}: an empty array under set -u (macOS's bash 3.2 calls it unbound).
    mpirun ${root_flag[@]+"${root_flag[@]}"} --oversubscribe ${bind[@]+"${bind[@]}"} -np "$n" --mca pml ob1 "${btl[@]}" \
      --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_barrier_algorithm 4 \
      "$peer" f32 sum 0 "$warm" "$it" "${rows[@]}" >>"$tmp/ompi-$n-$net-$round.txt"
  done
  list=$(echo $group | tr ' ' ',')
  # Like for like: a launch per op, and auto in a launch of its own, as OpenMPI's above run
  # one op with one algorithm choice each, so no row follows another op's or algorithm's
  # bulk traffic (under bbr a connection paces at what its recent bulk transfers reached).
  # Every algorithm's rows (the "tb best" column) come from a second launch per op.
  # MPI_Allreduce and MPI_Allgather take a send and a receive buffer (out of place);
  # MPI_Bcast has one buffer, so tbbench's broadcast runs in place (out of place its root
  # also copies its input to its output, which MPI_Bcast never does).
  for op in all-reduce all-gather broadcast; do
    local place=()
    [ "$op" = broadcast ] && place=(--in-place)
    for algo in auto all; do
      # Its warnings (the same few, every launch) are printed once each below; all of its
      # stderr if it fails.
      if ! "$tb" coll --nodes "$n" -t "$net" --op "$op" ${place[@]+"${place[@]}"} --algo "$algo" \
        --sizes "$list" --iters "$it" --warmup "$warm" --out "$tmp/tb-$algo-$op-$n-$net-$round-$tag.json" \
        >/dev/null 2>"$tmp/tb-stderr.txt"; then
        cat "$tmp/tb-stderr.txt" >&2
        exit 1
      fi
      cat "$tmp/tb-stderr.txt" >>"$tmp/tb-warnings.txt"
    done
  done
}

for round in $(seq "$rounds"); do
  for n in "${ranks[@]}"; do
    for net in tcp shm; do
      run_group "$n" "$net" "$round" small "$small_sizes" "$small_iters" 100
      run_group "$n" "$net" "$round" large "$large_sizes" "$iters" 5
    done
  done
done

if [ -s "$tmp/tb-warnings.txt" ]; then
  sort -u "$tmp/tb-warnings.txt" | sed 's/^/# /'
fi

python3 - "$tmp" "$rounds" "${ranks[@]}" <<'PY'
import json, statistics, sys, glob, os
tmp, rounds, ranks = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3:]]
ops = {o: o for o in ("all-reduce", "all-gather", "broadcast")}
factor = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
def human(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return f"{b}B"
# What tbbench's TCP runs ran, per rank count: the congestion control, the connections per
# peer and the socket buffers, and which of them tbbench chose.
for n in ranks:
    for f in sorted(glob.glob(os.path.join(tmp, f"tb-*-{n}-tcp-*.json")))[:1]:
        net = json.load(open(f))["network"]
        auto = " (chosen by tbbench: its congestion control paces each connection)" if net.get("streams_auto") and net.get("streams", 1) > 1 else ""
        line = f"# tbbench over tcp, {n} ranks: congestion control {net.get('congestion', '?')}, {net.get('streams', 1)} connection(s) per peer{auto}"
        if net.get("sockbuf_bytes"):
            line += f", socket buffers {human(net['sockbuf_bytes'])}"
            if net.get("sockbuf_auto"):
                line += " (chosen by tbbench: more ranks than cores)"
        print(line)
print(f"{'op':<11}{'ranks':>5} {'net':<4}{'size':>8} {'OpenMPI us':>11} {'tb auto us':>11} {'algo':>5} {'time x':>7}"
      f" {'OMPI busbw':>10} {'tb busbw':>9} {'busbw x':>8} {'x per round':>12} {'tb best':>8} {'best busbw x':>12}")
goal_misses, unsettled = [], []
for n in ranks:
    for net in ("tcp", "shm"):
        # Per key, per round: OpenMPI's median time, tbbench auto's (with the algorithm it
        # ran), and every algorithm's.
        ompi, auto, best = {}, {}, {}
        for r in range(1, rounds + 1):
            for line in open(os.path.join(tmp, f"ompi-{n}-{net}-{r}.txt")):
                row = json.loads(line)
                if "times_us" not in row:
                    continue
                if row["wrong"]:
                    sys.exit(f"bench-coll: OpenMPI's {row['op']} of {row['count']} elements had {row['wrong']} wrong")
                size = row["count"] * 4 * (n if row["op"] == "all-gather" else 1)
                ompi.setdefault((row["op"], size), {})[r] = statistics.median(row["times_us"])
            rows = []
            for prefix in (f"tb-{a}-{o}" for a in ("auto", "all") for o in ops.values()):
                for tag in ("small", "large"):
                    f = os.path.join(tmp, f"{prefix}-{n}-{net}-{r}-{tag}.json")
                    if os.path.exists(f):
                        rows += json.load(open(f))["results"]["rows"]
            for row in rows:
                key = (row["op"], row["size_bytes"])
                t = row["time_us"]["median"]
                if row["requested"] == "auto":
                    auto.setdefault(key, {})[r] = (t, row["algo"])
                else:
                    best.setdefault(key, {}).setdefault(row["algo"], []).append(t)
        for key in sorted(ompi, key=lambda k: (list(ops.values()).index(k[0]), k[1])):
            op, size = key
            if key not in auto:
                continue
            o = statistics.median(ompi[key].values())
            a = statistics.median(t for t, _ in auto[key].values())
            algos = [x for _, x in auto[key].values()]
            algo = max(set(algos), key=algos.count)
            medians = {al: statistics.median(ts) for al, ts in best.get(key, {}).items()}
            b_algo, b = min(medians.items(), key=lambda kv: kv[1]) if medians else ("-", a)
            bus = lambda t: size / (t * 1e3) * factor[op](n)
            # The ratio within each round (the two tools minutes apart, under the same load):
            # its spread says how far the ratio of the medians can be trusted.
            small = size <= 8192
            per_round = sorted((auto[key][r][0] / ompi[key][r]) if small else (ompi[key][r] / auto[key][r][0])
                               for r in auto[key] if r in ompi[key])
            spread = f"{per_round[0]:.2f}-{per_round[-1]:.2f}" if per_round else "-"
            print(f"{op:<11}{n:>5} {net:<4}{human(size):>8} {o:>11.2f} {a:>11.2f} {algo:>5} {a / o:>7.2f}"
                  f" {bus(o):>10.3f} {bus(a):>9.3f} {o / a:>8.2f} {spread:>12} {b_algo:>8} {o / b:>12.2f}")
            if not (small or size >= 1 << 20):
                continue
            what = f"{op} {n} ranks {net} {human(size)}: " + (f"time {a / o:.2f}x" if small else f"busbw {o / a:.2f}x")
            ok = (lambda x: x <= 1.0) if small else (lambda x: x >= 1.0)
            if per_round and ok(per_round[0]) != ok(per_round[-1]):
                unsettled.append(f"{what} (rounds {spread})")
            elif a > o:
                goal_misses.append(what)
print()
print("# 'x per round': the time x (up to 8 KiB) or busbw x (from 1 MiB) within each round, lowest-highest")
if goal_misses:
    print(f"# below goal with auto in every round ({len(goal_misses)}): " + "; ".join(goal_misses))
if unsettled:
    print(f"# warning: rounds disagree whether tbbench meets the goal ({len(unsettled)}; run more rounds): " + "; ".join(unsettled))
if not goal_misses and not unsettled:
    print("# every row meets the goal with auto in every round")
PY
