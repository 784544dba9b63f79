#!/usr/bin/env bash
# The main job: install what is missing, build, then check and show dsl_examples/mlp.fuse.
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
