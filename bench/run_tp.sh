#!/usr/bin/env bash
# Tensor parallelism against PyTorch's (issue 20), in one device call on a machine with N >= 2
# GPUs. Run from the repository root:
#
#   bench/run_tp.sh                  # tp 1 and every tp up to the GPU count (2, 4, 8)
#   TPS="2" RECIPES="fp8_delayed" bench/run_tp.sh
#
# opfuse: `fusec bench --mode fwdbwd` of bench/workloads/mlp_large.fuse on one GPU (tp 1), then
# `fusec bench --nproc N` of mlp_large_tp.fuse's mlp_tpN (sp = false) and mlp_tpN_sp (sp = true),
# under each recipe. PyTorch: bench/peers/mlp_tp.py at the same tps (eager, torch.compile bf16,
# torch.compile FP8), sp = false and true. Then bench/peers/summarize_tp.py: one table, the
# scaling efficiency (time at tp 1 / (tp x time at tp)) of each, opfuse / PyTorch per row, and
# the amax all-reduce's share of opfuse's step. $OUT (default /tmp/opfuse-tp) gets tp.txt,
# tp.json and tp_results.tar.gz (every report and log).
#
# FUSEC: a built fusec (default: build it into build/bench, Release). BUDGET_S (default 560): the
# peers stop where the time runs out (what they measured is kept). PEERS=0 skips them. TRACE=1
# adds `--trace` to every opfuse run: each rank's GPU timeline (trace_tp<N>[_sp]_<recipe>.json,
# .rank<r>.json for the other ranks; docs/embedding.md, "Timelines") goes into the archive, and
# its idle-time line into the report.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-/tmp/opfuse-tp}
work=$(mktemp -d /tmp/opfuse-tp-work.XXXXXX)
budget=${BUDGET_S:-560}
recipes=${RECIPES:-fp8_delayed bf16}
gpus=$(nvidia-smi --list-gpus | wc -l)
default_tps=""
for tp in 2 4 8; do ((tp <= gpus)) && default_tps+="$tp "; done
tps=${TPS:-$default_tps}
variants=${VARIANTS:-eager,compile,compile_fp8}
mkdir -p "$out"
# shellcheck disable=SC2317  # called through the EXIT trap
pack() {
  cp "$work/tp.txt" "$work/tp.json" "$out/" 2>/dev/null
  tar czf "$out/tp_results.tar.gz" -C "$work" .
}
trap pack EXIT
trap 'exit 143' TERM
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off (the device notes: it can take the host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OPFUSE_CACHE_DIR=$(mktemp -d)
export OPFUSE_CACHE_DIR
stamp() { printf '[%4d s] %s\n' "$SECONDS" "$*"; }

nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv,noheader |
  tee "$work/device.txt"
nvidia-smi topo -m >"$work/topology.txt" 2>&1
git log -1 --format='commit %H %s' 2>/dev/null | tee "$work/commit.txt"
echo "${OPFUSE_COMMIT:+commit $OPFUSE_COMMIT (given)}" >>"$work/commit.txt"

fusec=${FUSEC:-}
if [[ -z $fusec ]]; then
  stamp "build fusec (Release)"
  cmake -S . -B build/bench -DCMAKE_BUILD_TYPE=Release -DOPFUSE_BUILD_TESTS=OFF \
    >"$work/configure.log" 2>&1 && cmake --build build/bench -j16 --target fusec \
    >"$work/build.log" 2>&1 || {
    echo "building fusec failed"
    tail -30 "$work/build.log"
    exit 1
  }
  fusec=build/bench/tools/fusec
fi

# `--trace FILE` for a run's name when TRACE=1, nothing otherwise.
trace_args() { [[ ${TRACE:-0} == 1 ]] && echo "--trace $work/trace_$1.json"; }

status=0
for recipe in $recipes; do
  stamp "opfuse tp 1, $recipe"
  # shellcheck disable=SC2046  # trace_args is empty or two words without spaces ($work has none)
  "$fusec" bench bench/workloads/mlp_large.fuse --bind tokens=16384 --mode fwdbwd \
    --recipe "$recipe" --json "$work/opfuse_tp1_${recipe}.json" $(trace_args "tp1_${recipe}") \
    >"$work/opfuse_tp1_${recipe}.txt" 2>&1 || { echo "opfuse tp 1 $recipe failed"; status=1; }
  for tp in $tps; do
    for sp in "" _sp; do
      stamp "opfuse tp $tp$sp, $recipe"
      # shellcheck disable=SC2046  # as above
      "$fusec" bench bench/workloads/mlp_large_tp.fuse --sequence "mlp_tp${tp}${sp}" --nproc "$tp" \
        --bind tokens=16384 --mode fwdbwd --recipe "$recipe" \
        --json "$work/opfuse_tp${tp}${sp}_${recipe}.json" $(trace_args "tp${tp}${sp}_${recipe}") \
        >"$work/opfuse_tp${tp}${sp}_${recipe}.txt" 2>&1 ||
        { echo "opfuse tp $tp$sp $recipe failed"; tail -20 "$work/opfuse_tp${tp}${sp}_${recipe}.txt"; status=1; }
    done
  done
done

peer_tps="1 $tps"
[[ ${PEERS:-1} == 0 ]] && peer_tps=""
for tp in $peer_tps; do
  left=$((budget - SECONDS))
  if ((left < 60)); then
    echo "peers at tp $tp and above skipped: ${left} s of the budget left"
    break
  fi
  stamp "PyTorch tp $tp"
  sp=both
  ((tp == 1)) && sp=false
  timeout "$left" python3 bench/peers/mlp_tp.py --nproc "$tp" --sp "$sp" --variants "$variants" \
    --json "$work/peers_tp${tp}.json" >"$work/peers_tp${tp}.txt" 2>&1 ||
    { echo "PyTorch tp $tp failed or ran out of time"; tail -20 "$work/peers_tp${tp}.txt"; status=1; }
done

stamp "summary"
python3 bench/peers/summarize_tp.py "$work" --json "$work/tp.json" | tee "$work/tp.txt"
exit "$status"
