#!/usr/bin/env bash
# On a machine with a GPU (the lent device): build, run the `gpu` tests, the CPU suite, and the
# gpu tests again under compute-sanitizer memcheck. Logs go to $OUT (or build/gpu-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu-logs}"
mkdir -p "$out"
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
# CUTLASS's headers (no network on the device machines: carry build/third_party, or an archive
# named by OPFUSE_CUTLASS_ARCHIVE; scripts/cutlass_headers.sh).
scripts/cutlass_headers.sh >"$out/cutlass.log" 2>&1 || { tail -5 "$out/cutlass.log"; exit 1; }
cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPFUSE_WERROR=ON >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build build/gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -40; exit 1; }
cd build/gpu
echo "== gpu tests"
ctest -L gpu --output-on-failure 2>&1 | tee "$out/gpu_tests.log" | tail -15
echo "== compute-sanitizer memcheck"
for t in tests/test_*gpu*; do
  [ -x "$t" ] || continue
  # The misuse suite's fault tests make their child processes fault on purpose: check the parent.
  targets=all
  [ "$(basename "$t")" = test_misuse_gpu ] && targets=application-only
  echo "-- $t"
  compute-sanitizer --tool memcheck --target-processes "$targets" --error-exitcode 9 "$t" 2>&1 | tail -4
done | tee "$out/memcheck.log"
echo "== cpu tests"
ctest -LE "gpu|style|fuzz" -j 16 --output-on-failure 2>&1 | tee "$out/cpu_tests.log" | tail -8
