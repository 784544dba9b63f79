// activation_block_cast, dact_block_cast: an activation (forward, or backward with the bias
// gradient of the linear before it) whose output only feeds a 1 x 128 block-scaled cast
// (float8_block_scaling's inputs and gradients) -> one kernel that writes the cast's row-wise and
// column-wise copies and their scale grids (templates/block_activation.cuh) instead of the
// activation's output in 16 bits, read back by the cast. TE leaves these unfused under block
// scaling. No statistics step: the block kernel computes none, so a statistics op reading the
// activation's output keeps it in memory and the pair unfused.
#include "ir/pointwise_ops.h"
#include "passes/fusion/patterns.h"

namespace opfuse::passes::fusion {

namespace {
using ir::OpKind;
constexpr OpKind kBiasGrad[] = {OpKind::BiasGrad};
constexpr OpKind kCast[] = {OpKind::CastFp8};

bool block_1d(const ir::Sequence& seq, const ir::Operation& cast) {
  return cast.quantizer >= 0 && size_t(cast.quantizer) < seq.quantizers.size() &&
         seq.quantizers[size_t(cast.quantizer)].spec.scaling == plan::ScalingKind::Block1D;
}

constexpr Step kForwardSteps[] = {
    {.is = ir::is_pointwise, .link = Link::Start},
    {.kinds = kCast, .link = Link::Consumes, .from = 0, .when = block_1d},
};
constexpr Step kBackwardSteps[] = {
    {.is = ir::is_pointwise_backward, .link = Link::Start},
    {.kinds = kBiasGrad, .link = Link::Consumes, .from = 0, .optional = true},
    {.kinds = kCast, .link = Link::Consumes, .from = 0, .when = block_1d},
};

// The kernel's shapes (block_activation.cuh): 2-byte inputs and output of one dtype, so the tile
// stays packed in registers and the values round to the dtype the unfused activation writes; the
// gated backward's plane width a multiple of 128, so no row block straddles d gate and d linear.
// A user-defined op with learned parameters runs in the tiled kernels only (which read its
// parameters and sum their gradients); its block cast stays a kernel of its own.
bool kernel_fits(const ir::Sequence& seq, const Match& m) {
  const ir::Operation& act = *m.front();
  if (!ir::user_params(*ir::pointwise_def(act.kind), act.attrs).empty()) return false;
  const ir::TensorType& out = seq.value(act.results.at(0)).type;
  for (ir::ValueId v : act.operands) {
    if (seq.value(v).type.dtype != out.dtype) return false;
  }
  if (ir::dtype_bytes(out.dtype) != 2 || out.shape.empty() || out.shape.back().is_symbolic())
    return false;
  const bool backward = ir::is_pointwise_backward(act.kind);
  if (backward && ir::pointwise_def(act.kind)->gated) {
    const ir::Dim& n = seq.value(act.operands.at(0)).type.shape.back();  // dy's width
    return !n.is_symbolic() && n.size % 128 == 0;
  }
  return true;
}

}  // namespace

const FusionPattern& activation_block_cast() {
  static const FusionPattern p{"activation_block_cast", ir::Phase::Forward, kForwardSteps,
                               kernel_fits,
                               "activation (gated or not) + 1x128 block cast (both copies)"};
  return p;
}

const FusionPattern& dact_block_cast() {
  static const FusionPattern p{
      "dact_block_cast", ir::Phase::Backward, kBackwardSteps, kernel_fits,
      "activation backward + 1x128 block cast of the gradient (both copies, + dbias)"};
  return p;
}

}  // namespace opfuse::passes::fusion
