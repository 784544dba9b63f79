// linear_bias_gelu: linear with a bias (its own or a following bias op), then GELU -> one GEMM
// with cuBLASLt's GELU_AUX_BIAS epilogue; the pre-activation leaves as the aux output that the
// GELU backward (or the DGELU_BGRAD epilogue) reads.
#include "ir/pointwise_ops.h"
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kLinear[] = {OpKind::Linear};
constexpr OpKind kBias[] = {OpKind::Bias};
bool gelu_forward(ir::OpKind kind) { return ir::is_pointwise(kind) && ir::has_gelu_epilogue(kind); }

constexpr Step kSteps[] = {
    // The pre-activation (the linear's or the bias op's result) is saved for the GELU backward:
    // it leaves the group as the epilogue's aux output.
    {.kinds = kLinear, .link = Link::Start, .escapes_ok = true},
    {.kinds = kBias, .link = Link::Consumes, .from = 0, .optional = true, .escapes_ok = true},
    // Ops cuBLASLt's GELU epilogue computes (the cublaslt_gelu_epilogue trait: gelu).
    {.is = gelu_forward, .link = Link::Consumes, .from = 1},
};

// cuBLASLt 13 has no block-scaled GEMM with the GELU_AUX_BIAS epilogue (its heuristic answers
// NOT_SUPPORTED on an H200, VEC128 x BLK128x128 included): under block scaling the GELU stays a
// kernel of its own.
bool epilogue_allowed(const ir::Sequence& seq, const ir::Operation& linear) {
  const int32_t w = seq.value(linear.operands.at(1)).quantizer;
  return w < 0 || seq.quantizers.at(size_t(w)).spec.per_tensor();
}

bool has_bias(const ir::Sequence& seq, const Match& m) {
  return (m[1] != nullptr || ir::attr_bool(m[0]->attrs, "bias")) && epilogue_allowed(seq, *m[0]);
}

}  // namespace

const FusionPattern& linear_bias_gelu() {
  static const FusionPattern p{"linear_bias_gelu", ir::Phase::Forward, kSteps, has_bias,
                               "linear + bias + GELU as the GELU_AUX_BIAS epilogue"};
  return p;
}

}  // namespace opfuse::passes::fusion
