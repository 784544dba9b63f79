// activation_cast: an activation (plain or gated) whose output only feeds an FP8 cast -> one
// activation kernel writing FP8 (+ transposed copy) and the amax.
// activation_micro_cast: an activation whose output's MXFP8 row-wise copy is emulated (quantized
// in 1 x 32 blocks and decoded back, for the BF16 GEMM that runs instead) -> the activation kernel
// writes the decoded copy; its output still goes to memory where another op reads it (the
// column-wise copy's cast, in training).
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kCast[] = {OpKind::CastFp8};
constexpr Step kSteps[] = {
    {.is = ir::is_pointwise, .link = Link::Start, .stats_ok = true},
    {.kinds = kCast, .link = Link::Consumes, .from = 0, .when = cast_can_fold},
};
constexpr OpKind kEmulatedCast[] = {OpKind::EmulatedCast};
constexpr Step kMicroSteps[] = {
    {.is = ir::is_pointwise, .link = Link::Start, .escapes_ok = true},
    {.kinds = kEmulatedCast, .link = Link::Consumes, .from = 0, .when = mxfp8_rowwise_decoded},
};

// templates/activation.cuh, activation_micro_fwd: the output 32-multiple wide (whole 1 x 32
// blocks in consecutive lanes), all of one dtype (the copy is the output's, decoded).
bool micro_kernel_fits(const ir::Sequence& seq, const Match& m) {
  const ir::Operation& act = *m.front();
  const ir::TensorType& out = seq.value(act.results.at(0)).type;
  return !out.shape.empty() && !out.shape.back().is_symbolic() && out.shape.back().size % 32 == 0 &&
         seq.value(act.operands.at(0)).type.dtype == out.dtype &&
         seq.value(m.back()->results.at(0)).type.dtype == out.dtype;
}
}  // namespace

const FusionPattern& activation_cast() {
  static const FusionPattern p{"activation_cast", ir::Phase::Forward, kSteps, nullptr,
                               "activation (gated or not) + FP8 cast (+ amax, + transpose)"};
  return p;
}

const FusionPattern& activation_micro_cast() {
  static const FusionPattern p{"activation_micro_cast", ir::Phase::Forward, kMicroSteps,
                               micro_kernel_fits,
                               "activation (gated or not) + MXFP8 row-wise emulated cast (the "
                               "decoded 1x32 copy; + the output where the column-wise cast reads "
                               "it)"};
  return p;
}

}  // namespace opfuse::passes::fusion
