#!/usr/bin/env bash
# The cost of the precision-debug features on the GPU (docs/debugging.md, "Cost"): `fusec bench`
# of the large MLP's training step (bench/workloads/mlp_large.fuse, tokens 16384, fp8_delayed)
# without a config, with a config that matches no layer (bench/debug/match_nothing.yaml: must
# cost nothing) and with LogTensorStats on every tensor of every layer at every iteration
# (bench/debug/log_all.yaml, statistics written to a log directory), in ROUNDS interleaved rounds
# on one GPU. Run from the repository root on the device machine; prints one table and leaves
# the fusec bench JSON files in $OUT (default /tmp/opfuse-debug-cost).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-/tmp/opfuse-debug-cost}
rounds=${ROUNDS:-3}
tokens=${TOKENS:-16384}
mkdir -p "$out"
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
OPFUSE_CACHE_DIR=${OPFUSE_CACHE_DIR:-$(mktemp -d)}
export OPFUSE_CACHE_DIR
if [[ ! -x build/bench/tools/fusec/fusec ]]; then
  cmake -S . -B build/bench -DCMAKE_BUILD_TYPE=Release -DOPFUSE_BUILD_TESTS=OFF >"$out/build.log" 2>&1 &&
    cmake --build build/bench -j"$(nproc)" --target fusec >>"$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log"; exit 1; }
fi
fusec=$(find build/bench -name fusec -type f -perm -u+x | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
git rev-parse --short HEAD 2>/dev/null | tee "$out/commit.txt"
bench() {  # NAME [extra args]
  local name=$1
  shift
  "$fusec" bench bench/workloads/mlp_large.fuse --bind "tokens=$tokens" --mode fwdbwd \
    --recipe fp8_delayed --json "$out/$name.json" "$@" >"$out/$name.txt" 2>&1 ||
    { echo "fusec bench $name failed:"; tail -20 "$out/$name.txt"; }
}
for round in $(seq 1 "$rounds"); do
  bench "plain_$round"
  bench "nothing_$round" --debug-config bench/debug/match_nothing.yaml
  rm -rf "$out/logs"
  bench "log_all_$round" --debug-config bench/debug/log_all.yaml --debug-log-dir "$out/logs"
  echo "round $round done"
done
python3 - "$out" "$rounds" <<'PY' | tee "$out/00_summary.txt"
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def median(name, r):
    try:
        with open(f"{out}/{name}_{r}.json") as f:
            return json.load(f)["time_ms"]["median"]
    except (OSError, KeyError, ValueError):
        return float("nan")
print(f"{'round':>5} {'plain ms':>9} {'no match ms':>12} {'ratio':>6} {'log all ms':>11} {'ratio':>6}")
for r in range(1, rounds + 1):
    p, n, a = median("plain", r), median("nothing", r), median("log_all", r)
    print(f"{r:>5} {p:9.3f} {n:12.3f} {n / p:6.3f} {a:11.3f} {a / p:6.3f}")
PY
lines=$(cat "$out"/logs/opfuse_statistics/globalrank-0.jsonl 2>/dev/null | wc -l)
echo "statistics lines written by the last log_all run: $lines"
