// A plan's GEMM step (plan::GemmStep, docs/codegen.md "GEMMs in row-major terms") as the
// cuBLASLt runner takes it: the GemmDesc under the bound sizes, and the GemmArgs pointing at the
// step's buffers and its operands' quantizer state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "gpu/gemm.h"
#include "gpu/quantizer_state.h"
#include "plan/plan.h"

namespace opfuse::gpu {

// Evaluates m, n and k with `symbols` and maps dtypes, layout, epilogue, accumulate, fast_accum,
// and each FP8 operand's scale mode (its copy's quantizer spec in `plan`).
GemmDesc gemm_desc(const plan::GemmStep& step, const std::map<std::string, std::int64_t>& symbols,
                   const plan::SequencePlan& plan);

// The pointers of one run: `buffer_pointer(id)` gives a plan buffer's device memory; FP8 operands
// take what their ScaleInvRef names (a quantizer's scale_inv scalar, or a block-scaled copy's grid
// buffer), an FP8 D its quantizer's scale and amax (`quantizers` may be null for a GEMM without
// per-tensor FP8).
template <typename BufferPointer>
GemmArgs gemm_args(const plan::GemmStep& step, const GemmDesc& desc, BufferPointer&& buffer_pointer,
                   const QuantizerState* quantizers) {
  GemmArgs args;
  args.a = buffer_pointer(step.a.buffer);
  args.b = buffer_pointer(step.b.buffer);
  args.d = buffer_pointer(step.d);
  if (desc.accumulate && step.c >= 0) args.c = buffer_pointer(step.c);
  if (epilogue_has_bias(desc.epilogue)) args.bias = buffer_pointer(step.bias);
  if (epilogue_has_aux(desc.epilogue)) args.aux = buffer_pointer(step.aux);
  // A block-scaled copy's scale_inv is its grid buffer; a per-tensor one the quantizer's scalar.
  if (step.a.scale_inv.buffer >= 0)
    args.a_scale_inv = static_cast<const float*>(buffer_pointer(step.a.scale_inv.buffer));
  if (step.b.scale_inv.buffer >= 0)
    args.b_scale_inv = static_cast<const float*>(buffer_pointer(step.b.scale_inv.buffer));
  if (quantizers != nullptr) {
    if (is_fp8(desc.a) && step.a.scale_inv.quantizer >= 0)
      args.a_scale_inv = quantizers->scale_inv(step.a.scale_inv.quantizer);
    if (is_fp8(desc.b) && step.b.scale_inv.quantizer >= 0)
      args.b_scale_inv = quantizers->scale_inv(step.b.scale_inv.quantizer);
    if (is_fp8(desc.d)) {
      args.d_scale = quantizers->scale(step.d_quantizer);
      args.d_amax = quantizers->amax(step.d_quantizer);
    }
  }
  return args;
}

}  // namespace opfuse::gpu
