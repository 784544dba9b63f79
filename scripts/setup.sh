#!/usr/bin/env bash
# Installs what opfuse needs from Debian's packages, only what is missing.
# The CUDA 13 toolkit is expected at /usr/local/cuda (or $CUDA_HOME); it is not an apt package here.
set -euo pipefail

packages=(
  cmake g++ clang clang-format libclang-rt-14-dev
  libgtest-dev libgmock-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev libyaml-cpp-dev libopenblas-dev
  python3  # tests/bench/test_compare.py runs bench/compare.py
  python3-venv  # tests/python/run_package_tests.sh: the Python package in a virtual environment
  # tests/unit/test_debug_report_screenshot.cpp: screenshots `fusec debug-report`'s page with
  # headless Chromium and decodes the PNG with zlib (the test skips without Chromium).
  chromium zlib1g-dev
)
# The template checker (tools/check_templates/check_templates.cpp, cmake/template_checker.cmake) needs
# libclang-16-dev and llvm-16-dev (libraries, headers), clang-16 (Clang's CMake package) and
# libclang-common-16-dev (Clang's CUDA wrapper headers); optional where Debian lacks them.
if apt-cache show libclang-16-dev >/dev/null 2>&1; then
  packages+=(libclang-16-dev llvm-16-dev clang-16 libclang-common-16-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cuda="${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}"
if [ ! -x "$cuda/bin/nvcc" ] && [ ! -f "$cuda/include/nvrtc.h" ]; then
  echo "setup: error: no CUDA toolkit at $cuda (set CUDA_HOME)" >&2
  exit 1
fi

# CUTLASS's headers for the fused-epilogue GEMMs (runtime/cutlass/fused_gemm.h), from PyPI.
"$(dirname "$0")/cutlass_headers.sh"
