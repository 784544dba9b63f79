// activation_cast: an activation (plain or gated) whose output only feeds an FP8 cast -> one
// activation kernel writing FP8 (+ transposed copy) and the amax.
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kCast[] = {OpKind::CastFp8};
constexpr Step kSteps[] = {
    {.is = ir::is_pointwise, .link = Link::Start, .stats_ok = true},
    {.kinds = kCast, .link = Link::Consumes, .from = 0, .when = cast_can_fold},
};
}  // namespace

const FusionPattern& activation_cast() {
  static const FusionPattern p{"activation_cast", ir::Phase::Forward, kSteps, nullptr,
                               "activation (gated or not) + FP8 cast (+ amax, + transpose)"};
  return p;
}

}  // namespace opfuse::passes::fusion
