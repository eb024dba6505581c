#!/usr/bin/env bash
# tbbench link against its peers on this machine's loopback, side by side in one run:
#   bandwidth   tbbench link --mode bw  vs  iperf3 (TCP, one stream, same message size), and
#               tbbench --streams 2 vs iperf3 -P 2 at 1 MiB (like for like; iperf3 before
#               3.16 drives its streams from one thread)
#   latency     tbbench link --mode latency (p50 one-way)  vs  sockperf ping-pong (p50)
#   shm         tbbench link --transport shm, 256 MiB  vs  one core's memcpy of 256 MiB
# Each figure is the median of ROUNDS runs (default 5), rounds interleaved so drift in the
# machine's load hits both sides alike. Goals (issue 2): bandwidth ratio >= 1.0, latency
# within 10% of sockperf, shm >= 90% of memcpy.
#
#   scripts/bench-link.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
for t in iperf3 sockperf python3; do
  command -v "$t" >/dev/null || { echo "bench-link: $t is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done
cargo build --release -q
tb=target/release/tbbench
tmp=$(mktemp -d)
iperf_port=$((20000 + RANDOM % 10000))
sockperf_port=$((iperf_port + 1))
cleanup() {
  [ -f "$tmp/iperf.pid" ] && kill "$(cat "$tmp/iperf.pid")" 2>/dev/null || true
  [ -n "${sp_pid:-}" ] && kill "$sp_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
iperf3 -s -p "$iperf_port" -D --pidfile "$tmp/iperf.pid" >/dev/null
sockperf server --tcp -i 127.0.0.1 -p "$sockperf_port" >/dev/null 2>&1 &
sp_pid=$!
sleep 1

json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
row() { # what, tbbench, peer, unit, higher-is-better(1/0), goal
  python3 - "$@" <<'PY'
import sys
what, a, b, unit, higher, goal = sys.argv[1:]
a, b = float(a), float(b)
ratio = a / b if higher == "1" else b / a
print(f"{what:<34} {a:>10.2f} {b:>10.2f} {unit:<7} {ratio:>6.2f}   {goal}")
PY
}

echo "bench-link: $rounds rounds; BLAS-free; OPENBLAS_* do not apply. Host: $(nproc) cores, $(uname -r)"
printf '%-34s %10s %10s %-7s %6s   %s\n' "figure" "tbbench" "peer" "unit" "ratio" "goal (ratio = tbbench vs peer, >1 is better)"
# 100 iterations of a 64-message window: about as many bytes as iperf3's 3 seconds.
for case in "128K 1" "1M 1" "1M 2"; do
  read -r size streams <<<"$case"
  tbv=(); pv=()
  for _ in $(seq "$rounds"); do
    "$tb" link --buffer "$size" --mode bw --warmup 10 --iters 100 --streams "$streams" \
      --out "$tmp/bw.json" >/dev/null
    tbv+=("$(json "$tmp/bw.json" "d['results']['bandwidth'][0]['gbit_per_s']['avg']")")
    iperf3 -c 127.0.0.1 -p "$iperf_port" -l "$size" -t 3 -P "$streams" -J >"$tmp/iperf.json"
    pv+=("$(json "$tmp/iperf.json" "d['end']['sum_received']['bits_per_second']/1e9")")
  done
  label="tcp bw ${size}B (vs iperf3)"
  [ "$streams" = 1 ] || label="tcp bw ${size}B x$streams (vs iperf3 -P$streams)"
  row "$label" "$(median "${tbv[@]}")" "$(median "${pv[@]}")" "Gbit/s" 1 ">= 1.0"
done
for m in 64 4096; do
  tbv=(); pv=()
  for _ in $(seq "$rounds"); do
    "$tb" link --buffer "$m" --mode latency --iters 20000 --out "$tmp/lat.json" >/dev/null
    tbv+=("$(json "$tmp/lat.json" "d['results']['latency'][0]['one_way_us']['median']")")
    pv+=("$(sockperf ping-pong --tcp -i 127.0.0.1 -p "$sockperf_port" -m "$m" -t 3 2>&1 | sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p')")
  done
  row "tcp p50 one-way ${m}B (vs sockperf)" "$(median "${tbv[@]}")" "$(median "${pv[@]}")" "us" 0 ">= 0.91 (within 10%)"
done
tbv=(); pv=()
for _ in $(seq "$rounds"); do
  "$tb" link --transport shm --buffer 256MiB --mode bw --out "$tmp/shm.json" >/dev/null
  tbv+=("$(json "$tmp/shm.json" "d['results']['bandwidth'][0]['gbit_per_s']['avg']")")
  pv+=("$(json "$tmp/shm.json" "d['results']['ceiling_gbit_per_s']")")
done
row "shm bw 256MiB (vs memcpy 256MiB)" "$(median "${tbv[@]}")" "$(median "${pv[@]}")" "Gbit/s" 1 ">= 0.90"
