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
set -euo pipefail
cd "$(dirname "$0")/.."
tb=target/release/tbbench
[ -x "$tb" ] || cargo build --release
out=fixtures/results
rm -rf "$out/network" "$out/history" "$out/hpl"
mkdir -p "$out/network" "$out/history" "$out/hpl"
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
ls -la "$out"/*
