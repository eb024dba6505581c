#!/usr/bin/env bash
# tbbench hpl against netlib HPL (Debian's hpcc, same OpenBLAS, same OpenMPI) at the same N,
# NB and P x Q, side by side in one run: 1 rank (1x1) and 2 ranks (1x2), for each NB given.
# Prints each tool's median Gflops over ROUNDS runs (interleaved) with its spread (min-max),
# the ratio of the medians with the range the spreads allow (tbbench's worst over hpcc's best
# to its best over hpcc's worst), and tbbench's single-rank DGEMM rate as the ceiling; a
# line starting "warning:" where that range holds 1.0 (the runs do not settle which is
# faster: run more rounds). Goals: ratio >= 1.0 on both grids at every NB; >= 90% of DGEMM
# on 1 rank. BLAS threads per rank = cores / ranks for both tools.
# OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are left as the machine sets them; the kernel in use is
# printed.
#
#   scripts/bench-hpl.sh [ROUNDS] [N] [NB[,NB...]]      defaults: 5 8000 192
#   scripts/bench-hpl.sh 5 10000 128,192,256,384
#   GRIDS=1x2 scripts/bench-hpl.sh 3 12000 128          (only the grids named; default
#                                                        "1x1 1x2"; hpcc's whole suite
#                                                        takes minutes a run)
#   TBBENCH_BIN=/path/to/tbbench scripts/bench-hpl.sh    (skips the build)
#   CPU=avx2 scripts/bench-hpl.sh 3 10000 128            (the stand-in for an AVX2-only host:
#                                                        OpenBLAS held to its Haswell kernel
#                                                        for both tools, tbbench's packed
#                                                        product to its AVX2 kernel)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
n=${2:-8000}
nbs=${3:-192}
for t in hpcc mpirun python3; do
  command -v "$t" >/dev/null || { echo "bench-hpl: $t is missing (scripts/setup.sh installs hpcc and openmpi-bin)" >&2; exit 1; }
done
# TBBENCH_BIN runs a binary built elsewhere; else build, honouring CARGO_TARGET_DIR.
if [ -n "${TBBENCH_BIN:-}" ]; then
  tb=$TBBENCH_BIN
else
  cargo build --release -q
  tb=${CARGO_TARGET_DIR:-$(pwd)/target}/release/tbbench
fi
# CPU=avx2: both tools limited to what an AVX2-only x86-64 CPU runs, on whatever host this is
# (the OpenBLAS build here picks its kernel at run time; Haswell's is its AVX2+FMA one).
if [ "${CPU:-native}" = avx2 ]; then
  export OPENBLAS_CORETYPE=Haswell TBBENCH_HPL_KERNEL=avx2
elif [ "${CPU:-native}" != native ]; then
  echo "bench-hpl: CPU is native (default) or avx2, not '$CPU'" >&2; exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)
root=""
[ "$(id -u)" -eq 0 ] && root="--allow-run-as-root"
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }

hpcc_run() { # ranks p q -> Gflops
  local dir="$tmp/hpcc-$1"
  mkdir -p "$dir"
  sed -e "6s/.*/$n         Ns/" -e "8s/.*/$nb          NBs/" -e "11s/.*/$2            Ps/" -e "12s/.*/$3            Qs/" \
    /usr/share/doc/hpcc/examples/_hpccinf.txt >"$dir/hpccinf.txt"
  (cd "$dir" && rm -f hpccoutf.txt && OPENBLAS_NUM_THREADS=$((cores / $1)) mpirun $root --oversubscribe -np "$1" hpcc >/dev/null 2>&1)
  sed -n 's/^HPL_Tflops=//p' "$dir/hpccoutf.txt" | python3 -c "import sys; print(float(sys.stdin.read()) * 1000)"
}

tb_run() { # ranks p q -> Gflops (and, for 1 rank, appends that run's DGEMM probe to $tmp/probes;
  # the update's product it ran to $tmp/products)
  "$tb" hpl --nodes "$1" --p "$2" --q "$3" --n "$n" --nb "$nb" --threads $((cores / $1)) --out "$tmp/tb-$1.json" >/dev/null
  [ "$1" -eq 1 ] && python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results']['dgemm_gflops_single_rank'])" "$tmp/tb-$1.json" >>"$tmp/probes"
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results']['runs'][0].get('product', 'not recorded'))" "$tmp/tb-$1.json" >>"$tmp/products"
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results']['runs'][0]['gflops'])" "$tmp/tb-$1.json"
}

echo "bench-hpl: N=$n NB=$nbs, $rounds rounds, $cores cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset} TBBENCH_HPL_KERNEL=${TBBENCH_HPL_KERNEL:-unset}"
printf '%-18s %-22s %-22s %-17s %12s %9s\n' "NB, grid" "tbbench Gf (min-max)" "hpcc Gf (min-max)" "ratio (range)" "DGEMM 1 rank" "tb/DGEMM"
grids=${GRIDS:-1x1 1x2}
for g in $grids; do
  case $g in 1x1 | 1x2) ;; *) echo "bench-hpl: GRIDS takes 1x1 and 1x2, not '$g'" >&2; exit 1 ;; esac
done
for nb in ${nbs//,/ }; do
  for g in $grids; do
    q=${g#1x}
    set -- "$q" 1 "$q"
    tbv=(); hv=()
    : >"$tmp/products"
    for _ in $(seq "$rounds"); do
      tbv+=("$(tb_run "$1" "$2" "$3")")
      hv+=("$(hpcc_run "$1" "$2" "$3")")
    done
    # The ceiling: one rank's DGEMM with every core, the median of the 1-rank runs' probes
    # (each taken just before its run; one probe alone swings 10% on a shared machine).
    d=$(median $(cat "$tmp/probes" 2>/dev/null || echo 0))
    python3 - "$nb" "$2" "$3" "$d" "${tbv[*]}" "${hv[*]}" <<'PY'
import statistics, sys
nb, p, q, d = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
t = [float(x) for x in sys.argv[5].split()]
h = [float(x) for x in sys.argv[6].split()]
tm, hm = statistics.median(t), statistics.median(h)
lo, hi = min(t) / max(h), max(t) / min(h)
cfg = f"NB {nb}, {p}x{q}"
print(f"{cfg:<18} {tm:>7.1f} ({min(t):.1f}-{max(t):.1f})  {hm:>7.1f} ({min(h):.1f}-{max(h):.1f})  "
      f"{tm / hm:>5.2f} ({lo:.2f}-{hi:.2f})  " +
      (f"{d:>9.1f} Gf {100 * tm / d:>8.1f}%" if d > 0 else f"{'(no 1x1)':>12} {'-':>9}"))
if lo <= 1.0 <= hi:
    print(f"warning: {cfg}: the spreads allow a ratio from {lo:.2f} to {hi:.2f}, across 1.0: these runs do not settle which is faster (more rounds)")
PY
    # Which update product tbbench's rounds ran (timed against the BLAS at each start).
    echo "  tbbench's update product: $(sort -u "$tmp/products" | paste -sd '|' -)"
  done
done
python3 -c "import json,sys; print('kernel:', json.load(open(sys.argv[1]))['hosts'][0]['blas'])" "$(ls "$tmp"/tb-*.json | head -1)"
