#!/usr/bin/env bash
# Transformer Engine for the benchmarks (issue 22: TE as a measured peer). The device machines
# have no network; TE 2.20.2 comes from the offline kit (a `te_kit` folder with part1/ and
# slimcore/ side by side; its part1/install_and_bench.sh does the installing).
#
#   TE_KIT=path/to/te_kit bench/peers/te_env.sh install   # installs into $TE_SITE (/tmp/site)
#   source bench/peers/te_env.sh                          # then, in the shell that runs peers
#
# Sourced, it adds $TE_SITE and the CUDA libraries of torch's wheels to PYTHONPATH and
# LD_LIBRARY_PATH (what the kit's installer exports) when $TE_SITE exists, and sets
# TE_AVAILABLE=1 when `import transformer_engine.pytorch` then works (0 otherwise, and
# TE_WHY_NOT says why). A machine whose Python already has TE needs neither step.
te_site=${TE_SITE:-/tmp/site}

te_install() {
  local kit=${TE_KIT:-}
  if [[ -z $kit || ! -f $kit/part1/install_and_bench.sh ]]; then
    echo "te_env: TE_KIT does not name the offline kit (part1/install_and_bench.sh): '$kit'" >&2
    return 1
  fi
  # The kit writes its logs to $OUT: not the caller's (the device tool brings that folder back).
  OUT=$(mktemp -d /tmp/te-install.XXXXXX) TEKIT_SITE=$te_site TEKIT_STOP_AFTER_INSTALL=1 \
    bash "$kit/part1/install_and_bench.sh"
}

te_export() {
  if [[ -d $te_site ]]; then
    export PYTHONPATH=$te_site${PYTHONPATH:+:$PYTHONPATH}
    export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    local purelib libs="" d
    purelib=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    for d in "$purelib/torch/lib" "$purelib/nvidia/cu13/lib" "$purelib/nvidia/cudnn/lib" \
      "$purelib/nvidia/nccl/lib" "$CUDA_HOME/lib64"; do
      [[ -d $d ]] && libs=${libs:+$libs:}$d
    done
    export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export NVTE_FRAMEWORK=pytorch
  fi
  if TE_WHY_NOT=$(python3 -c "import torch, transformer_engine.pytorch" 2>&1); then
    TE_AVAILABLE=1
    TE_WHY_NOT=""
  else
    TE_AVAILABLE=0
    TE_WHY_NOT=$(echo "$TE_WHY_NOT" | tail -1)
  fi
  export TE_AVAILABLE TE_WHY_NOT
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  case ${1:-} in
    install) te_install ;;
    *)
      echo "usage: TE_KIT=DIR $0 install   |   source $0" >&2
      exit 2
      ;;
  esac
else
  te_export
fi
