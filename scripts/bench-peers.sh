#!/usr/bin/env bash
# tbbench coll beside MLX's and OpenMPI's collectives, from the same command: `tbbench coll
# --peer mlx,mpi` runs tbbench's sweep, then MLX's (mx.distributed over its ring backend, from
# .venv-mlx) and OpenMPI's (under mpirun) on the same ranks and network, each timed the same
# way (suites/coll/README.md, "Beside MLX and MPI"). Rounds repeat the whole run so drift in
# the machine's load hits all three alike; each figure is the median over rounds.
#
# Goals (the peers issue): tbbench's time at or below MLX's at every size; against OpenMPI,
# time <= 1.0x up to 8 KiB and busbw >= 1.0x from 1 MiB (the collectives issue's goal).
# "mlx x" and "mpi x" are the peer's median time over tbbench's (above 1: tbbench is faster);
# tbbench's time is its fastest algorithm's at that size (auto and every algorithm run).
#
#   scripts/bench-peers.sh [ROUNDS] [RANKS...]        (defaults: 3 rounds, 2 and 4 ranks)
#   OPS=all-reduce,all-gather SIZES=8,8k,1MiB,64MiB scripts/bench-peers.sh 3 2
#   LAB=1 scripts/bench-peers.sh      (root: also over the network lab's 2.5 Gbit/s network,
#                                      two namespaces, 2 ranks)
#
# Sizes up to 64 KiB run SMALL_ITERS timed iterations (default 200, after 20 warm-up),
# larger ones ITERS (default 10, after 3), for all three.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
ops=${OPS:-all-reduce,all-gather}
sizes=${SIZES:-8,1k,8k,64k,1MiB,8MiB,64MiB}
iters=${ITERS:-10}
small_iters=${SMALL_ITERS:-200}
small="" large=""
for s in ${sizes//,/ }; do
  b=$(python3 -c "import sys; s=sys.argv[1].lower(); m={'k':1<<10,'kib':1<<10,'mib':1<<20,'m':1<<20,'b':1}
import re; n,u=re.fullmatch(r'(\d+)([a-z]*)',s).groups(); print(int(n)*m.get(u or 'b',1))" "$s")
  if [ "$b" -le 65536 ]; then small+="${small:+,}$s"; else large+="${large:+,}$s"; fi
done
cargo build --release -q
tb=target/release/tbbench
tmp=$(mktemp -d)
lab=""
cleanup() { rm -rf "$tmp"; [ -z "$lab" ] || scripts/netlab.sh down "$lab" >/dev/null 2>&1 || true; }
trap cleanup EXIT
nets=(loopback)
if [ "${LAB:-0}" = 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "bench-peers: LAB=1 needs root (network namespaces)" >&2; exit 1; }
  lab=tbp
  scripts/netlab.sh up "$lab" >/dev/null
  scripts/netlab.sh hostfile "$lab" 0 >"$tmp/lab-hosts.json"
  nets+=(lab)
fi
echo "# machine: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p'), $(getconf _NPROCESSORS_ONLN) cores; $(mpirun --version | head -1); MLX $(.venv-mlx/bin/python -c 'import mlx.core as mx; print(mx.__version__)')"
echo "# ops $ops; sizes $sizes; iters $small_iters up to 64 KiB, $iters above; rounds $rounds; f32 sum"

one() { # round n net group iters warmup
  local round=$1 n=$2 net=$3 group=$4 it=$5 warm=$6 where=()
  [ -n "$group" ] || return 0
  if [ "$net" = lab ]; then
    [ "$n" = 2 ] || return 0
    where=(--hostfile "$tmp/lab-hosts.json" --rsh "ip netns exec" --over tcp:10.71.0.0/24)
  else
    where=(--nodes "$n")
  fi
  if ! "$tb" coll "${where[@]}" --op "$ops" --algo all,auto --sizes "$group" --iters "$it" --warmup "$warm" \
    --peer mlx,mpi --out "$tmp/r-$round-$n-$net-$it.json" >/dev/null 2>"$tmp/stderr.txt"; then
    cat "$tmp/stderr.txt" >&2
    exit 1
  fi
  grep -- "--peer" "$tmp/stderr.txt" | sort -u >>"$tmp/peer-lines.txt" || true
}

for round in $(seq "$rounds"); do
  for n in "${ranks[@]}"; do
    for net in "${nets[@]}"; do
      one "$round" "$n" "$net" "$small" "$small_iters" 20
      one "$round" "$n" "$net" "$large" "$iters" 3
    done
  done
done
[ -s "$tmp/peer-lines.txt" ] && sort -u "$tmp/peer-lines.txt" | sed 's/^/# /'

python3 - "$tmp" <<'PY'
import glob, json, os, statistics, sys
tmp = sys.argv[1]
# (n, net, op, size) -> impl -> [median time per round]; tbbench's is its fastest algorithm's.
times, bus = {}, {}
for f in sorted(glob.glob(os.path.join(tmp, "r-*.json"))):
    _, _, n, net, _ = os.path.basename(f)[:-5].split("-")
    r = json.load(open(f))
    if not r["verification"]["passed"]:
        sys.exit(f"bench-peers: {f}: verification failed: {r['verification']}")
    best = {}
    for row in r["results"]["rows"]:
        key = (int(n), net, row["op"], row["size_bytes"])
        t = row["time_us"]["median"]
        imp = row["impl"]
        if imp == "tbbench":
            if t < best.get(key, (float("inf"),))[0]:
                best[key] = (t, row["busbw_gbps"])
        else:
            times.setdefault(key, {}).setdefault(imp, []).append(t)
            bus.setdefault(key, {}).setdefault(imp, []).append(row["busbw_gbps"])
    for key, (t, b) in best.items():
        times.setdefault(key, {}).setdefault("tbbench", []).append(t)
        bus.setdefault(key, {}).setdefault("tbbench", []).append(b)
def human(b):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return f"{b}B"
med = lambda v: statistics.median(v) if v else None
fmt = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"
print(f"{'op':<11}{'ranks':>5} {'net':<9}{'size':>7} {'tbbench us':>11} {'MLX us':>10} {'mlx x':>7}"
      f" {'MPI us':>10} {'mpi x':>7} {'tb busbw':>9} {'MLX busbw':>10} {'MPI busbw':>10}")
misses = []
for key in sorted(times, key=lambda k: (k[0], k[1], k[2], k[3])):
    n, net, op, size = key
    tb, mlx, mpi = (med(times[key].get(i, [])) for i in ("tbbench", "mlx", "mpi"))
    if tb is None:
        continue
    bt, bm, bp = (med(bus[key].get(i, [])) for i in ("tbbench", "mlx", "mpi"))
    mx = mlx / tb if mlx else None
    px = mpi / tb if mpi else None
    print(f"{op:<11}{n:>5} {net:<9}{human(size):>7} {tb:>11.2f} {fmt(mlx):>10} {fmt(mx):>7}"
          f" {fmt(mpi):>10} {fmt(px):>7} {fmt(bt, 3):>9} {fmt(bm, 3):>10} {fmt(bp, 3):>10}")
    where = f"{op} {n} ranks {net} {human(size)}"
    if mx is not None and mx < 1.0:
        misses.append(f"{where}: MLX {mx:.2f}x")
    if px is not None and ((size <= 8192 and px < 1.0) or (size >= 1 << 20 and bp and bt < bp)):
        misses.append(f"{where}: MPI " + (f"time {1 / px:.2f}x" if size <= 8192 else f"busbw {bt / bp:.2f}x"))
print()
if misses:
    print(f"# below goal ({len(misses)}): " + "; ".join(misses))
else:
    print("# every row meets the goals (tbbench at or below MLX's time; OpenMPI's time to 8 KiB, its busbw from 1 MiB)")
PY
