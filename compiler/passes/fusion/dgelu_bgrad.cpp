// dgelu_bgrad: the backward of linear_bias_gelu's GELU folded into the dgrad GEMM of the next
// linear: cuBLASLt's DGELU_BGRAD epilogue multiplies by GELU'(aux) and sums the bias gradient
// (DGELU alone when the bias gradient is not there).
#include "ir/pointwise_ops.h"
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kDgrad[] = {OpKind::LinearDgrad};
constexpr OpKind kBiasGrad[] = {OpKind::BiasGrad};

// The backward of an op with cuBLASLt's GELU epilogue (gelu's), not the forward op itself.
bool is_gelu_backward(ir::OpKind kind) {
  return ir::is_pointwise_backward(kind) && ir::has_gelu_epilogue(kind);
}

constexpr Step kSteps[] = {
    {.kinds = kDgrad, .link = Link::Start},
    // The GELU gradient goes on to the previous linear's GEMMs: the epilogue writes it as D.
    {.is = is_gelu_backward, .link = Link::Consumes, .from = 0, .escapes_ok = true},
    {.kinds = kBiasGrad, .link = Link::Consumes, .from = 1, .optional = true},
};

// The epilogue reads the pre-activation as the aux buffer of a GELU_AUX_BIAS forward GEMM, and
// runs on 16-bit GEMMs only (cuBLASLt has no DGELU epilogue with FP8 operands; under current
// scaling the forward GELU epilogue forms on an FP8 GEMM, its backward must not).
bool aux_from_fused_forward(const ir::Sequence& s, const Match& m) {
  if (ir::dtype_is_fp8(s.value(m[0]->operands[0]).type.dtype)) return false;
  const int32_t producer = s.value(m[1]->operands[1]).producer;
  if (producer < 0) return false;
  const ir::Operation& forward = s.ops[size_t(producer)];
  return forward.kind == OpKind::Fused &&
         ir::attr_name(forward.attrs, "pattern") == "linear_bias_gelu" &&
         m[1]->operands[0] == m[0]->results[0];
}
}  // namespace

const FusionPattern& dgelu_bgrad() {
  static const FusionPattern p{"dgelu_bgrad", ir::Phase::Backward, kSteps, aux_from_fused_forward,
                               "dgrad + GELU backward (+ dbias) as the DGELU_BGRAD epilogue"};
  return p;
}

}  // namespace opfuse::passes::fusion
