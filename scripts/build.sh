#!/usr/bin/env bash
# Configures and builds a preset (default: release) with every core.
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
shift || true
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)" "$@"
