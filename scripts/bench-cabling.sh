#!/usr/bin/env bash
# What tbbench's collectives and links reach on a cluster's cables, against what the cables
# allow (issue 42's goals), in the network lab (scripts/netlab.sh cabled; needs root):
#   - ring all-reduce on the 4-ring: busbw against the ring's bound, the slowest cable's rate
#     both ways (a ring that sends one way round reaches half of it);
#   - mesh all-reduce on the 4-mesh: busbw against its bound, (n - 1) cables' rate;
#   - a pair with two cables: link bandwidth against one cable's rate (goal 1.8x);
#   - a pair with two cables of different rates (1/5 and 3/5 of RATE): a 4 MiB all-reduce's
#     busbw against their sum (striped by their measured rates; equal shares reach 0.5).
# Each figure is the median over ROUNDS runs, with its spread; the ratio is median / bound.
#
#   scripts/bench-cabling.sh [ROUNDS] [RATE]     defaults: 3 rounds, 500mbit cables
#   TBBENCH_BIN=/path/to/tbbench scripts/bench-cabling.sh   (skips the build)
#   NETS="tcp:links verbs:links" scripts/bench-cabling.sh   (verbs: the software RDMA device,
#                                                            a stand-in that moves bytes over TCP)
#
# Rates stay low (every cable of the mesh busy at once is 12 directions) so a 2-core machine's
# cores are not what is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
rate=${2:-500mbit}
nets=${NETS:-tcp:links}
if [ -n "${TBBENCH_BIN:-}" ]; then
  tb=$TBBENCH_BIN
else
  cargo build --release -q
  cargo build --release -q -p tbbench-softrdma
  tb=${CARGO_TARGET_DIR:-$(pwd)/target}/release/tbbench
fi
lib=$(dirname "$tb")/libtbbench_softrdma.so
work=$(mktemp -d)
prefix=tbk
trap 'scripts/netlab.sh cabled down $prefix >/dev/null 2>&1; rm -rf "$work"' EXIT
gbit() { # "500mbit" -> 0.5
  python3 -c "import re,sys; m=re.fullmatch(r'(\d+)(k|m|g)bit', sys.argv[1]); print(int(m[1]) * {'k':1e-6,'m':1e-3,'g':1}[m[2]])" "$1"
}
r=$(gbit "$rate")

# Median and spread of the numbers on stdin: "median (min-max)".
stats() {
  python3 -c "
import sys, statistics as s
v = [float(x) for x in sys.stdin.read().split()]
print(f'{s.median(v):.3f} ({min(v):.3f}-{max(v):.3f})' if v else 'none')"
}
median() { echo "$1" | cut -d' ' -f1; }

# The busbw in Gbit/s of the largest all-reduce row of a coll result.
busbw() {
  python3 - "$1" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))["results"]["rows"]
best = max(rows, key=lambda x: x["size_bytes"])
print(best["busbw_gbps"] * 8)
EOF
}
pair_bw() {
  python3 - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
print(max(p["best_gbit_per_s"] for p in r["pairs"]) if r.get("pairs") else
      max(b["gbit_per_s"]["avg"] for b in r["bandwidth"] if b["mode"] == "bw"))
EOF
}

run_coll() { # shape algo net -> busbw figures, one per round
  local shape=$1 algo=$2 net=$3 i
  for i in $(seq "$rounds"); do
    "$tb" coll --hostfile "$work/$shape.hosts" --rsh 'ip netns exec' --nodes 4 --over "$net" \
      --verbs-lib "$lib" --op all-reduce --algo "$algo" --sizes 16MiB --iters 5 \
      --out "$work/c.json" >/dev/null 2>&1
    busbw "$work/c.json"
  done
}

printf '%-12s %-34s %-22s %8s %6s\n' network case "measured Gbit/s" bound ratio
for net in $nets; do
  scripts/netlab.sh cabled up ring4 $prefix "$rate" >/dev/null
  scripts/netlab.sh cabled hostfile ring4 $prefix jaccl-ring >"$work/ring4.hosts"
  m=$(run_coll ring4 ring "$net" | stats)
  bound=$(python3 -c "print(2 * $r)")
  printf '%-12s %-34s %-22s %8.3f %6.2f\n' "$net" "ring all-reduce 16 MiB, 4-ring" "$m" "$bound" \
    "$(python3 -c "print($(median "$m") / $bound)")"
  scripts/netlab.sh cabled down $prefix >/dev/null

  # The mesh's 12 directions at once: its cables at 3/5 of the rate keep the cores out of it.
  mrate=$(python3 -c "print(int($r * 600))")mbit
  scripts/netlab.sh cabled up mesh4 $prefix "$mrate" >/dev/null
  scripts/netlab.sh cabled hostfile mesh4 $prefix jaccl >"$work/mesh4.hosts"
  m=$(run_coll mesh4 mesh "$net" | stats)
  bound=$(python3 -c "print(3 * $(gbit "$mrate"))")
  printf '%-12s %-34s %-22s %8.3f %6.2f\n' "$net" "mesh all-reduce 16 MiB, 4-mesh" "$m" "$bound" \
    "$(python3 -c "print($(median "$m") / $bound)")"
  scripts/netlab.sh cabled down $prefix >/dev/null

  scripts/netlab.sh cabled up pair2 $prefix "$rate" >/dev/null
  scripts/netlab.sh cabled hostfile pair2 $prefix jaccl-ring >"$work/pair2.hosts"
  m=$(for i in $(seq "$rounds"); do
    "$tb" link --hostfile "$work/pair2.hosts" --rsh 'ip netns exec' --nodes 2 --over "$net" \
      --verbs-lib "$lib" --mode bw --sizes 4MiB --iters 20 --out "$work/l.json" >/dev/null 2>&1
    pair_bw "$work/l.json"
  done | stats)
  printf '%-12s %-34s %-22s %8.3f %6.2f\n' "$net" "link bw over two cables, 4 MiB" "$m" "$r" \
    "$(python3 -c "print($(median "$m") / $r)")"
  scripts/netlab.sh cabled down $prefix >/dev/null

  slow=$(python3 -c "print(int($r * 200))")mbit
  fast=$(python3 -c "print(int($r * 600))")mbit
  scripts/netlab.sh cabled up pair2 $prefix "$slow" "$fast" >/dev/null
  scripts/netlab.sh cabled hostfile pair2 $prefix list >"$work/uneven.hosts"
  m=$(for i in $(seq "$rounds"); do
    "$tb" coll --hostfile "$work/uneven.hosts" --rsh 'ip netns exec' --over "$net" \
      --verbs-lib "$lib" --op all-reduce --algo rd --sizes 4MiB --iters 5 --warmup 1 \
      --out "$work/u.json" >/dev/null 2>&1
    busbw "$work/u.json"
  done | stats)
  bound=$(python3 -c "print($(gbit "$slow") + $(gbit "$fast"))")
  printf '%-12s %-34s %-22s %8.3f %6.2f\n' "$net" "all-reduce 4 MiB, cables 1:3" "$m" "$bound" \
    "$(python3 -c "print($(median "$m") / $bound)")"
  scripts/netlab.sh cabled down $prefix >/dev/null
done
