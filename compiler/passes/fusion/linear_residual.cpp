// linear_residual: linear (+ bias op) whose result only feeds add_extra_input -> one GEMM that
// accumulates into the residual (cuBLASLt beta = 1, C = the extra input), no separate add.
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kLinear[] = {OpKind::Linear};
constexpr OpKind kBias[] = {OpKind::Bias};
constexpr OpKind kAdd[] = {OpKind::AddExtraInput};
constexpr Step kSteps[] = {
    {.kinds = kLinear, .link = Link::Start},
    {.kinds = kBias, .link = Link::Consumes, .from = 0, .optional = true},
    {.kinds = kAdd, .link = Link::Consumes, .from = 1},
};
}  // namespace

const FusionPattern& linear_residual() {
  static const FusionPattern p{"linear_residual", ir::Phase::Forward, kSteps, nullptr,
                               "linear (+ bias) + add_extra_input as GEMM accumulation (beta = 1)"};
  return p;
}

}  // namespace opfuse::passes::fusion
