#!/usr/bin/env bash
# Puts NVIDIA CUTLASS's C++ headers (cute/ and cutlass/, from PyPI's nvidia-cutlass wheel, checked
# against its SHA-256) under DIR/include, where CMake's OPFUSE_CUTLASS_INCLUDE_DIR finds them:
# the fused-epilogue GEMMs (runtime/gpu/fused_gemm.cu) are CUTLASS kernels. Does nothing when they
# are there. The device machines have no network: carry DIR there (bench/README.md).
#
#   scripts/cutlass_headers.sh [DIR]     # default build/third_party/cutlass-4.2.0.0
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.2.0.0
sha256=f9599ada45c7bcb6bf53f7d3f0a7d154183e53451c01bfa59eecd37dd4a693f6
dir=${1:-build/third_party/cutlass-$version}
[ -f "$dir/include/cute/tensor.hpp" ] && [ -f "$dir/include/cutlass/cutlass.h" ] && exit 0
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
