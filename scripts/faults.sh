#!/usr/bin/env bash
# The fault matrix: real runs of tbbench, each hit by one fault at a random moment, and what
# they left behind.
#
#   scripts/faults.sh [--short] [--rounds N] [--seed S] [--only SUITE:TRANSPORT:FAULT]
#
# Suites: link, coll, hpl, doctor and the built-in decode (infer --gguf, where scripts/setup.sh
# installed the model), on 3 local ranks over tcp, shm and the verbs transport (on the software
# RDMA device with Apple's rules, runners/softrdma). Faults: kill -9 of a random non-zero rank,
# of rank 0, of the launcher; SIGINT to the launcher (Ctrl-C); SIGSTOP of a random rank and of
# rank 0. Each case waits at most 40 s for the launcher to end, then checks:
#   hang        the launcher was still running after 40 s
#   panic       "panicked" anywhere in the output
#   lost        exit 0 but no result file
#   half        a result file that does not parse whole (or a temp file left beside it)
#   leftover    a rank process still alive 2 s after the launcher ended, or a new
#               /dev/shm/tbbench-* segment
#   lines       the run failed without exactly one "tbbench: error:" line (Ctrl-C: one
#               "tbbench: interrupted" line), or with a doubled "error: tbbench: error:"
# and prints one line per case, then the totals. Exit 1 if any count is above 0.
# --short (CI): each fault once, on a suite and transport drawn by the seed; the default runs
# every suite x transport x fault, --rounds times (1).
set -euo pipefail
cd "$(dirname "$0")/.."

short=0 rounds=1 seed=$RANDOM only=""
while [ $# -gt 0 ]; do
  case $1 in
    --short) short=1 ;;
    --rounds) rounds=$2; shift ;;
    --seed) seed=$2; shift ;;
    --only) only=$2; shift ;;
    *) echo "faults: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
RANDOM=$seed

bin=${TBBENCH_BIN:-target/release/tbbench}
if [ -z "${TBBENCH_BIN:-}" ]; then
  cargo build --release -q
fi
[ -x "$bin" ] || { echo "faults: $bin is missing" >&2; exit 2; }

suites=(link coll hpl doctor)
if "$bin" infer --gguf --nodes 1 --max-tokens 1 --no-verify --out /dev/null 2>&1 | grep -q "not installed"; then
  echo "faults: the decode is left out: no model installed (scripts/setup.sh installs SmolLM2-135M)"
else
  suites+=(decode)
fi
transports=(tcp shm verbs)
softrdma="$(dirname "$bin")/libtbbench_softrdma.so"
[ -f "$softrdma" ] || { echo "faults: $softrdma is missing (cargo build --release builds it)" >&2; exit 2; }
faults=(kill-rank kill-rank0 kill-launcher sigint stop-rank stop-rank0)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

args_for() { # suite -> the run's arguments: long enough that a fault lands mid-run
  case $1 in
    link) echo "link --sizes 1..4MiB --iters 300" ;;
    coll) echo "coll --op all --algo all --sizes 8..16MiB --iters 20" ;;
    hpl) echo "hpl --n 5000 --no-dgemm-probe" ;;
    doctor) echo "doctor --hpl-n 7000" ;;
    decode) echo "infer --gguf --parallel pp --max-tokens 48 --no-verify" ;;
  esac
}

transport_args() { # transport -> the flags that pick it
  case $1 in
    verbs) echo "--transport verbs --verbs-lib $softrdma --rdma-device softrdma_apple0" ;;
    *) echo "--transport $1" ;;
  esac
}

ranks_of() { # launcher pid -> its rank processes' pids
  pgrep -P "$1" 2>/dev/null || true
}

rank_with() { # rank number, pids... -> the pid whose environment says TBBENCH_RANK=rank
  local want=$1; shift
  for p in "$@"; do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "TBBENCH_RANK=$want"; then
      echo "$p"; return
    fi
  done
}

declare -A total=([cases]=0 [hang]=0 [panic]=0 [lost]=0 [half]=0 [leftover]=0 [lines]=0)

