#!/usr/bin/env bash
# The tests: what they need installed first (scripts/setup.sh --deps), then `cargo test
# --workspace` (arguments pass through to it), then the tests that skipped and why. A skipping
# test passes, and cargo shows a passing test's output only with --nocapture, so each one
# also leaves its reason in target/tmp/skipped-tests.txt.
#
#   scripts/test.sh [CARGO TEST ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
# What the tests need on a fresh machine (packages, the llama.cpp server, the model): a quick
# check where it is all there. TBBENCH_TEST_NO_SETUP=1 skips it.
if [ "${TBBENCH_TEST_NO_SETUP:-0}" != 1 ]; then
  scripts/setup.sh --deps || exit 1
fi
list="${CARGO_TARGET_DIR:-target}/tmp/skipped-tests.txt"
rm -f "$list"
# The Slurm tests bring up scripts/slurm-lab.sh's one-node cluster; it goes down afterwards
# unless it was up before.
lab_was_up=0
[ -f "${TBBENCH_SLURM_LAB:-/tmp/tbbench-slurm-lab}/slurmctld.pid" ] && lab_was_up=1
cargo test --workspace "$@"
rc=$?
[ "$lab_was_up" = 1 ] || scripts/slurm-lab.sh down >/dev/null 2>&1 || true
if [ -s "$list" ]; then
  echo "tests: $(wc -l < "$list") skipped:"
  sort "$list" | sed 's/^/  /'
else
  echo "tests: none skipped"
fi
exit "$rc"
