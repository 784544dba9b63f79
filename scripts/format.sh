#!/usr/bin/env bash
# Formats every C++ source in place with the root .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
find compiler plan runtime reference tools tests bench debug python \( -name '*.h' -o -name '*.cpp' \) -print0 | xargs -0 clang-format -i
