#include "gpu/plan_gemm.h"

#include <fmt/format.h>

#include "gpu/kernel_params.h"
#include "opfuse/error.h"

namespace opfuse::gpu {

namespace {

// The scale mode of an FP8 operand: its copy's quantizer spec decides (a per-tensor scale_inv in
// a buffer is a quantized input's, note "Quantized boundaries" in docs/architecture.md).
ScaleMode scale_mode(const plan::GemmOperand& operand, const plan::SequencePlan& plan) {
  if (operand.scale_inv.buffer < 0) return ScaleMode::Tensor;
  const int q = plan.buffers.at(static_cast<std::size_t>(operand.buffer)).quantizer;
  if (q < 0 || q >= static_cast<int>(plan.quantizers.size())) {
    throw UsageError(
        fmt::format("a GEMM operand (buffer {}) has a scale grid but no quantizer: "
                    "rebuild the plan",
                    operand.buffer));
  }
  switch (plan.quantizers[static_cast<std::size_t>(q)].spec.scaling) {
    case plan::ScalingKind::Block1D:
      return ScaleMode::Block1D;
    case plan::ScalingKind::Block2D:
      return ScaleMode::Block2D;
    case plan::ScalingKind::Delayed:  // a quantized input's scalar, given by the caller
    case plan::ScalingKind::Current:
      return ScaleMode::Tensor;
    default:
      throw UsageError(fmt::format(
          "quantizer '{}' ({}) has no GEMM scale mode on this runtime: MXFP8 and NVFP4 GEMMs need "
          "sm_100",
          plan.quantizers[static_cast<std::size_t>(q)].name,
          plan::quant_spec_string(plan.quantizers[static_cast<std::size_t>(q)].spec)));
  }
}

}  // namespace

GemmDesc gemm_desc(const plan::GemmStep& step, const std::map<std::string, std::int64_t>& symbols,
                   const plan::SequencePlan& plan) {
  GemmDesc desc;
  desc.m = evaluate_expr(step.m, symbols);
  desc.n = evaluate_expr(step.n, symbols);
  desc.k = evaluate_expr(step.k, symbols);
  desc.a = step.a.dtype;
  desc.b = step.b.dtype;
  desc.d = step.d_dtype;
  desc.a_transposed = step.a_transposed;
  desc.b_transposed = step.b_transposed;
  desc.epilogue = step.epilogue;
  desc.accumulate = step.accumulate;
  desc.fast_accum = step.fast_accum;
  desc.a_scale = scale_mode(step.a, plan);
  desc.b_scale = scale_mode(step.b, plan);
  return desc;
}

}  // namespace opfuse::gpu
