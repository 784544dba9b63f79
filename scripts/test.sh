#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run the sanitizer (ASan+UBSan) pass over
# the front-end tests and the fuzz corpus, then every CPU test. GPU tests (label `gpu`) run where a
# GPU is present and are reported as skipped elsewhere. Ends with ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs="$(nproc)"

echo "== sanitizer build (clang, ASan+UBSan) of the front end"
scripts/build.sh asan --target frontend_tests fuzz_frontend
(cd build/asan && ctest -L frontend --output-on-failure -j "$jobs")

echo "== release build"
scripts/build.sh release
cd build/release
ctest --output-on-failure -j "$jobs"
