// norm_cast: LayerNorm or RMSNorm whose output only feeds an FP8 cast -> one norm kernel that
// writes the FP8 copy (and the transposed copy when the cast makes one) and the amax (TE's
// layernorm/rmsnorm with an FP8 output quantizer).
// norm_block_cast: the same under float8_block_scaling (a 1 x 128 block cast) -> the norm kernel
// writes the row-wise copy and its scale grid; in training it also writes its output in 16 bits,
// from which a column-wise block cast makes the 128 x 1 copy (an inference forward runs the norm
// alone). TE leaves the norm and the block cast apart.
// norm_micro_cast: a norm whose output's MXFP8 row-wise copy is emulated (quantized in 1 x 32
// blocks and decoded back, for the BF16 GEMM that runs instead) -> the norm kernel writes the
// decoded copy; its output still goes to memory where another op reads it (the column-wise
// copy's cast, in training). NVFP4 cannot: its tensor scale needs the whole output's amax first.
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

bool block_1d(const ir::Sequence& seq, const ir::Operation& cast) {
  return cast.quantizer >= 0 && size_t(cast.quantizer) < seq.quantizers.size() &&
         seq.quantizers[size_t(cast.quantizer)].spec.scaling == plan::ScalingKind::Block1D;
}
constexpr Step kBlockSteps[] = {
    {.kinds = kNorms, .link = Link::Start},
    {.kinds = kCast, .link = Link::Consumes, .from = 0, .when = block_1d},
};

// The kernel's shapes (templates/norm.cuh, layernorm_block_fwd): rows a multiple of 128 wide,
// so every 1 x 128 block lies in one warp's lanes; the output in the input dtype (the value the
// cast quantizes).
bool block_kernel_fits(const ir::Sequence& seq, const Match& m) {
  const ir::Operation& norm = *m.front();
  const ir::TensorType& in = seq.value(norm.operands.at(0)).type;
  const ir::TensorType& out = seq.value(norm.results.at(0)).type;
  return out.dtype == in.dtype && ir::attr_int(norm.attrs, "size") % 128 == 0;
}

constexpr OpKind kEmulatedCast[] = {OpKind::EmulatedCast};
constexpr Step kMicroSteps[] = {
    {.kinds = kNorms, .link = Link::Start, .escapes_ok = true},
    {.kinds = kEmulatedCast, .link = Link::Consumes, .from = 0, .when = mxfp8_rowwise_decoded},
};

// templates/norm.cuh, layernorm_micro_fwd: rows a multiple of 32 wide (whole 1 x 32 blocks in
// consecutive lanes), the copy in the norm's output dtype, which is the input's.
bool micro_kernel_fits(const ir::Sequence& seq, const Match& m) {
  const ir::Operation& norm = *m.front();
  const ir::DType in = seq.value(norm.operands.at(0)).type.dtype;
  return seq.value(norm.results.at(0)).type.dtype == in &&
         seq.value(m.back()->results.at(0)).type.dtype == in &&
         ir::attr_int(norm.attrs, "size") % 32 == 0;
}
}  // namespace

const FusionPattern& norm_cast() {
  static const FusionPattern p{"norm_cast", ir::Phase::Forward, kSteps, nullptr,
                               "norm + FP8 cast (+ amax, + transposed copy)"};
  return p;
}

const FusionPattern& norm_block_cast() {
  static const FusionPattern p{"norm_block_cast", ir::Phase::Forward, kBlockSteps,
                               block_kernel_fits,
                               "norm + 1x128 block cast (row-wise copy; + 16-bit output for the "
                               "column-wise cast in training)"};
  return p;
}

const FusionPattern& norm_micro_cast() {
  static const FusionPattern p{"norm_micro_cast", ir::Phase::Forward, kMicroSteps,
                               micro_kernel_fits,
                               "norm + MXFP8 row-wise emulated cast (the decoded 1x32 copy; + the "
                               "output where the column-wise cast reads it)"};
  return p;
}

}  // namespace opfuse::passes::fusion
