// cast_dbias: a gradient with no fusable producer that is both cast to FP8 and summed into a
// bias gradient -> one cast_transpose kernel with dbias partial sums (TE's cast_transpose_dbias).
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kBiasGrad[] = {OpKind::BiasGrad};
constexpr OpKind kCast[] = {OpKind::CastFp8};
constexpr Step kSteps[] = {
    {.kinds = kBiasGrad, .link = Link::Start},
    {.kinds = kCast, .link = Link::Sibling, .from = 0, .when = cast_can_fold},
};
}  // namespace

const FusionPattern& cast_dbias() {
  static const FusionPattern p{"cast_dbias", ir::Phase::Backward, kSteps, nullptr,
                               "FP8 cast + transpose + dbias of one gradient"};
  return p;
}

}  // namespace opfuse::passes::fusion
