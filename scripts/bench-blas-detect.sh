#!/usr/bin/env bash
# tbbench hpl on a host whose OpenBLAS does not know the CPU, against the same run with the
# right OPENBLAS_CORETYPE set by hand: issue 41's goal that the default reaches at least 90%
# of the by-hand figure. Where this host's OpenBLAS knows its CPU, the stand-in makes it load
# as one that does not (TBBENCH_TEST_OPENBLAS_DETECTS=Prescott: OpenBLAS comes up on its
# Prescott kernel first, as Debian 12's 0.3.21 does on Sapphire and Emerald Rapids), and
# tbbench must notice and correct it by itself. Side by side in one run, interleaved, per N
# and rank count: each side's median Gflops over ROUNDS runs, their spread, and the ratio of
# the medians. The kernel each side ran is printed from its result file.
#
#   scripts/bench-blas-detect.sh [ROUNDS] [N[,N...]] [RANKS[,RANKS...]]   defaults: 3 3000,10000 1,2
#   TBBENCH_BIN=/path/to/tbbench scripts/bench-blas-detect.sh             (skips the build)
#
# The by-hand side sets OPENBLAS_CORETYPE to SkylakeX on an AVX-512 CPU, Haswell on AVX2;
# both sides unset OPENBLAS_L2_SIZE and any OPENBLAS_CORETYPE this machine sets (said below).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
ns=${2:-3000,10000}
ranks_list=${3:-1,2}
if [ -n "${TBBENCH_BIN:-}" ]; then
  tb=$TBBENCH_BIN
else
  cargo build --release -q
  tb=${CARGO_TARGET_DIR:-$(pwd)/target}/release/tbbench
fi
if grep -qw avx512f /proc/cpuinfo; then right=SkylakeX
elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then right=Haswell
else echo "bench-blas-detect: this CPU has neither AVX-512 nor AVX2: nothing to correct" >&2; exit 1
fi
if [ -n "${OPENBLAS_CORETYPE:-}${OPENBLAS_L2_SIZE:-}" ]; then
  echo "note: this machine sets OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-}; both are unset for these runs"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gflops() { # result file -> "Gflops kernel"
  python3 - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
run = r["results"]["runs"][0]
blas = (r["hosts"][0].get("blas") or {})
kernel = (blas.get("kernel") or "?").split()[0]
product = run.get("product") or "?"
if isinstance(product, dict):
    product = product.get("name") or product.get("used") or "?"
print(f'{run["gflops"]:.2f} {kernel}/{product}')
EOF
}

median() { python3 -c 'import sys,statistics; v=[float(x) for x in sys.argv[1:]]; print(f"{statistics.median(v):.2f} {min(v):.2f} {max(v):.2f}")' "$@"; }

printf '%-6s %-6s %-26s %-26s %s\n' N ranks "default (stand-in)" "OPENBLAS_CORETYPE=$right" "ratio"
for n in ${ns//,/ }; do
  for ranks in ${ranks_list//,/ }; do
    auto=() hand=() kauto="" khand=""
    for i in $(seq "$rounds"); do
      env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE TBBENCH_TEST_OPENBLAS_DETECTS=Prescott \
        "$tb" hpl --nodes "$ranks" --n "$n" --out "$work/a$i.json" >/dev/null 2>&1
      read -r g k < <(gflops "$work/a$i.json"); auto+=("$g"); kauto=$k
      env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=$right \
        "$tb" hpl --nodes "$ranks" --n "$n" --out "$work/h$i.json" >/dev/null 2>&1
      read -r g k < <(gflops "$work/h$i.json"); hand+=("$g"); khand=$k
    done
    read -r ma lo_a hi_a < <(median "${auto[@]}")
    read -r mh lo_h hi_h < <(median "${hand[@]}")
    ratio=$(python3 -c "print(f'{$ma/$mh:.2f}')")
    printf '%-6s %-6s %-26s %-26s %s\n' "$n" "$ranks" "$ma ($lo_a-$hi_a) $kauto" "$mh ($lo_h-$hi_h) $khand" "$ratio"
  done
done
