// dact_cast: activation backward whose gradient feeds an FP8 cast (E5M2 under HYBRID) and maybe
// the bias gradient of the linear before it -> one activation-backward kernel writing the FP8
// gradient (+ transposed copy for wgrad), its amax and the dbias partial sums.
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kBiasGrad[] = {OpKind::BiasGrad};
constexpr OpKind kCast[] = {OpKind::CastFp8};
constexpr Step kSteps[] = {
    {.is = ir::is_pointwise_backward, .link = Link::Start, .stats_ok = true},
    {.kinds = kBiasGrad, .link = Link::Consumes, .from = 0, .optional = true},
    {.kinds = kCast, .link = Link::Consumes, .from = 0, .when = cast_can_fold},
};
}  // namespace

const FusionPattern& dact_cast() {
  static const FusionPattern p{
      "dact_cast", ir::Phase::Backward, kSteps, nullptr,
      "activation backward + FP8 cast of the gradient (+ amax, + transpose, + dbias)"};
  return p;
}

}  // namespace opfuse::passes::fusion
