#!/usr/bin/env bash
# The tests: `cargo test --workspace` (arguments pass through to it), then the tests that
# skipped and why. A skipping test passes, and cargo shows a passing test's output only with
# --nocapture, so each one also leaves its reason in target/tmp/skipped-tests.txt.
#
#   scripts/test.sh [CARGO TEST ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
list="${CARGO_TARGET_DIR:-target}/tmp/skipped-tests.txt"
rm -f "$list"
cargo test --workspace "$@"
rc=$?
if [ -s "$list" ]; then
  echo "tests: $(wc -l < "$list") skipped:"
  sort "$list" | sed 's/^/  /'
else
  echo "tests: none skipped"
fi
exit "$rc"
