// norm_cast: LayerNorm or RMSNorm whose output only feeds an FP8 cast -> one norm kernel that
// writes the FP8 copy (and the transposed copy when the cast makes one) and the amax (TE's
// layernorm/rmsnorm with an FP8 output quantizer).
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kNorms[] = {OpKind::LayerNorm, OpKind::RMSNorm};
constexpr OpKind kCast[] = {OpKind::CastFp8};
constexpr Step kSteps[] = {
    {.kinds = kNorms, .link = Link::Start},
    {.kinds = kCast, .link = Link::Consumes, .from = 0, .when = cast_can_fold},
};
}  // namespace

const FusionPattern& norm_cast() {
  static const FusionPattern p{"norm_cast", ir::Phase::Forward, kSteps, nullptr,
                               "norm + FP8 cast (+ amax, + transposed copy)"};
  return p;
}

}  // namespace opfuse::passes::fusion
