#!/usr/bin/env bash
# The main job: install what is missing, build, then check dsl_examples/mlp.fuse, show its IR and
# run a few training steps of it. The GPU executor is not built yet, so it runs on the CPU
# reference (small token count: the example's weights are full size).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release --target fusec
fusec=build/release/compiler/fusec
example=dsl_examples/mlp.fuse
echo "== fusec check $example"
"$fusec" check "$example"
echo "ok"
echo "== fusec ir $example"
"$fusec" ir "$example"
echo "== fusec run $example --device cpu --bind tokens=16 --steps 3"
"$fusec" run "$example" --device cpu --bind tokens=16 --steps 3
