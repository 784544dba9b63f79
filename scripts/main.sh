#!/usr/bin/env bash
# The main job: install what is missing, build, then check dsl_examples/mlp.fuse, show its IR and
# run a few training steps of it: on the GPU where there is one, else on the CPU reference (small
# token count: the example's weights are full size and the CPU reference is slow).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release --target fusec
fusec=build/release/tools/fusec
example=dsl_examples/mlp.fuse
echo "== fusec check $example"
"$fusec" check "$example"
echo "ok"
echo "== fusec ir $example"
"$fusec" ir "$example"
echo "== fusec run $example --bind tokens=16 --steps 3 (the GPU if present, else the CPU reference)"
"$fusec" run "$example" --bind tokens=16 --steps 3
