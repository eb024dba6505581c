#!/usr/bin/env bash
# tbbench coll against OpenMPI's own collectives on this machine, side by side in one run:
# MPI_Allreduce, MPI_Allgather and MPI_Bcast (f32, sum), timed by scripts/osu_coll.c exactly
# as tbbench times its own (barrier, call, the slowest rank's time per iteration, median),
# and `tbbench coll` with its default algorithm choice (auto) and with every algorithm (the
# fastest shown; broadcast in place, as MPI_Bcast's one buffer is), at the same sizes and
# rank counts, over loopback TCP (OpenMPI: --mca btl tcp,self) and shared memory (--mca btl vader,self). Rounds interleave the two tools so
# drift in the machine's load hits both alike; each figure is the median over rounds.
#
# Goals (the collectives issue): busbw >= 1.0x OpenMPI's from 1 MiB up, time <= 1.0x up to
# 8 KiB. "time x" is tbbench's time over OpenMPI's (lower is better), "busbw x" tbbench's
# bus bandwidth over OpenMPI's (higher is better).
#
#   scripts/bench-coll.sh [ROUNDS] [RANKS...]      (defaults: 3 rounds, 2 and 4 ranks)
#   SIZES="8 1024 8192 1048576 16777216" ITERS=20 scripts/bench-coll.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
sizes=${SIZES:-8 1024 8192 65536 1048576 16777216 67108864}
iters=${ITERS:-20}
for t in mpicc mpirun python3; do
  command -v "$t" >/dev/null || { echo "bench-coll: $t is missing (apt install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
done
cargo build --release -q
tb=target/release/tbbench
peer=target/bench-coll/osu_coll
mkdir -p "$(dirname "$peer")"
if [ ! -x "$peer" ] || [ scripts/osu_coll.c -nt "$peer" ]; then
  mpicc -O2 -o "$peer" scripts/osu_coll.c
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root_flag=()
[ "$(id -u)" = 0 ] && root_flag=(--allow-run-as-root)

echo "# machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(mpirun --version | head -1)"
echo "# sizes: $sizes; iters $iters; rounds $rounds; f32 sum"

for round in $(seq "$rounds"); do
  for n in "${ranks[@]}"; do
    for net in tcp shm; do
      if [ $net = tcp ]; then btl=(--mca btl tcp,self --mca btl_tcp_if_include lo); else btl=(--mca btl vader,self); fi
      for op in allreduce allgather bcast; do
        # shellcheck disable=SC2086
        mpirun "${root_flag[@]}" --oversubscribe -np "$n" --mca pml ob1 "${btl[@]}" \
          "$peer" "$op" "$iters" 5 $sizes >>"$tmp/ompi-$n-$net-$round.txt"
      done
      list=$(echo "$sizes" | tr ' ' ',')
      # Like for like: MPI_Allreduce and MPI_Allgather take a send and a receive buffer (out of
      # place); MPI_Bcast has one buffer, so tbbench's broadcast runs in place (out of place
      # its root also copies its input to its output, which MPI_Bcast never does).
      "$tb" coll --nodes "$n" -t "$net" --op all-reduce,all-gather --algo all,auto \
        --sizes "$list" --iters "$iters" --warmup 5 --out "$tmp/tb-$n-$net-$round.json" >/dev/null
      "$tb" coll --nodes "$n" -t "$net" --op broadcast --in-place --algo all,auto \
        --sizes "$list" --iters "$iters" --warmup 5 --out "$tmp/tb-bcast-$n-$net-$round.json" >/dev/null
    done
  done
done

python3 - "$tmp" "$rounds" "${ranks[@]}" <<'PY'
import json, statistics, sys, glob, os
tmp, rounds, ranks = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3:]]
ops = {"allreduce": "all-reduce", "allgather": "all-gather", "bcast": "broadcast"}
factor = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
def human(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return f"{b}B"
print(f"{'op':<11}{'ranks':>5} {'net':<4}{'size':>8} {'OpenMPI us':>11} {'tb auto us':>11} {'algo':>5} {'time x':>7}"
      f" {'OMPI busbw':>10} {'tb busbw':>9} {'busbw x':>8} {'tb best':>8} {'best busbw x':>12}")
goal_misses = []
for n in ranks:
    for net in ("tcp", "shm"):
        ompi, auto, best = {}, {}, {}
        for r in range(1, rounds + 1):
            for line in open(os.path.join(tmp, f"ompi-{n}-{net}-{r}.txt")):
                op, size, us = line.split()
                ompi.setdefault((ops[op], int(size)), []).append(float(us))
            rows = []
            for f in (f"tb-{n}-{net}-{r}.json", f"tb-bcast-{n}-{net}-{r}.json"):
                rows += json.load(open(os.path.join(tmp, f)))["results"]["rows"]
            for row in rows:
                key = (row["op"], row["size_bytes"])
                t = row["time_us"]["median"]
                if row["requested"] == "auto":
                    auto.setdefault(key, []).append((t, row["algo"]))
                else:
                    best.setdefault(key, {}).setdefault(row["algo"], []).append(t)
        for key in sorted(ompi, key=lambda k: (list(ops.values()).index(k[0]), k[1])):
            op, size = key
            if key not in auto:
                continue
            o = statistics.median(ompi[key])
            a = statistics.median(t for t, _ in auto[key])
            algo = max(set(x for _, x in auto[key]), key=[x for _, x in auto[key]].count)
            medians = {al: statistics.median(ts) for al, ts in best.get(key, {}).items()}
            b_algo, b = min(medians.items(), key=lambda kv: kv[1]) if medians else ("-", a)
            bus = lambda t: size / (t * 1e3) * factor[op](n)
            print(f"{op:<11}{n:>5} {net:<4}{human(size):>8} {o:>11.2f} {a:>11.2f} {algo:>5} {a / o:>7.2f}"
                  f" {bus(o):>10.3f} {bus(a):>9.3f} {o / a:>8.2f} {b_algo:>8} {o / b:>12.2f}")
            if size <= 8192 and a > o:
                goal_misses.append(f"{op} {n} ranks {net} {human(size)}: time {a / o:.2f}x")
            if size >= 1 << 20 and a > o:
                goal_misses.append(f"{op} {n} ranks {net} {human(size)}: busbw {o / a:.2f}x")
print()
if goal_misses:
    print(f"# below goal with auto ({len(goal_misses)}): " + "; ".join(goal_misses))
else:
    print("# every row meets the goal with auto")
PY
