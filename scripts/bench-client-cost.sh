#!/usr/bin/env bash
# What tbbench infer adds to the figures it measures: at 64 concurrent streams against a
# server with no model (suites/infer/examples/timed_server.rs: a thread per connection, first
# token 200 ms after the request was read, then a token every 20 ms, and its own clock for
# each request in llama-server's `timings`),
# tbbench's TTFT against the server's time to its first token and tbbench's TPOT against the
# server's time per token after the first, request by request. Printed: the medians (and
# p99) of the ratios over ROUNDS runs; 1.000 is a client that adds nothing.
#
#   scripts/bench-client-cost.sh [STREAMS] [REQUESTS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
streams=${1:-64}
requests=${2:-256}
rounds=${3:-3}
cargo build --release -q
cargo build --release -q -p tbbench-infer --example timed_server
port=$((20000 + RANDOM % 10000))
tmp=$(mktemp -d)
srv=""
trap '[ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$tmp"' EXIT
target/release/examples/timed_server "$port" --ttft-ms 200 --gap-ms 20 &
srv=$!
for _ in $(seq 50); do
  curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
  sleep 0.1
done
echo "client cost: $streams concurrent streams, $requests requests of 64 tokens, $rounds rounds, $(nproc) cores"
for r in $(seq "$rounds"); do
  target/release/tbbench infer --endpoint "http://127.0.0.1:$port/v1" --concurrency "$streams" \
    --requests "$requests" --max-tokens 64 --prompt-tokens 8 --warmup 4 --out "$tmp/r$r.json" \
    >/dev/null 2>"$tmp/r$r.err" || { cat "$tmp/r$r.err" >&2; exit 1; }
done
python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]
rows = []
for r in range(1, rounds + 1):
    level = json.load(open(f"{tmp}/r{r}.json"))["results"]["levels"][0]
    ttft, tpot, conn = [], [], []
    for p in level["per_request"]:
        t = p.get("server_timings") or {}
        if not p["ok"] or "prompt_ms" not in t:
            continue
        ttft.append(p["ttft_ms"] / t["prompt_ms"])
        conn.append(p.get("connect_ms", 0.0))
        n = t["generated_tokens"]
        tpot.append(p["tpot_ms"] / (t["generation_ms"] / (n - 1)))
    rows.append((statistics.median(ttft), pct(ttft, 0.99), statistics.median(tpot), pct(tpot, 0.99), len(ttft)))
    print(f"round {r}: {len(ttft)} requests  TTFT/server {rows[-1][0]:.4f} (p99 {rows[-1][1]:.4f})  TPOT/server {rows[-1][2]:.4f} (p99 {rows[-1][3]:.4f})  connect p50 {statistics.median(conn):.2f} ms")
med = lambda i: statistics.median(x[i] for x in rows)
print(f"median of rounds: TTFT ratio {med(0):.4f}, TPOT ratio {med(2):.4f} (goal: within 1%, 0.99 to 1.01)")
PY
