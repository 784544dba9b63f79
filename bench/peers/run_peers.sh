#!/usr/bin/env bash
# Runs the PyTorch peer benchmarks (copy bandwidth, GEMMs, the seed MLP) and prints a summary.
# JSON goes to ${OUT:-/tmp}/peers_{copy,gemm,mlp}.json.
#
#   bench/peers/run_peers.sh [--sizes tiny,medium,large] [--modes fwd,fwdbwd] [--quick]
#
# --quick skips the large copies, the 8192^3 ceiling and max-autotune. MLP_BUDGET_S (seconds,
# default unbounded) bounds the MLP script: its slow optional variant (max-autotune) is skipped
# when the time left is short, and the script is stopped 30 s past the budget.
# PYTHON picks the interpreter (default python3, which must have torch with CUDA).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${OUT:-/tmp}
python=${PYTHON:-python3}
sizes=tiny,medium,large
modes=fwd,fwdbwd
quick=0
while (($#)); do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "run_peers.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

export PYTHONUNBUFFERED=1
mkdir -p "$out"
copy_args=() gemm_args=() mlp_args=()
if ((quick)); then
  copy_args+=(--shapes "x_medium,x_large")
  gemm_args+=(--no-ceiling)
  mlp_args+=(--variants "eager,compile,compile_fp8")
fi
mlp_timeout=()
if [[ -n ${MLP_BUDGET_S:-} ]]; then
  mlp_args+=(--budget-seconds "$MLP_BUDGET_S")
  # One compile can outrun the budget; the JSON keeps everything measured before the cut.
  mlp_timeout=(timeout $((MLP_BUDGET_S + 30)))
fi

status=0
run() {
  local name=$1; shift
  local began=$SECONDS
  echo "== $name"
  "${prefix[@]}" "$python" "$here/$name.py" "$@" || { echo "$name failed with status $?"; status=1; }
  echo "== $name took $((SECONDS - began)) s"
}
prefix=()
run copy_bw --json "$out/peers_copy.json" "${copy_args[@]}"
run gemm_peers --json "$out/peers_gemm.json" --sizes "$sizes" "${gemm_args[@]}"
prefix=("${mlp_timeout[@]}")
run mlp_peers --json "$out/peers_mlp.json" --sizes "$sizes" --modes "$modes" "${mlp_args[@]}"
"$python" "$here/summarize.py" "$out"
exit $status
