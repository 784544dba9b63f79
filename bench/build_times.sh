#!/usr/bin/env bash
# Times `fusec build dsl_examples/mlp.fuse` (issue 3, "Speed"):
#   cold: an empty kernel cache directory, so NVRTC compiles every kernel (in parallel);
#   warm: the same cache again, every kernel a cache hit.
# For each it prints the median over RUNS runs of the whole process's wall time and of the compile
# stage that report.txt records (for the warm build that stage is all cache work: hashing the
# keys, reading and verifying every entry). Not a test: nothing here asserts a speed.
# Usage: bench/build_times.sh [BUILD_DIR (default build/release)] [RUNS (default 5)]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${1:-build/release}"
runs="${2:-5}"
fusec="$build_dir/tools/fusec"
program=dsl_examples/mlp.fuse
if [ ! -x "$fusec" ]; then
  echo "build_times: no $fusec; build it first: cmake --build $build_dir --target fusec" >&2
  exit 2
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
now_ns() { date +%s%N; }
# The compile stage's wall time from a build's report.txt.
stage_ms() { sed -n 's/^compile stage: \([0-9.]*\) ms wall.*/\1/p' "$1/report.txt"; }

cold_ms=() warm_ms=() cold_stage=() warm_stage=()
for run in $(seq "$runs"); do
  cache="$work/cache-$run"
  start=$(now_ns)
  OPFUSE_CACHE_DIR="$cache" "$fusec" build "$program" -o "$work/cold-$run" >/dev/null
  cold_ms+=("$(( ($(now_ns) - start) / 1000000 ))")
  cold_stage+=("$(stage_ms "$work/cold-$run")")
  grep -q "misses" "$work/cold-$run/report.txt"
  start=$(now_ns)
  OPFUSE_CACHE_DIR="$cache" "$fusec" build "$program" -o "$work/warm-$run" >/dev/null
  warm_ms+=("$(( ($(now_ns) - start) / 1000000 ))")
  warm_stage+=("$(stage_ms "$work/warm-$run")")
  grep -q ", 0 misses" "$work/warm-$run/report.txt" || { echo "build_times: warm build missed" >&2; exit 1; }
done

kernels=$(sed -n 's/^\([0-9]*\) kernels:$/\1/p' "$work/cold-1/report.txt")
echo "fusec build $program: $kernels kernels, $(nproc) cores, median of $runs runs"
printf 'cold (empty cache):  process %6s ms   compile stage %8s ms   runs: %s\n' \
  "$(printf '%s\n' "${cold_ms[@]}" | median)" "$(printf '%s\n' "${cold_stage[@]}" | median)" \
  "${cold_ms[*]}"
printf 'warm (all hits):     process %6s ms   cache work    %8s ms   runs: %s\n' \
  "$(printf '%s\n' "${warm_ms[@]}" | median)" "$(printf '%s\n' "${warm_stage[@]}" | median)" \
  "${warm_ms[*]}"
