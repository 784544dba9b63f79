#!/usr/bin/env bash
# Regenerates the golden files after a deliberate change to the printers:
#   tests/golden/ir/<example>.ir   `fusec ir --after all` of every dsl_examples/*.fuse
#   tests/golden/ast/sketch.ast    the parser test's AST dump (OPFUSE_UPDATE_GOLDEN=1)
#   tests/golden/codegen/<example>/{plan.json,kernels/*.cu}   the plan and kernel sources of every
#                                  dsl_examples/*.fuse (test_codegen, OPFUSE_UPDATE_GOLDEN=1)
# Usage: scripts/update_goldens.sh [BUILD_DIR]   (default: build/release, configured if missing)
#        OPFUSE_GOLDENS=ir scripts/update_goldens.sh ...   regenerates the IR goldens only
#        OPFUSE_GOLDENS=codegen scripts/update_goldens.sh ...   ... the codegen goldens (and the AST)
# Review the result with `git diff tests/golden` before committing it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"

build_dir="${1:-build/release}"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  if [ "$#" -eq 0 ]; then
    cmake --preset release >/dev/null
  else
    echo "update_goldens: $build_dir is not a configured build directory" >&2
    exit 2
  fi
fi
which="${OPFUSE_GOLDENS:-all}"
targets=(fusec)
[ "$which" = ir ] || targets+=(test_parser)
cmake --build "$build_dir" --target "${targets[@]}" -j "$(nproc)"

fusec="$build_dir/tools/fusec"
mkdir -p tests/golden/ir
# A golden whose example is gone would fail test_examples; drop it.
for golden in tests/golden/ir/*.ir; do
  [ -e "$golden" ] || continue
  [ -f "dsl_examples/$(basename "$golden" .ir).fuse" ] || { rm "$golden"; echo "removed $golden"; }
done
for example in dsl_examples/*.fuse; do
  golden="tests/golden/ir/$(basename "$example" .fuse).ir"
  "$fusec" ir --after all "$example" >"$golden.tmp"
  mv "$golden.tmp" "$golden"
  echo "wrote $golden"
done

parser_test="$build_dir/tests/test_parser"
if [ "$which" != ir ] && grep -q OPFUSE_UPDATE_GOLDEN tests/unit/test_parser.cpp; then
  OPFUSE_UPDATE_GOLDEN=1 "$parser_test" --gtest_filter='Parser.SketchMatchesGoldenAst' >/dev/null
  echo "wrote tests/golden/ast/sketch.ast"
fi
# ---- codegen: plan.json and kernels/*.cu per example (tests/unit/test_codegen.cpp writes them) ----
if [ "$which" = all ] || [ "$which" = codegen ]; then
  cmake --build "$build_dir" --target test_codegen -j "$(nproc)"
  OPFUSE_UPDATE_GOLDEN=1 "$build_dir/tests/test_codegen" \
    --gtest_filter='DslExamples/CodegenGolden.*' >/dev/null
  # A directory whose example is gone would fail CodegenGoldens.EveryGoldenDirectoryBelongsToAnExample.
  for dir in tests/golden/codegen/*/; do
    [ -d "$dir" ] || continue
    [ -f "dsl_examples/$(basename "$dir").fuse" ] || { rm -r "$dir"; echo "removed $dir"; }
  done
  echo "wrote tests/golden/codegen/*/plan.json and kernels/*.cu"
fi
git --no-pager diff --stat -- tests/golden 2>/dev/null || true