run_case() { # suite transport fault
  local suite=$1 transport=$2 fault=$3
  local dir="$work/case${total[cases]}" out
  mkdir -p "$dir"; out="$dir/r.json"
  local shm_before
  shm_before=$(ls /dev/shm 2>/dev/null | grep -c '^tbbench-' || true)
  # shellcheck disable=SC2046
  setsid "$bin" $(args_for "$suite") --nodes 3 $(transport_args "$transport") --out "$out" \
    >"$dir/stdout" 2>"$dir/stderr" </dev/null &
  local launcher=$! delay_ms=$((300 + RANDOM % 2200))
  sleep "$(printf '0.%03d' $((delay_ms % 1000)))"; sleep $((delay_ms / 1000))
  local pids=() target="" note=""
  mapfile -t pids < <(ranks_of "$launcher")
  case $fault in
    kill-rank) target=$(rank_with $((1 + RANDOM % 2)) "${pids[@]}"); [ -n "$target" ] && kill -9 "$target" ;;
    kill-rank0) target=$(rank_with 0 "${pids[@]}"); [ -n "$target" ] && kill -9 "$target" ;;
    kill-launcher) target=$launcher; kill -9 "$launcher" 2>/dev/null || true ;;
    sigint) target=$launcher; kill -INT -- "-$launcher" 2>/dev/null || true ;;
    stop-rank) target=$(rank_with $((1 + RANDOM % 2)) "${pids[@]}"); [ -n "$target" ] && kill -STOP "$target" ;;
    stop-rank0) target=$(rank_with 0 "${pids[@]}"); [ -n "$target" ] && kill -STOP "$target" ;;
  esac
  [ -z "$target" ] && note=" (run over before the fault)"
  local waited=0
  while kill -0 "$launcher" 2>/dev/null && [ $waited -lt 400 ]; do sleep 0.1; waited=$((waited + 1)); done
  local verdict=()
  if kill -0 "$launcher" 2>/dev/null; then
    verdict+=(hang); kill -9 -- "-$launcher" 2>/dev/null || true
  fi
  local code=0
  { wait "$launcher"; } 2>/dev/null || code=$?
  sleep 2
  for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" != Z ]; then
      verdict+=(leftover); kill -9 "$p" 2>/dev/null || true
      break
    fi
  done
  local shm_after
  shm_after=$(ls /dev/shm 2>/dev/null | grep -c '^tbbench-' || true)
  [ "$shm_after" -gt "$shm_before" ] && verdict+=(leftover)
  grep -q panicked "$dir/stdout" "$dir/stderr" && verdict+=(panic)
  if [ -e "$out" ]; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["schema_version"]' "$out" \
      2>/dev/null || verdict+=(half)
  elif [ "$code" = 0 ] && [ "$fault" != kill-launcher ]; then
    verdict+=(lost)
  fi
  ls -a "$dir" | grep -q '\.tmp-' && verdict+=(half)
  if [ "$code" != 0 ] && [ "$fault" != kill-launcher ]; then
    local errors
    errors=$(grep -c '^tbbench: error:\|^tbbench: interrupted' "$dir/stderr" || true)
    if [ "$errors" != 1 ] || grep -q 'error: tbbench: error:' "$dir/stderr"; then
      verdict+=(lines)
    fi
  fi
  total[cases]=$((total[cases] + 1))
  local v
  for v in "${verdict[@]}"; do total[$v]=$((total[$v] + 1)); done
  local last
  last=$(grep '^tbbench: ' "$dir/stderr" | tail -n 1 | cut -c1-110 || true)
  printf '%-7s %-5s %-14s at %4d ms  exit %-3s %-10s %s%s\n' "$suite" "$transport" "$fault" \
    "$delay_ms" "$code" "${verdict[*]:-ok}" "$last" "$note"
  if [ ${#verdict[@]} -gt 0 ]; then
    sed 's/^/    | /' "$dir/stderr" | tail -n 8
  fi
}

echo "faults: seed $seed ($bin)"
if [ -n "$only" ]; then
  IFS=: read -r s t f <<<"$only"
  run_case "$s" "$t" "$f"
elif [ $short = 1 ]; then
  for fault in "${faults[@]}"; do
    run_case "${suites[RANDOM % ${#suites[@]}]}" "${transports[RANDOM % ${#transports[@]}]}" "$fault"
  done
else
  for _ in $(seq "$rounds"); do
    for suite in "${suites[@]}"; do
      for transport in "${transports[@]}"; do
        for fault in "${faults[@]}"; do run_case "$suite" "$transport" "$fault"; done
      done
    done
  done
fi
echo
echo "cases ${total[cases]}  hangs ${total[hang]}  panics ${total[panic]}  lost ${total[lost]}  half-written ${total[half]}  leftovers ${total[leftover]}  wrong error lines ${total[lines]}"
bad=$((total[hang] + total[panic] + total[lost] + total[half] + total[leftover] + total[lines]))
[ "$bad" = 0 ]
