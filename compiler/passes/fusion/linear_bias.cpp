// linear_bias: a linear without its own bias followed by a bias op -> one GEMM with the BIAS
// epilogue (a linear with bias = true is that GEMM already).
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kLinear[] = {OpKind::Linear};
constexpr OpKind kBias[] = {OpKind::Bias};
bool no_own_bias(const ir::Sequence&, const ir::Operation& op) {
  return !ir::attr_bool(op.attrs, "bias");
}
constexpr Step kSteps[] = {
    {.kinds = kLinear, .link = Link::Start, .when = no_own_bias},
    {.kinds = kBias, .link = Link::Consumes, .from = 0},
};
}  // namespace

const FusionPattern& linear_bias() {
  static const FusionPattern p{"linear_bias", ir::Phase::Forward, kSteps, nullptr,
                               "linear + bias op through the GEMM's BIAS epilogue"};
  return p;
}

}  // namespace opfuse::passes::fusion
