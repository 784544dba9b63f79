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

bool has_bias(const ir::Sequence&, const Match& m) {
  return m[1] != nullptr || ir::attr_bool(m[0]->attrs, "bias");
}

}  // namespace

const FusionPattern& linear_bias_gelu() {
  static const FusionPattern p{"linear_bias_gelu", ir::Phase::Forward, kSteps, has_bias,
                               "linear + bias + GELU as the GELU_AUX_BIAS epilogue"};
  return p;
}

}  // namespace opfuse::passes::fusion
