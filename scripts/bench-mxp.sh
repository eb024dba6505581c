#!/usr/bin/env bash
# tbbench hpl-mxp against tbbench hpl at the same N, NB, grid and rank count, side by side in
# one run: for each grid, ROUNDS interleaved rounds of hpl (FP64) and hpl-mxp --precision
# fp32, fp16 and bf16 (tbbench's AVX-512 BF16 kernel where the CPU has it, else BF16 operands
# through sgemm, as fp16 always). Prints each one's median Gflops with
# its spread (min-max), every solve's verdict, the median GMRES iterations, and the speed-up
# of each MxP precision over hpl (ratio of the medians, and the range the spreads allow).
# Goal (issue 45): bf16 (or the best precision the CPU runs) >= 2.0x hpl at N >= 8000, every
# solve PASSED. OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are left as the machine sets them; the
# kernels in use are printed.
#
#   scripts/bench-mxp.sh [ROUNDS] [N] [NB]          defaults: 3 8000 256
#   GRIDS="1x1 1x2 2x2" scripts/bench-mxp.sh         (default "1x1 1x2")
#   TBBENCH_BIN=/path/to/tbbench scripts/bench-mxp.sh (skips the build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
n=${2:-8000}
nb=${3:-256}
if [ -n "${TBBENCH_BIN:-}" ]; then
  tb=$TBBENCH_BIN
else
  cargo build --release -q
  tb=${CARGO_TARGET_DIR:-$(pwd)/target}/release/tbbench
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
precisions=(fp32 fp16 bf16)
grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null ||
  echo "bench-mxp: no AVX-512 BF16 on this CPU: bf16 runs its operands through sgemm"


one() { # suite-or-precision p q out -> prints "gflops verdict iterations"
  local what=$1 p=$2 q=$3 out=$4
  local ranks=$((p * q))
  if [ "$what" = hpl ]; then
    "$tb" hpl --nodes "$ranks" --p "$p" --q "$q" --n "$n" --nb "$nb" --no-dgemm-probe --out "$out" >/dev/null 2>"$out.err" || true
  else
    "$tb" hpl-mxp --nodes "$ranks" --p "$p" --q "$q" --n "$n" --nb "$nb" --precision "$what" --out "$out" >/dev/null 2>"$out.err" || true
  fi
  python3 - "$out" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))["results"]["runs"][0]
    print(r["gflops"], "PASSED" if r["passed"] else "FAILED", r.get("iterations", "-"))
except Exception as e:
    print("nan", "ERROR", "-")
EOF
}

echo "bench-mxp: N=$n NB=$nb, $rounds rounds, $(nproc) cores; $("$tb" env 2>/dev/null | grep -m1 -i 'blas' || true)"
for grid in ${GRIDS:-1x1 1x2}; do
  p=${grid%x*} q=${grid#*x}
  declare -A runs=()
  for r in $(seq "$rounds"); do
    for what in hpl "${precisions[@]}"; do
      line=$(one "$what" "$p" "$q" "$tmp/$what-$grid-$r.json")
      runs[$what]="${runs[$what]:-} $line"
      if [ "$r" = 1 ] && [ "$what" != hpl ]; then
        python3 -c "import json, sys; print('  kernel (' + sys.argv[2] + '): ' + json.load(open(sys.argv[1]))['results']['kernel'])" \
          "$tmp/$what-$grid-$r.json" "$what" 2>/dev/null || true
      fi
    done
  done
  python3 - "$grid" "$n" "$nb" hpl "${precisions[@]}" <<EOF
import statistics, sys
grid, n, nb, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
raw = {$(for w in hpl "${precisions[@]}"; do printf '"%s": "%s",' "$w" "${runs[$w]}"; done)}
stats = {}
for w in names:
    f = raw[w].split()
    g = [float(x) for x in f[0::3]]
    verdicts = f[1::3]
    its = [x for x in f[2::3] if x != "-"]
    stats[w] = g
    med = statistics.median(g)
    extra = f", GMRES iterations {statistics.median(int(i) for i in its):.0f}" if its else ""
    label = "hpl (FP64)" if w == "hpl" else f"hpl-mxp {w}"
    print(f"{grid} N={n} NB={nb}  {label:<16} median {med:8.1f} Gflops (min {min(g):.1f}, max {max(g):.1f}), {verdicts.count('PASSED')}/{len(verdicts)} PASSED{extra}")
base = stats["hpl"]
for w in names[1:]:
    g = stats[w]
    ratio = statistics.median(g) / statistics.median(base)
    lo, hi = min(g) / max(base), max(g) / min(base)
    print(f"{grid} N={n} NB={nb}  speed-up {w} over hpl: {ratio:.2f}x (range {lo:.2f}-{hi:.2f})")
EOF
  unset runs
done
