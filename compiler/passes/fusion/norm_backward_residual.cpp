// norm_backward_residual: norm backward whose input gradient is summed with the gradient of the
// residual branch (make_extra_output) -> the norm backward kernel adds it (dresidual) as it
// writes dx, with no separate add.
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kNormBackward[] = {OpKind::LayerNormBackward, OpKind::RMSNormBackward};
constexpr OpKind kGradAdd[] = {OpKind::GradAdd};
constexpr Step kSteps[] = {
    {.kinds = kNormBackward, .link = Link::Start},
    {.kinds = kGradAdd, .link = Link::Consumes, .from = 0},
};
}  // namespace

const FusionPattern& norm_backward_residual() {
  static const FusionPattern p{"norm_backward_residual", ir::Phase::Backward, kSteps, nullptr,
                               "norm backward + accumulation of the residual gradient"};
  return p;
}

}  // namespace opfuse::passes::fusion
