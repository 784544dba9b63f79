#include "ir/kernel_shapes.h"

#include <algorithm>
#include <array>

#include "ir/pointwise_ops.h"

namespace opfuse::ir {

namespace {

template <OpKind... Kinds>
bool one_of(OpKind k) {
  return ((k == Kinds) || ...);
}

bool is_alias(OpKind k) { return op_info(k).family == KernelFamily::Alias; }

// The GEMM epilogues: a bias, a residual accumulation (beta = 1), GELU_AUX_BIAS.
bool fprop_allows(OpKind k) {
  return has_gelu_epilogue(k) || one_of<OpKind::Linear, OpKind::Bias, OpKind::AddExtraInput>(k);
}
bool dgrad_allows(OpKind k) {
  return has_gelu_epilogue(k) || one_of<OpKind::LinearDgrad, OpKind::GradAdd, OpKind::BiasGrad>(k);
}
bool activation_forward_allows(OpKind k) {
  return is_pointwise(k) || one_of<OpKind::CastFp8, OpKind::TensorStats, OpKind::EmulatedCast>(k);
}
bool activation_backward_allows(OpKind k) {
  return is_pointwise_backward(k) ||
         one_of<OpKind::BiasGrad, OpKind::CastFp8, OpKind::TensorStats, OpKind::EmulatedCast>(k);
}

constexpr std::array kShapes = {
    KernelShapeInfo{KernelShape::Fprop, "fprop GEMM",
                    "linear with a bias, add_extra_input (beta = 1) or a GELU epilogue",
                    one_of<OpKind::Linear>, fprop_allows},
    KernelShapeInfo{KernelShape::Dgrad, "dgrad GEMM",
                    "linear_dgrad with grad_add (beta = 1) or a DGELU_BGRAD epilogue",
                    one_of<OpKind::LinearDgrad>, dgrad_allows},
    KernelShapeInfo{KernelShape::Wgrad, "wgrad GEMM", "linear_wgrad alone",
                    one_of<OpKind::LinearWgrad>, one_of<OpKind::LinearWgrad>},
    KernelShapeInfo{
        KernelShape::NormForward, "norm kernel",
        "layernorm or rmsnorm, cast_fp8 or an MXFP8 row-wise emulated_cast",
        one_of<OpKind::LayerNorm, OpKind::RMSNorm>,
        one_of<OpKind::LayerNorm, OpKind::RMSNorm, OpKind::CastFp8, OpKind::EmulatedCast>},
    KernelShapeInfo{KernelShape::NormBackward, "norm backward kernel",
                    "a norm's backward, grad_add",
                    one_of<OpKind::LayerNormBackward, OpKind::RMSNormBackward>,
                    one_of<OpKind::LayerNormBackward, OpKind::RMSNormBackward, OpKind::GradAdd>},
    KernelShapeInfo{KernelShape::RowForward, "row kernel", "a norm-like user op alone",
                    one_of<OpKind::UserNorm>, one_of<OpKind::UserNorm>},
    KernelShapeInfo{KernelShape::RowBackward, "row backward kernel",
                    "a norm-like user op's backward alone", one_of<OpKind::UserNormBackward>,
                    one_of<OpKind::UserNormBackward>},
    KernelShapeInfo{KernelShape::ActivationForward, "activation kernel",
                    "one pointwise op (built-in or user-defined), cast_fp8 or an MXFP8 row-wise "
                    "emulated_cast",
                    is_pointwise, activation_forward_allows},
    KernelShapeInfo{KernelShape::ActivationBackward, "activation backward kernel",
                    "one pointwise op's backward, bias_grad, cast_fp8 or an MXFP8 row-wise "
                    "emulated_cast",
                    is_pointwise_backward, activation_backward_allows},
    KernelShapeInfo{KernelShape::BiasAdd, "bias_add kernel",
                    "constant_scale first, then bias, add_extra_input or grad_add, cast_fp8",
                    one_of<OpKind::Bias, OpKind::AddExtraInput, OpKind::GradAdd>,
                    one_of<OpKind::ConstantScale, OpKind::Bias, OpKind::AddExtraInput,
                           OpKind::GradAdd, OpKind::CastFp8>},
    KernelShapeInfo{KernelShape::Cast, "cast kernel", "cast_fp8, bias_grad",
                    one_of<OpKind::CastFp8>,
                    one_of<OpKind::CastFp8, OpKind::BiasGrad, OpKind::TensorStats>},
    KernelShapeInfo{KernelShape::Fp8Transpose, "FP8 transpose", "fp8_transpose alone",
                    one_of<OpKind::Fp8Transpose>, one_of<OpKind::Fp8Transpose>},
    KernelShapeInfo{KernelShape::EmulatedCast, "emulated cast", "emulated_cast alone",
                    one_of<OpKind::EmulatedCast>, one_of<OpKind::EmulatedCast>},
    KernelShapeInfo{KernelShape::TensorStats, "statistics kernel", "tensor_stats alone",
                    one_of<OpKind::TensorStats>, one_of<OpKind::TensorStats>},
    KernelShapeInfo{KernelShape::TensorCapture, "capture copy", "tensor_capture alone",
                    one_of<OpKind::TensorCapture>, one_of<OpKind::TensorCapture>},
    KernelShapeInfo{KernelShape::Collective, "NCCL collective", "one collective alone",
                    one_of<OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter>,
                    one_of<OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter>},
    KernelShapeInfo{KernelShape::ModifyTensor, "modify_tensor", "modify_tensor alone",
                    one_of<OpKind::ModifyTensor>, one_of<OpKind::ModifyTensor>},
    KernelShapeInfo{KernelShape::Dbias, "dbias reduction", "bias_grad alone",
                    one_of<OpKind::BiasGrad>, one_of<OpKind::BiasGrad>},
    KernelShapeInfo{KernelShape::ConstantScale, "constant_scale kernel", "constant_scale alone",
                    one_of<OpKind::ConstantScale>, one_of<OpKind::ConstantScale>},
    KernelShapeInfo{KernelShape::Quantize, "quantize kernel", "quantize alone",
                    one_of<OpKind::Quantize>, one_of<OpKind::Quantize>},
    KernelShapeInfo{KernelShape::Dropout, "dropout kernel", "dropout alone",
                    one_of<OpKind::Dropout>, one_of<OpKind::Dropout>},
    KernelShapeInfo{KernelShape::DropoutBackward, "dropout backward kernel",
                    "dropout_backward alone", one_of<OpKind::DropoutBackward>,
                    one_of<OpKind::DropoutBackward>},
};

constexpr KernelShapeInfo kAlias{KernelShape::Alias, "alias", "aliases only (no kernel)", is_alias,
                                 is_alias};

}  // namespace

std::span<const KernelShapeInfo> kernel_shapes() { return kShapes; }

const KernelShapeInfo* select_kernel_shape(std::span<const OpKind> kinds) {
  if (!kinds.empty() && std::ranges::all_of(kinds, is_alias)) return &kAlias;
  for (const KernelShapeInfo& shape : kShapes)
    if (std::ranges::any_of(kinds, shape.selects)) return &shape;
  return nullptr;
}

bool kernel_shape_allows(std::span<const OpKind> kinds) {
  const KernelShapeInfo* shape = select_kernel_shape(kinds);
  return shape != nullptr && std::ranges::all_of(kinds, shape->allows);
}

}  // namespace opfuse::ir
