#!/usr/bin/env bash
# One device call that measures opfuse against its PyTorch peers (issue 6) and prints one
# side-by-side table (bench/compare.py). Run from the repository root on the device machine:
#
#   bench/run_gpu.sh                 # everything; sized to finish within 9 minutes on an H100
#   SIZES="medium" bench/run_gpu.sh  # a subset (also MODES, RECIPES)
#
# Steps: builds fusec and the libraries of the Python package (build/bench, Release, -j16) in the
# background while the copy-bandwidth and GEMM peers run, then installs the package against them
# (tests/python/run_package_tests.sh install: only the bindings compile; offline, as on the device
# machines, OPFUSE_WHEELS=DIR names the build requirements' wheels, scripts/python_wheels.sh DIR
# fetches them), through which the interleaved comparisons run opfuse; the interleaved FP8 GEMM comparison (gemm_interleaved.py)
# and, for the large size, the interleaved MLP forward against torch.compile (mlp_interleaved.py)
# and the interleaved training step against TE and torch.compile per FP8 recipe (--mode fwdbwd),
# with each GEMM of the FP8 step against TE's (gemm_kernels.py);
# `fusec bench` for the seed MLP (bench/workloads/mlp_{large,medium,tiny}.fuse) in fwd and fwdbwd
# under fp8_delayed, fp8_current and bf16, tiny fwd also with --graph and with --no-auto-graph
# (host time per call), large fp8_delayed also with --gemm-autotune; JIT cold and warm build
# times (bench/build_times.sh); then the MLP peers (eager, torch.compile, torch.compile FP8),
# largest size first, stopped when the time budget runs out (their JSON keeps what was
# measured), Transformer Engine when it imports (TE_KIT names the offline kit to install it from,
# bench/peers/te_env.sh; bench/peers/te_peers.py); finally compare.py. $OUT (default /tmp/opfuse-bench)
# gets three files, since the device tool brings back at most eight: compare.txt, compare.json,
# and bench_results.tar.gz with every opfuse_*.json/.txt, peers_*.json/.txt, build times and logs
# (packed on exit, also when a step fails or the time runs out).
# The machine needs CUTLASS's headers for the build: carry build/third_party, or an archive of them
# (scripts/cutlass_headers.sh --archive) named by OPFUSE_CUTLASS_ARCHIVE, which fits beside TE_KIT.
# BUDGET_S (default 520) is the wall time the whole script may take. Nothing is cached across
# calls: the kernel cache starts empty (the first run per recipe is a cold JIT compile).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-/tmp/opfuse-bench}
work=$(mktemp -d /tmp/opfuse-bench-work.XXXXXX)
budget=${BUDGET_S:-520}
sizes=${SIZES:-large medium tiny}
modes=${MODES:-fwd fwdbwd}
recipes=${RECIPES:-fp8_delayed fp8_current bf16}
mkdir -p "$out"
# shellcheck disable=SC2317  # called through the EXIT trap
pack() {
  cp "$work/compare.txt" "$work/compare.json" "$out/" 2>/dev/null
  tar czf "$out/bench_results.tar.gz" -C "$work" .
}
trap pack EXIT
trap 'exit 143' TERM  # a stopped run still packs what it measured
export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
export PYTHONUNBUFFERED=1
OPFUSE_CACHE_DIR=$(mktemp -d)
export OPFUSE_CACHE_DIR
declare -A tokens=([large]=16384 [medium]=4096 [tiny]=32)
peers=bench/peers
status=0
stamp() { printf '[%4d s] %s\n' "$SECONDS" "$*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader |
  tee "$work/device.txt"
# What else runs on the GPU and how fast it is clocked, at the start and (gpu_state_end.txt) the
# end: a throttled or shared GPU makes every ratio in the table meaningless.
gpu_state() {
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active \
    --format=csv
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv
}
gpu_state >"$work/gpu_state_start.txt" 2>&1
cat "$work/gpu_state_start.txt"
# OPFUSE_COMMIT names the tree when the copy's git metadata is not the tree's (the device tool's
# copies carry the working tree, not always its history).
if [[ -n ${OPFUSE_COMMIT:-} ]]; then
  echo "commit $OPFUSE_COMMIT (given)" | tee "$work/commit.txt"
else
  git log -1 --format='commit %H %s' 2>/dev/null | tee "$work/commit.txt"
fi
git status --short 2>/dev/null | head -40 >"$work/uncommitted.txt"

# CUTLASS's headers for the fused-epilogue GEMMs: carried (build/third_party) or unpacked from
# OPFUSE_CUTLASS_ARCHIVE (scripts/cutlass_headers.sh); the machine has no network to fetch them.
scripts/cutlass_headers.sh >"$work/cutlass.txt" 2>&1 || { cat "$work/cutlass.txt"; exit 1; }
stamp "build fusec (background) while the copy and GEMM peers run"
(cmake -S . -B build/bench -DCMAKE_BUILD_TYPE=Release -DOPFUSE_BUILD_TESTS=OFF \
  >"$work/configure.log" 2>&1 && cmake --build build/bench -j16 --target fusec opfuse_reference \
  >"$work/build.log" 2>&1) &
build_pid=$!
# Transformer Engine (issue 22), when the machine's Python lacks it: installed from the offline
# kit named by TE_KIT (bench/peers/te_env.sh) while the build runs.
te_pid=""
if [[ -n ${TE_KIT:-} ]] && ! python3 -c "import transformer_engine.pytorch" >/dev/null 2>&1; then
  bench/peers/te_env.sh install >"$work/te_install.txt" 2>&1 &
  te_pid=$!
fi
python3 "$peers/copy_bw.py" --json "$work/peers_copy.json" --shapes x_medium,x_large,fc1_out_large \
  >"$work/peers_copy.txt" 2>&1 || { echo "copy_bw failed"; status=1; }
python3 "$peers/gemm_peers.py" --json "$work/peers_gemm.json" --target-seconds 0.15 \
  >"$work/peers_gemm.txt" 2>&1 || { echo "gemm_peers failed"; status=1; }
stamp "peers: copy and GEMMs done"
if ! wait "$build_pid"; then
  echo "building fusec failed:"
  grep -E "error|Error" "$work/configure.log" "$work/build.log" | head -30
  exit 1
fi
fusec=build/bench/tools/fusec
stamp "fusec built"
# The Python package (docs/python.md) over build/bench's libraries: the interleaved comparisons
# drive opfuse through it. "${pypkg[@]}" runs Python with it importable.
[[ -n ${OPFUSE_WHEELS:-} ]] && export PIP_NO_INDEX=1 PIP_FIND_LINKS=$OPFUSE_WHEELS
if PYTHON=python3 SOURCE_DIR=$PWD BUILD_DIR=$PWD/build/bench FUSEC=$fusec \
  tests/python/run_package_tests.sh install "$work/python" >"$work/package_install.txt" 2>&1; then
  stamp "Python package installed: $(grep -o 'python_package_install: [0-9]* s' "$work/package_install.txt")"
else
  echo "installing the Python package failed: $(tail -3 "$work/package_install.txt")"
  status=1
fi
# Transformer Engine joins the interleaved forward and the peers when it imports (installed
# above from TE_KIT, or the machine's own).
[[ -n $te_pid ]] && { wait "$te_pid" || echo "installing TE failed: $(tail -3 "$work/te_install.txt")"; }
# shellcheck source=bench/peers/te_env.sh
source bench/peers/te_env.sh
# After te_env.sh: its PYTHONPATH (TE's site) must reach the package's Python too.
if [[ -x $work/python/venv/bin/python ]]; then
  pypkg=("$work/python/venv/bin/python")
else
  pypkg=(env "PYTHONPATH=$work/python/site${PYTHONPATH:+:$PYTHONPATH}" python3)
fi
interleaved_peers=compile_fp8,compile
if [[ $TE_AVAILABLE == 1 ]]; then
  interleaved_peers+=,te
else
  echo "Transformer Engine not measured: $TE_WHY_NOT"
fi
# The FP8 GEMM goal's measurement: opfuse's GEMM runner and torch._scaled_mm in one process,
# alternating rounds on the same operands (bench/peers/gemm_interleaved.py).
timeout 120 "${pypkg[@]}" "$peers/gemm_interleaved.py" \
  --json "$work/peers_gemm_interleaved.json" >"$work/peers_gemm_interleaved.txt" 2>&1 ||
  { echo "gemm_interleaved failed: $(tail -2 "$work/peers_gemm_interleaved.txt")"; status=1; }
stamp "interleaved GEMMs done"
# `fusec build` of the large MLP under recipe $1 into build/mlp_large_$1 for the interleaved
# comparisons, once per run; says why and sets status when it fails.
built_large=" "
build_large() {
  [[ $built_large == *" $1 "* ]] && return 0
  if timeout 60 "$fusec" build bench/workloads/mlp_large.fuse --recipe "$1" -o "build/mlp_large_$1" \
    >"$work/mlp_large_build_$1.txt" 2>&1; then
    built_large+="$1 "
    return 0
  fi
  echo "fusec build of mlp_large ($1) failed: $(tail -2 "$work/mlp_large_build_$1.txt")"
  status=1
  return 1
}
# The large forward's goals measured in one process as well: an opfuse Session over a plan fusec
# builds first and torch.compile (FP8 and bf16), call by call (bench/peers/mlp_interleaved.py),
# with cuBLASLt's heuristic GEMM algorithms and with autotuned ones (SessionOptions).
if [[ " $sizes " == *" large "* ]]; then
  if build_large fp8_delayed &&
    ! timeout 300 "${pypkg[@]}" "$peers/mlp_interleaved.py" --build build/mlp_large_fp8_delayed \
    --gemm-algorithms heuristic,autotuned --peers "$interleaved_peers" \
    --json "$work/peers_mlp_interleaved.json" >"$work/peers_mlp_interleaved.txt" 2>&1; then
    echo "mlp_interleaved failed: $(tail -2 "$work/peers_mlp_interleaved.txt")"
    status=1
  fi
  stamp "interleaved MLP forward done"
fi
# The large training step the same way (mlp_interleaved.py --mode fwdbwd): opfuse's forward,
# backward and quantizer update against TE's block and torch.compile bf16, per FP8 recipe asked
# for that TE has (issue 22's goal against TE, issue 18's block goal against torch.compile).
if [[ " $sizes " == *" large "* && " $modes " == *" fwdbwd "* ]]; then
  training_peers=compile
  [[ $TE_AVAILABLE == 1 ]] && training_peers=te,compile
  for recipe in $recipes; do
    [[ $recipe == fp8_delayed || $recipe == fp8_current || $recipe == fp8_block ]] || continue
    if build_large "$recipe" &&
      ! timeout 240 "${pypkg[@]}" "$peers/mlp_interleaved.py" --build "build/mlp_large_$recipe" \
      --recipe "$recipe" --mode fwdbwd --peers "$training_peers" --rounds 6 --iters 6 \
      --json "$work/peers_mlp_interleaved_fwdbwd_$recipe.json" \
      >"$work/peers_mlp_interleaved_fwdbwd_$recipe.txt" 2>&1; then
      echo "mlp_interleaved --mode fwdbwd ($recipe) failed: $(tail -2 "$work/peers_mlp_interleaved_fwdbwd_$recipe.txt")"
      status=1
    fi
  done
  stamp "interleaved MLP training steps done"
  # The two-sequence MLP with an FP8 boundary against the one-sequence MLP, training step and
  # inference forward (bench/peers/boundary_interleaved.py; issue 24's goal).
  for mode in fwdbwd fwd; do
    timeout 200 "${pypkg[@]}" "$peers/boundary_interleaved.py" --mode "$mode" \
      --json "$work/peers_boundary_$mode.json" >"$work/peers_boundary_$mode.txt" 2>&1 ||
      { echo "boundary_interleaved --mode $mode failed: $(tail -2 "$work/peers_boundary_$mode.txt")"; status=1; }
  done
  stamp "quantized boundary done"
  # Each GEMM of the large FP8 step against TE's same GEMM, one profiler, the same tensors, the
  # side order rotating (bench/peers/gemm_kernels.py; issue 22's per-GEMM goal).
  if [[ $TE_AVAILABLE == 1 && " $recipes " == *" fp8_delayed "* ]]; then
    timeout 200 "${pypkg[@]}" "$peers/gemm_kernels.py" --size large --recipe fp8_delayed \
      --rounds 2 --json "$work/peers_gemm_kernels.json" >"$work/peers_gemm_kernels.txt" 2>&1 ||
      { echo "gemm_kernels failed: $(tail -2 "$work/peers_gemm_kernels.txt")"; status=1; }
    stamp "GEMMs against TE's done"
  fi
fi

for size in $sizes; do
  for mode in $modes; do
    for recipe in $recipes; do
      name="opfuse_${size}_${mode}_${recipe}"
      timeout 90 "$fusec" bench "bench/workloads/mlp_$size.fuse" --bind "tokens=${tokens[$size]}" \
        --mode "$mode" --recipe "$recipe" --json "$work/$name.json" >"$work/$name.txt" 2>&1 ||
        { echo "fusec bench $name failed: $(tail -2 "$work/$name.txt")"; status=1; }
      if [[ $size == large && $recipe == fp8_delayed ]]; then
        timeout 120 "$fusec" bench "bench/workloads/mlp_$size.fuse" --bind "tokens=${tokens[$size]}" \
          --mode "$mode" --recipe "$recipe" --gemm-autotune --json "$work/${name}_tuned.json" \
          >"$work/${name}_tuned.txt" 2>&1 ||
          { echo "fusec bench ${name}_tuned failed: $(tail -2 "$work/${name}_tuned.txt")"; status=1; }
      fi
      if [[ $size == tiny && $mode == fwd ]]; then
        timeout 60 "$fusec" bench "bench/workloads/mlp_$size.fuse" --bind "tokens=${tokens[$size]}" \
          --mode fwd --recipe "$recipe" --no-auto-graph --json "$work/${name}_eager.json" \
          >"$work/${name}_eager.txt" 2>&1 ||
          { echo "fusec bench ${name}_eager failed: $(tail -2 "$work/${name}_eager.txt")"; status=1; }
        timeout 60 "$fusec" bench "bench/workloads/mlp_$size.fuse" --bind "tokens=${tokens[$size]}" \
          --mode fwd --recipe "$recipe" --graph --json "$work/${name}_graph.json" \
          >"$work/${name}_graph.txt" 2>&1 ||
          { echo "fusec bench ${name}_graph failed: $(tail -2 "$work/${name}_graph.txt")"; status=1; }
      fi
    done
  done
  stamp "opfuse $size done"
done
bench/build_times.sh build/bench 3 >"$work/build_times.txt" 2>&1 || status=1
cat "$work/build_times.txt"

te_s=0
((TE_AVAILABLE == 1)) && te_s=${TE_S:-100}  # of the peers' time, kept for te_peers.py
left=$((budget - SECONDS - 25 - te_s))
stamp "MLP peers for up to $left s (largest first)"
peer_sizes=$(echo "$sizes" | tr ' ' ',')
peer_modes=$(echo "$modes" | tr ' ' ',')
if ((left > 30)); then
  timeout "$left" python3 "$peers/mlp_peers.py" --json "$work/peers_mlp.json" \
    --sizes "$peer_sizes" --modes "$peer_modes" --variants eager,compile,compile_fp8 \
    --target-seconds 0.2 --host-iters 500 >"$work/peers_mlp.txt" 2>&1 ||
    { echo "mlp_peers stopped (status $?): the table has what it measured"; status=1; }
else
  echo "no time left for the MLP peers"
  status=1
fi
if ((te_s > 0)); then
  te_left=$((budget - SECONDS - 25))
  stamp "Transformer Engine for up to $te_left s"
  timeout "$te_left" python3 "$peers/te_peers.py" --json "$work/peers_te.json" \
    --sizes "$peer_sizes" --modes "$peer_modes" --target-seconds 0.2 --host-iters 500 \
    --budget-seconds $((te_left - 20)) >"$work/peers_te.txt" 2>&1 ||
    { echo "te_peers stopped (status $?): the table has what it measured"; status=1; }
fi
stamp "peers done"
gpu_state >"$work/gpu_state_end.txt" 2>&1
cat "$work/gpu_state_end.txt"
python3 bench/compare.py "$work" | tee "$work/compare.txt"
stamp "done"
exit $status
