#!/usr/bin/env bash
# Builds bench/kernels/transpose_kernels.cu with nvcc against templates/ and runs it (on a machine
# with a GPU; the build alone needs only nvcc):
#
#   bench/kernels/run.sh [transpose_kernels arguments]   # build, check bit-exactness, time
#   BUILD_ONLY=1 bench/kernels/run.sh                    # build only
#
# The original templates (templates/ of ORIGINAL_REV, default HEAD: the working tree's changes
# against the last commit; a revision before the block-scaled kernels (templates/block_cast.cuh)
# no longer builds with the program; taken from git) are written into the build directory with
# their namespace renamed to opfuse_original (in $BUILD/opfuse_original/) and their include
# guards and macro renamed, so the program holds both versions and checks the current outputs against them byte for byte.
# BUILD (default build/kbench) is the build directory; NVCC_FLAGS are added to the nvcc line
# (e.g. -Xptxas -v for the register report); NAME names the binary (default transpose_kernels);
# TEMPLATES (default templates/) is the current version's tree, e.g. a patched copy to compare.
# bench/kernels/NOTES.md has the measurements and what was tried.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$root/build/kbench}
name=${NAME:-transpose_kernels}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
templates=${TEMPLATES:-$root/templates}

original=$build/original-templates
rm -rf "$original" && mkdir -p "$original" "$build/opfuse_original/common"
git -C "$root" archive "${ORIGINAL_REV:-HEAD}" templates | tar -x -C "$original"
(cd "$original/templates" && find . -name '*.cuh' -o -name '*.h') | while read -r file; do
  sed -e 's/^namespace opfuse {/namespace opfuse_original {/' \
    -e 's/OPFUSE_TEMPLATES_/OPFUSE_ORIGINAL_TEMPLATES_/g' \
    -e 's/OPFUSE_LAUNCH_RULE/OPFUSE_ORIGINAL_LAUNCH_RULE/g' \
    "$original/templates/$file" >"$build/opfuse_original/$file"
done

# shellcheck disable=SC2086  # NVCC_FLAGS is a list of flags
"$nvcc" -std=c++20 -O3 -arch=sm_90a -lineinfo -Werror all-warnings -I "$templates" \
  -I "$build" ${NVCC_FLAGS:-} -o "$build/$name" "$root/bench/kernels/transpose_kernels.cu"
[[ -n ${BUILD_ONLY:-} ]] && exit 0
exec "$build/$name" "$@"
