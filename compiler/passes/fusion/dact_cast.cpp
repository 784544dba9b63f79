// dact_cast: activation backward whose gradient feeds an FP8 cast (E5M2 under HYBRID) and maybe
// the bias gradient of the linear before it -> one activation-backward kernel writing the FP8
// gradient (+ transposed copy for wgrad), its amax and the dbias partial sums.
// dact_micro_cast: activation backward whose gradient's MXFP8 row-wise copy is emulated -> the
// kernel writes the decoded copy, and the gradient where another op reads it (the column-wise
// copy's cast, the bias gradient). Built-in activations and user ops without learned parameters.
#include "ir/pointwise_ops.h"
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
constexpr OpKind kEmulatedCast[] = {OpKind::EmulatedCast};
constexpr Step kMicroSteps[] = {
    {.is = ir::is_pointwise_backward, .link = Link::Start, .escapes_ok = true},
    {.kinds = kEmulatedCast, .link = Link::Consumes, .from = 0, .when = mxfp8_rowwise_decoded},
};

// templates/activation.cuh, activation_micro_bwd: dy's width (one plane of the gradient) a
// multiple of 32, one dtype throughout, no learned parameters.
bool micro_kernel_fits(const ir::Sequence& seq, const Match& m) {
  const ir::Operation& act = *m.front();
  const ir::TensorType& dy = seq.value(act.operands.at(0)).type;
  const ir::PointwiseDef* def = ir::pointwise_def(act.kind);
  return def != nullptr && ir::user_params(*def, act.attrs).empty() && !dy.shape.empty() &&
         !dy.shape.back().is_symbolic() && dy.shape.back().size % 32 == 0 &&
         seq.value(act.operands.at(1)).type.dtype == dy.dtype &&
         seq.value(act.results.at(0)).type.dtype == dy.dtype &&
         seq.value(m.back()->results.at(0)).type.dtype == dy.dtype;
}
}  // namespace

const FusionPattern& dact_cast() {
  static const FusionPattern p{
      "dact_cast", ir::Phase::Backward, kSteps, nullptr,
      "activation backward + FP8 cast of the gradient (+ amax, + transpose, + dbias)"};
  return p;
}

const FusionPattern& dact_micro_cast() {
  static const FusionPattern p{"dact_micro_cast", ir::Phase::Backward, kMicroSteps,
                               micro_kernel_fits,
                               "activation backward + MXFP8 row-wise emulated cast of the gradient "
                               "(the decoded 1x32 copy; + the gradient where others read it)"};
  return p;
}

}  // namespace opfuse::passes::fusion
