#!/usr/bin/env bash
# tbbench hpl against netlib HPL (Debian's hpcc, same OpenBLAS, same OpenMPI) at the same N,
# NB and P x Q, side by side in one run: 1 rank (1x1) and 2 ranks (1x2). Prints each tool's
# median Gflops over ROUNDS runs (interleaved), the ratio, and tbbench's single-rank DGEMM
# rate as the ceiling. Goals (issue 3): ratio >= 1.0 on both; >= 90% of DGEMM on 1 rank.
# BLAS threads per rank = cores / ranks for both tools. OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE
# are left as the machine sets them; the kernel in use is printed.
#
#   scripts/bench-hpl.sh [ROUNDS] [N] [NB]      defaults: 3 8000 192
#   TBBENCH_BIN=/path/to/tbbench scripts/bench-hpl.sh    (skips the build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
n=${2:-8000}
nb=${3:-192}
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

tb_run() { # ranks p q -> Gflops (and, for 1 rank, appends that run's DGEMM probe to $tmp/probes)
  "$tb" hpl --nodes "$1" --p "$2" --q "$3" --n "$n" --nb "$nb" --threads $((cores / $1)) --out "$tmp/tb-$1.json" >/dev/null
  [ "$1" -eq 1 ] && python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results']['dgemm_gflops_single_rank'])" "$tmp/tb-$1.json" >>"$tmp/probes"
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results']['runs'][0]['gflops'])" "$tmp/tb-$1.json"
}

echo "bench-hpl: N=$n NB=$nb, $rounds rounds, $cores cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset}"
printf '%-22s %12s %12s %7s %14s %9s\n' "config" "tbbench" "hpcc" "ratio" "DGEMM 1 rank" "tb/DGEMM"
for cfg in "1 1 1" "2 1 2"; do
  set -- $cfg
  tbv=(); hv=()
  for _ in $(seq "$rounds"); do
    tbv+=("$(tb_run "$1" "$2" "$3")")
    hv+=("$(hpcc_run "$1" "$2" "$3")")
  done
  t=$(median "${tbv[@]}")
  h=$(median "${hv[@]}")
  # The ceiling: one rank's DGEMM with every core, the median of the 1-rank runs' probes (each
  # taken just before its run; one probe alone swings 10% on a shared machine).
  d=$(median $(cat "$tmp/probes"))
  python3 - "$1" "$2" "$3" "$t" "$h" "$d" <<'PY'
import sys
r, p, q, t, h, d = sys.argv[1:]
t, h, d = float(t), float(h), float(d)
print(f"{r} rank(s) {p}x{q:<13} {t:>9.1f} Gf {h:>9.1f} Gf {t / h:>7.2f} {d:>11.1f} Gf {100 * t / d:>8.1f}%")
PY
done
python3 -c "import json,sys; print('kernel:', json.load(open(sys.argv[1]))['hosts'][0]['blas'])" "$tmp/tb-1.json"
