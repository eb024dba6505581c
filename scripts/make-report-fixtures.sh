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
set -euo pipefail
cd "$(dirname "$0")/.."
tb=target/release/tbbench
[ -x "$tb" ] || cargo build --release
out=fixtures/results
rm -rf "$out/network" "$out/history" "$out/hpl" "$out/decode"
mkdir -p "$out/network" "$out/history" "$out/hpl" "$out/decode"
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
"${tb}" infer --gguf --nodes 2 --max-tokens 8 --out "$out/decode/decode-smollm2-pp2.json"
"${tb}" infer --shape llama-3.2-3b --layers 1 --nodes 2 --parallel tp --max-tokens 4 \
  --out "$out/decode/decode-llama-3.2-3b-tp2.json"
ls -la "$out"/*
