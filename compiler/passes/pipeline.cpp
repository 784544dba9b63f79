#include "passes/pipeline.h"

#include "passes/build_backward.h"
#include "passes/compose_pointwise.h"
#include "passes/debug_instrument.h"
#include "passes/debug_modify.h"
#include "passes/eliminate_aliases.h"
#include "passes/fuse.h"
#include "passes/gather_fp8.h"
#include "passes/plan_quantization.h"

namespace opfuse::passes {

std::vector<Pass> default_pipeline() {
  // Each entry: name, description, run, then what it requires of earlier passes and what it
  // provides; the pass manager checks both (pass_manager.h).
  return {
      // First: later fusion patterns match op windows, and an identity between two ops would
      // hide a pattern (norm, identity, linear must fuse like norm, linear).
      {"eliminate-aliases", "remove identity ops and reshapes to the same shape",
       eliminate_aliases},
      // Before build-backward, so a composed chain gets one backward op (which recomputes the
      // intermediates instead of saving them); after eliminate-aliases (an identity between two
      // activations would end the chain).
      {"compose-pointwise",
       "compose each chain of pointwise ops into one user-defined op (one kernel each way)",
       compose_pointwise},
      // Before quantization planning: the planner needs the backward GEMMs to know which
      // column-wise FP8 copies to make and where the gradient casts go.
      {"build-backward",
       "append the backward ops (dgrad, wgrad, norm/activation backward)",
       build_backward,
       {},
       {"backward"}},
      // After build-backward (it inspects backward tensors too; without one it places only the
      // forward records) and before plan-quantization (a stats op reads the high-precision
      // tensor, which the cast then leaves in memory).
      {"debug-instrument", "place the statistics ops a debug config's routing asks for",
       debug_instrument},
      // After debug-instrument (statistics read the tensor a layer received, not a GEMM's
      // modified copy) and before plan-quantization (a quantized GEMM casts its modified operand
      // with a quantizer of its own).
      {"debug-modify", "replace the GEMM operands a debug config's routing modifies, per GEMM",
       debug_modify},
      // Before fusion: casts must exist as ops for the patterns to fold them into producers.
      {"plan-quantization",
       "give GEMM operands FP8 quantizers and insert their casts",
       plan_quantization,
       {"backward"},
       {"quantizers"}},
      // After plan-quantization (it reads the FP8 copies it made; without them it drops its
      // slots) and before fusion.
      {"debug-capture-quantized",
       "place the captures of the FP8 copies a debug config's routing asks for",
       debug_capture_quantized},
      // After plan-quantization (it moves the casts it made; without them it finds nothing to
      // move) and debug-capture-quantized (a capture of the FP8 copy then reads the gathered
      // codes), before fusion (the cast of a rank's share folds into the norm before it).
      {"gather-fp8",
       "cast a tensor-parallel all_gather's input before it and gather FP8 codes (TE's FP8 "
       "all-gather)",
       gather_fp8},
      // Forward before backward: dgelu_bgrad fuses a backward GELU only where the forward GELU
      // became a GELU_AUX_BIAS epilogue (whose aux buffer it reads).
      {"fuse-forward",
       "fuse forward ops by the patterns of passes/fusion/, then fold statistics into kernels",
       fuse_forward,
       {"quantizers"}},
      {"fuse-backward",
       "fuse backward ops by the patterns of passes/fusion/, then fold statistics into kernels",
       fuse_backward,
       {"backward", "quantizers"}},
  };
}

}  // namespace opfuse::passes
