#!/usr/bin/env bash
# Puts NVIDIA CUTLASS's C++ headers (cute/ and cutlass/, from PyPI's nvidia-cutlass wheel, checked
# against its SHA-256) under DIR/include, where CMake's OPFUSE_CUTLASS_INCLUDE_DIR finds them:
# the fused-epilogue GEMMs (runtime/cutlass/fused_gemm_kernel.cuh) are CUTLASS kernels. Does nothing when
# they are there.
#
#   scripts/cutlass_headers.sh [DIR]                  # default build/third_party/cutlass-4.2.0.0
#   scripts/cutlass_headers.sh --archive OUT.tar.xz   # those headers packed (about 1 MB)
#
# The GPU machines the device tool lends have no network: carry DIR there (27 MB), or carry the
# archive and set OPFUSE_CUTLASS_ARCHIVE to it (scripts/gpu_tests.sh and bench/run_gpu.sh run
# this script first, which then unpacks it).
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.2.0.0
sha256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
default_dir=build/third_party/cutlass-$version
if [ "${1:-}" = --archive ]; then
  out=${2:?usage: scripts/cutlass_headers.sh --archive OUT.tar.xz}
  "$0"
  tar -C "$(dirname "$default_dir")" -cJf "$out" "$(basename "$default_dir")"
  echo "cutlass_headers: $out"
  exit 0
fi
dir=${1:-$default_dir}
present() { [ -f "$dir/include/cute/tensor.hpp" ] && [ -f "$dir/include/cutlass/cutlass.h" ]; }
present && exit 0
if [ -n "${OPFUSE_CUTLASS_ARCHIVE:-}" ]; then
  mkdir -p "$(dirname "$dir")"
  tar -C "$(dirname "$dir")" -xJf "$OPFUSE_CUTLASS_ARCHIVE"
  if [ "$(basename "$dir")" != "cutlass-$version" ]; then
    rm -rf "$dir"
    mv "$(dirname "$dir")/cutlass-$version" "$dir"
  fi
  present && exit 0
  echo "cutlass_headers: $OPFUSE_CUTLASS_ARCHIVE holds no CUTLASS headers" >&2
  exit 1
fi
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$python" -m pip --version >/dev/null 2>&1; then
  "$python" -m venv "$tmp/venv"
  python="$tmp/venv/bin/python"
fi
"$python" -m pip download -q --no-deps --only-binary=:all: --dest "$tmp" "nvidia-cutlass==$version"
wheel="$tmp/nvidia_cutlass-$version-py3-none-any.whl"
echo "$sha256  $wheel" | sha256sum -c --quiet
mkdir -p "$dir.partial"
"$python" - "$wheel" "$dir.partial" <<'PY'
import sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in wheel.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = sys.argv[2] + "/include/" + name[len(prefix):]
            import os
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with wheel.open(name) as src, open(target, "wb") as dst:
                dst.write(src.read())
        elif name.endswith("licenses/LICENSE.txt"):
            with wheel.open(name) as src, open(sys.argv[2] + "/LICENSE.txt", "wb") as dst:
                dst.write(src.read())
PY
rm -rf "$dir"
mv "$dir.partial" "$dir"
echo "cutlass_headers: CUTLASS $version headers in $dir"
