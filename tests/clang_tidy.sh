#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy at the root) over the compiler, plan, debug, runtime, reference and
# tools sources that the build tree compiles (its compile_commands.json).
# Usage: clang_tidy.sh CLANG_TIDY BUILD_DIR SOURCE_DIR
set -euo pipefail
tidy="$1" build="$2" src="$3"
grep -o '"file": *"[^"]*"' "$build/compile_commands.json" | sed 's/.*"\([^"]*\)"$/\1/' |
  grep -E "^$src/(compiler|plan|debug|runtime|reference|tools)/.*\.cpp$" | sort -u |
  xargs -n 1 -P "$(nproc)" "$tidy" -p "$build" --quiet 2>/dev/null |
  tee /dev/stderr | { ! grep -E ': (warning|error):'; }
