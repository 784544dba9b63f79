// dgrad_residual: a linear's dgrad summed with another gradient of its input (add_extra_input's
// residual, a second use) -> the dgrad GEMM accumulates into it (beta = 1).
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kDgrad[] = {OpKind::LinearDgrad};
constexpr OpKind kGradAdd[] = {OpKind::GradAdd};
constexpr Step kSteps[] = {
    {.kinds = kDgrad, .link = Link::Start},
    {.kinds = kGradAdd, .link = Link::Consumes, .from = 0},
};
}  // namespace

const FusionPattern& dgrad_residual() {
  static const FusionPattern p{"dgrad_residual", ir::Phase::Backward, kSteps, nullptr,
                               "linear dgrad + gradient accumulation as GEMM beta = 1"};
  return p;
}

}  // namespace opfuse::passes::fusion
