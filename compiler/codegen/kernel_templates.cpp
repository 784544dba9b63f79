#include "codegen/kernel_templates.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <stdexcept>

#include "ir/pointwise_ops.h"
#include "ir/row_expr.h"

namespace opfuse::codegen {
namespace {

using ir::KernelFamily;
using Kind = TemplateParamKind;

// Parameter lists, in declaration order, as templates/README.md states them.
constexpr TemplateParam kNormFwdParams[] = {
    {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},
    {"kHidden", Kind::Int, ""},
    {"kZeroCenteredGamma", Kind::Bool, "false"},
    {"kWriteTranspose", Kind::Bool, "false"},
};
// Under float8_block_scaling: the 1 x 128 row-wise copy; kWriteColumnwiseSource also writes the
// output in the input dtype, which the column-wise block cast reads (dropped in inference).
constexpr TemplateParam kNormBlockFwdParams[] = {
    {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},
    {"kHidden", Kind::Int, ""},
    {"kZeroCenteredGamma", Kind::Bool, "false"},
    {"kWriteColumnwiseSource", Kind::Bool, "false"},
};
// Under mxfp8_block_scaling (emulated): the 1 x 32 row-wise copy decoded to Input; kFormat as
// micro_scale_cast's (0 E4M3, 1 E5M2); kWriteColumnwiseSource as above.
constexpr TemplateParam kNormMicroFwdParams[] = {
    {"Input", Kind::DType, ""},
    {"kFormat", Kind::Int, ""},
    {"kHidden", Kind::Int, ""},
    {"kZeroCenteredGamma", Kind::Bool, "false"},
    {"kWriteColumnwiseSource", Kind::Bool, "false"},
};
// A norm-like user-defined op's row programs (templates/row_expr.cuh): Fn is its generated
// functor (ir::row_functor_name), an Activation-kind argument as a pointwise op's.
constexpr TemplateParam kRowExprParams[] = {
    {"Fn", Kind::Activation, ""},
    {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},
};
constexpr TemplateParam kNormBwdParams[] = {
    {"Input", Kind::DType, ""},
    {"kHidden", Kind::Int, ""},
    {"kZeroCenteredGamma", Kind::Bool, "false"},
};
// kStats (common/elementwise_tile.cuh): statistics of the first input (1) and of the output as
// StatsAs (2) a debug config asked for, computed by the kernel that reads or writes the tensor.
constexpr TemplateParam kActivationFwdParams[] = {
    {"Act", Kind::Activation, ""}, {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},   {"kWriteTranspose", Kind::Bool, "false"},
    {"kStats", Kind::Int, "0"},    {"StatsAs", Kind::DType, "float"},
};
// Under mxfp8_block_scaling (emulated): the decoded 1 x 32 row-wise copy of the output (forward)
// or gradient (backward, the same parameters); kFormat as micro_scale_cast's (0 E4M3, 1 E5M2);
// kWriteColumnwiseSource also writes the output.
constexpr TemplateParam kActivationMicroParams[] = {
    {"Act", Kind::Activation, ""},
    {"Input", Kind::DType, ""},
    {"kFormat", Kind::Int, ""},
    {"kWriteColumnwiseSource", Kind::Bool, "false"},
};
constexpr TemplateParam kActivationBwdParams[] = {
    {"Act", Kind::Activation, ""},     {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},       {"kWriteTranspose", Kind::Bool, "false"},
    {"kDbias", Kind::Bool, "false"},   {"kStats", Kind::Int, "0"},
    {"StatsAs", Kind::DType, "float"},
};
constexpr TemplateParam kCastTransposeParams[] = {
    {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},
    {"kWriteTranspose", Kind::Bool, "true"},
    {"kDbias", Kind::Bool, "false"},
    {"kStats", Kind::Int, "0"},
};
constexpr TemplateParam kBlockCastParams[] = {
    {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},
    {"kTwoD", Kind::Bool, "false"},
    {"kWriteTranspose", Kind::Bool, "true"},
};
constexpr TemplateParam kBlockActivationFwdParams[] = {
    {"Act", Kind::Activation, ""},
    {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},
    {"kWriteTranspose", Kind::Bool, "true"},
};
constexpr TemplateParam kBlockActivationBwdParams[] = {
    {"Act", Kind::Activation, ""},   {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},     {"kWriteTranspose", Kind::Bool, "true"},
    {"kDbias", Kind::Bool, "false"},
};
// kBlocks: 0 1 x 128, 1 128 x 1, 2 128 x 128 (launch::kBlockRows / kBlockColumns / kBlockTiles).
constexpr TemplateParam kBlockFakeQuantizeParams[] = {
    {"Input", Kind::DType, ""},
    {"Fp8", Kind::DType, ""},
    {"kBlocks", Kind::Int, "0"},
};
// kFormat: 0 MXFP8 E4M3, 1 MXFP8 E5M2, 2 NVFP4 (launch::kMicroScaleE4M3/E5M2/E2M1).
constexpr TemplateParam kMicroScaleCastParams[] = {
    {"Input", Kind::DType, ""},           {"Output", Kind::DType, ""},
    {"kFormat", Kind::Int, ""},           {"kColumnwise", Kind::Bool, ""},
    {"kTwoD", Kind::Bool, "false"},       {"kRht", Kind::Bool, "false"},
    {"kStochastic", Kind::Bool, "false"}, {"kWriteCodes", Kind::Bool, "true"},
};
constexpr TemplateParam kBiasAddParams[] = {
    {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},
    {"kHasBias", Kind::Bool, "true"},
    {"kHasResidual", Kind::Bool, "false"},
    {"kWriteTranspose", Kind::Bool, "false"},
};
constexpr TemplateParam kConstantScaleParams[] = {
    {"Input", Kind::DType, ""},
    {"Output", Kind::DType, ""},
    {"kWriteTranspose", Kind::Bool, "false"},
};
// kWriteMask = false is the inference variant (y = x): add_inference_variants flips it as it
// flips kWriteTranspose, the mask being an output only backward reads.
constexpr TemplateParam kDropoutFwdParams[] = {
    {"T", Kind::DType, ""},
    {"kWriteMask", Kind::Bool, ""},
};
constexpr TemplateParam kFakeQuantizeParams[] = {
    {"Input", Kind::DType, ""},
    {"Fp8", Kind::DType, ""},
};
constexpr TemplateParam kInputOnlyParams[] = {{"Input", Kind::DType, ""}};
constexpr TemplateParam kFp8TransposeParams[] = {{"Fp8", Kind::DType, ""},
                                                 {"kWriteTranspose", Kind::Bool, "true"}};
constexpr TemplateParam kOutputOnlyParams[] = {{"Output", Kind::DType, ""}};
constexpr TemplateParam kScaleUpdateParams[] = {{"kThreads", Kind::Int, "256"}};
// Block summaries (runtime-owned: runtime/gpu/block_summaries.h instantiates them, no plan does).
constexpr TemplateParam kFloat8BlockSummaryParams[] = {
    {"Fp8", Kind::DType, ""},
    {"kTwoD", Kind::Bool, ""},
};
constexpr TemplateParam kDequantizeParams[] = {
    {"Fp8", Kind::DType, ""},
    {"Output", Kind::DType, ""},
    {"kBlocks", Kind::Int, ""},
};
constexpr TemplateParam kMicroDequantizeParams[] = {
    {"Output", Kind::DType, ""},
    {"kFormat", Kind::Int, ""},
    {"kColumnwise", Kind::Bool, ""},
};
constexpr TemplateParam kMicroBlockSummaryParams[] = {
    {"Input", Kind::DType, ""}, {"kFormat", Kind::Int, ""}, {"kColumnwise", Kind::Bool, ""},
    {"kTwoD", Kind::Bool, ""},  {"kRht", Kind::Bool, ""},
};
constexpr TemplateParam kStatsFinalParams[] = {{"kThreads", Kind::Int, "32"}};

constexpr KernelFamily kServesResidual[] = {KernelFamily::Residual};
// The merge of statistics that tiled kernels compute of the tensors they read or write (kStats).
constexpr KernelFamily kServesFusedStats[] = {KernelFamily::Activation,
                                              KernelFamily::GatedActivation, KernelFamily::Cast};
// Second stage of dgamma/dbeta (norm backward) and dbias (activation backward, cast, bias grad).
constexpr KernelFamily kServesColumnSums[] = {KernelFamily::Activation,
                                              KernelFamily::GatedActivation, KernelFamily::Bias,
                                              KernelFamily::Cast};

constexpr KernelFamily kServesLearnedSums[] = {KernelFamily::GatedActivation};

// Examples: README's where it has one (activation_fwd has none there).
constexpr std::string_view kLayerNormFwdExample[] = {"__nv_bfloat16", "__nv_bfloat16", "4096"};
constexpr std::string_view kRmsNormFwdExample[] = {"__nv_bfloat16", "__nv_fp8_e4m3", "4096",
                                                   "false", "true"};
constexpr std::string_view kNormBlockFwdExample[] = {"__nv_bfloat16", "__nv_fp8_e4m3", "4096",
                                                     "false", "true"};
constexpr std::string_view kNormMicroFwdExample[] = {"__nv_bfloat16", "0", "4096", "false", "true"};
constexpr std::string_view kLayerNormBwdExample[] = {"__half", "1000", "true"};
constexpr std::string_view kRmsNormBwdExample[] = {"__nv_bfloat16", "4096"};
constexpr std::string_view kRowExprExample[] = {"opfuse::ExampleRowL2", "__nv_bfloat16",
                                                "__nv_bfloat16"};
constexpr std::string_view kActivationFwdExample[] = {"opfuse::ExampleIdentity", "__nv_bfloat16",
                                                      "__nv_fp8_e4m3", "true"};
constexpr std::string_view kGatedActivationFwdExample[] = {
    "opfuse::ExampleProduct", "__nv_bfloat16", "__nv_fp8_e4m3", "true"};
constexpr std::string_view kActivationMicroFwdExample[] = {"opfuse::ExampleIdentity",
                                                           "__nv_bfloat16", "0", "true"};
constexpr std::string_view kGatedActivationMicroFwdExample[] = {"opfuse::ExampleProduct",
                                                                "__nv_bfloat16", "0", "true"};
constexpr std::string_view kActivationMicroBwdExample[] = {"opfuse::ExampleIdentity",
                                                           "__nv_bfloat16", "1", "true"};
constexpr std::string_view kGatedActivationMicroBwdExample[] = {"opfuse::ExampleProduct",
                                                                "__nv_bfloat16", "1", "true"};
constexpr std::string_view kActivationBwdExample[] = {"opfuse::ExampleIdentity", "__nv_bfloat16",
                                                      "__nv_bfloat16", "false", "true"};
constexpr std::string_view kGatedActivationBwdExample[] = {
    "opfuse::ExampleProduct", "__nv_bfloat16", "__nv_fp8_e5m2", "true", "true"};
constexpr std::string_view kCastTransposeExample[] = {"__nv_bfloat16", "__nv_fp8_e4m3", "true",
                                                      "false"};
constexpr std::string_view kBlockCastExample[] = {"__nv_bfloat16", "__nv_fp8_e4m3", "false",
                                                  "true"};
constexpr std::string_view kBlockActivationFwdExample[] = {"opfuse::ExampleIdentity",
                                                           "__nv_bfloat16", "__nv_fp8_e4m3"};
constexpr std::string_view kBlockGatedActivationFwdExample[] = {
    "opfuse::ExampleProduct", "__nv_bfloat16", "__nv_fp8_e4m3", "false"};
constexpr std::string_view kBlockActivationBwdExample[] = {
    "opfuse::ExampleIdentity", "__nv_bfloat16", "__nv_fp8_e5m2", "true", "true"};
constexpr std::string_view kBlockGatedActivationBwdExample[] = {"opfuse::ExampleProduct", "__half",
                                                                "__nv_fp8_e5m2", "true", "true"};
constexpr std::string_view kMicroScaleCastExample[] = {
    "__nv_bfloat16", "__nv_bfloat16", "2", "true", "false", "true", "true"};
constexpr std::string_view kBiasAddExample[] = {"__nv_bfloat16", "__nv_fp8_e4m3", "true", "true",
                                                "true"};
constexpr std::string_view kConstantScaleExample[] = {"__nv_bfloat16", "__nv_bfloat16"};
constexpr TemplateParam kDropoutBwdParams[] = {{"T", Kind::DType, ""}};
constexpr TemplateParam kDropoutStepParams[] = {{"kSteps", Kind::Int, "1"}};
constexpr std::string_view kDropoutFwdExample[] = {"__nv_bfloat16", "true"};
constexpr std::string_view kFakeQuantizeExample[] = {"__nv_bfloat16", "__nv_fp8_e4m3"};
constexpr std::string_view kBf16Example[] = {"__nv_bfloat16"};
constexpr std::string_view kFp8TransposeExample[] = {"__nv_fp8_e4m3", "true"};
constexpr std::string_view kStatsFinalExample[] = {"32"};
constexpr std::string_view kTensorStatsFinalExample[] = {"256"};
constexpr std::string_view kScaleUpdateExample[] = {"256"};
constexpr std::string_view kFinishCurrentExample[] = {"32"};
constexpr std::string_view kFloat8BlockSummaryExample[] = {"__nv_fp8_e4m3", "false"};
constexpr std::string_view kDequantizeExample[] = {"__nv_fp8_e4m3", "__nv_bfloat16", "1"};
constexpr std::string_view kMicroDequantizeExample[] = {"__nv_bfloat16", "2", "true"};
constexpr std::string_view kMicroBlockSummaryExample[] = {"__nv_bfloat16", "2", "true", "false",
                                                          "true"};

// One row of the table; also_serves last because most entries have none.
constexpr KernelTemplate entry(std::string_view name, std::string_view header, KernelFamily family,
                               std::string_view params_struct,
                               std::span<const TemplateParam> params,
                               std::span<const std::string_view> example_args,
                               std::span<const KernelFamily> also_serves = {}) {
  return {name, header, family, params_struct, params, also_serves, example_args};
}

constexpr KernelTemplate kTable[] = {
    entry("layernorm_fwd", "norm.cuh", KernelFamily::Norm, "NormFwdParams", kNormFwdParams,
          kLayerNormFwdExample),
    entry("rmsnorm_fwd", "norm.cuh", KernelFamily::Norm, "NormFwdParams", kNormFwdParams,
          kRmsNormFwdExample),
    entry("layernorm_block_fwd", "norm.cuh", KernelFamily::Norm, "NormBlockFwdParams",
          kNormBlockFwdParams, kNormBlockFwdExample),
    entry("rmsnorm_block_fwd", "norm.cuh", KernelFamily::Norm, "NormBlockFwdParams",
          kNormBlockFwdParams, kNormBlockFwdExample),
    entry("layernorm_micro_fwd", "norm.cuh", KernelFamily::Norm, "NormMicroFwdParams",
          kNormMicroFwdParams, kNormMicroFwdExample),
    entry("rmsnorm_micro_fwd", "norm.cuh", KernelFamily::Norm, "NormMicroFwdParams",
          kNormMicroFwdParams, kNormMicroFwdExample),
    entry("layernorm_bwd", "norm_backward.cuh", KernelFamily::Norm, "NormBwdParams", kNormBwdParams,
          kLayerNormBwdExample),
    entry("rmsnorm_bwd", "norm_backward.cuh", KernelFamily::Norm, "NormBwdParams", kNormBwdParams,
          kRmsNormBwdExample),
    entry("row_expr_fwd", "row_expr.cuh", KernelFamily::Norm, "RowExprFwdParams", kRowExprParams,
          kRowExprExample),
    entry("row_expr_bwd", "row_expr.cuh", KernelFamily::Norm, "RowExprBwdParams", kRowExprParams,
          kRowExprExample),
    entry("activation_fwd", "activation.cuh", KernelFamily::Activation, "ActivationFwdParams",
          kActivationFwdParams, kActivationFwdExample),
    entry("gated_activation_fwd", "activation.cuh", KernelFamily::GatedActivation,
          "ActivationFwdParams", kActivationFwdParams, kGatedActivationFwdExample),
    entry("activation_micro_fwd", "activation.cuh", KernelFamily::Activation,
          "ActivationMicroFwdParams", kActivationMicroParams, kActivationMicroFwdExample),
    entry("gated_activation_micro_fwd", "activation.cuh", KernelFamily::GatedActivation,
          "ActivationMicroFwdParams", kActivationMicroParams, kGatedActivationMicroFwdExample),
    entry("activation_bwd", "activation.cuh", KernelFamily::Activation, "ActivationBwdParams",
          kActivationBwdParams, kActivationBwdExample),
    entry("gated_activation_bwd", "activation.cuh", KernelFamily::GatedActivation,
          "ActivationBwdParams", kActivationBwdParams, kGatedActivationBwdExample),
    entry("activation_micro_bwd", "activation.cuh", KernelFamily::Activation,
          "ActivationMicroBwdParams", kActivationMicroParams, kActivationMicroBwdExample),
    entry("gated_activation_micro_bwd", "activation.cuh", KernelFamily::GatedActivation,
          "ActivationMicroBwdParams", kActivationMicroParams, kGatedActivationMicroBwdExample),
    entry("cast_transpose", "cast_transpose.cuh", KernelFamily::Cast, "CastParams",
          kCastTransposeParams, kCastTransposeExample),
    // The transposed copy of gathered FP8 codes (gather-fp8, tensor-parallel sequences).
    entry("fp8_transpose", "cast_transpose.cuh", KernelFamily::Cast, "Fp8TransposeParams",
          kFp8TransposeParams, kFp8TransposeExample),
    // Block scaling (float8_block_scaling): both copies and their scale grids in one pass.
    entry("block_cast_transpose", "block_cast.cuh", KernelFamily::Cast, "BlockCastParams",
          kBlockCastParams, kBlockCastExample),
    // Block scaling with the activation (forward, backward + dbias) fused: its output's copies.
    entry("block_activation_fwd", "block_activation.cuh", KernelFamily::Activation,
          "BlockActivationParams", kBlockActivationFwdParams, kBlockActivationFwdExample),
    entry("block_gated_activation_fwd", "block_activation.cuh", KernelFamily::GatedActivation,
          "BlockActivationParams", kBlockActivationFwdParams, kBlockGatedActivationFwdExample),
    entry("block_activation_bwd", "block_activation.cuh", KernelFamily::Activation,
          "BlockActivationParams", kBlockActivationBwdParams, kBlockActivationBwdExample),
    entry("block_gated_activation_bwd", "block_activation.cuh", KernelFamily::GatedActivation,
          "BlockActivationParams", kBlockActivationBwdParams, kBlockGatedActivationBwdExample),
    // The quantize op under block scaling (1 x 128 blocks), and Float8 block scaling emulated
    // (1 x 128, 128 x 1, 128 x 128): cast to FP8 and back in one pass.
    entry("block_fake_quantize", "block_fake_quantize.cuh", KernelFamily::Cast,
          "BlockFakeQuantizeParams", kBlockFakeQuantizeParams, kFakeQuantizeExample),
    // MXFP8 / NVFP4 emulated on Hopper: one copy's codes, scales and decoded values per launch.
    entry("micro_scale_cast", "micro_scale.cuh", KernelFamily::Cast, "MicroScaleParams",
          kMicroScaleCastParams, kMicroScaleCastExample),
    // The global amax of NVFP4's Hadamard-transformed columnwise copy (its S_enc).
    entry("micro_scale_rht_amax", "micro_scale.cuh", KernelFamily::Cast, "MicroScaleParams",
          kInputOnlyParams, kBf16Example),
    entry("bias_add", "bias.cuh", KernelFamily::Bias, "BiasAddParams", kBiasAddParams,
          kBiasAddExample, kServesResidual),
    entry("dbias_partial", "bias.cuh", KernelFamily::Bias, "DbiasParams", kInputOnlyParams,
          kBf16Example),
    entry("reduce_column_partials", "common/column_partials.cuh", KernelFamily::Norm,
          "ColumnPartialsParams", kOutputOnlyParams, kBf16Example, kServesColumnSums),
    // A scalar learned parameter's gradient: the sum of its column sums (a user-defined op's).
    entry("learned_scalar_sum", "activation.cuh", KernelFamily::Activation,
          "LearnedScalarSumParams", kOutputOnlyParams, kBf16Example, kServesLearnedSums),
    // Current scaling measures the amax before the cast; quantization is the Cast family.
    entry("amax_reduce", "amax.cuh", KernelFamily::Cast, "AmaxParams", kInputOnlyParams,
          kBf16Example),
    entry("update_scales", "scale_update.cuh", KernelFamily::Cast, "ScaleUpdateParams",
          kScaleUpdateParams, kScaleUpdateExample),
    // Current scaling over tensor-parallel ranks (runtime/gpu/quantizer_state.h, finish_current).
    entry("finish_current_scales", "scale_update.cuh", KernelFamily::Cast, "ScaleUpdateParams",
          kStatsFinalParams, kFinishCurrentExample),
    // Note "Block summaries": a block-scaled or micro-scaled copy summarized after its cast.
    entry("float8_block_summary", "block_summary.cuh", KernelFamily::Cast, "BlockSummaryParams",
          kFloat8BlockSummaryParams, kFloat8BlockSummaryExample),
    entry("micro_block_summary", "block_summary.cuh", KernelFamily::Cast, "BlockSummaryParams",
          kMicroBlockSummaryParams, kMicroBlockSummaryExample),
    // opfuse::dequantize (runtime/api/quantized_helpers.cpp): a quantized tensor decoded.
    entry("dequantize", "quantized_tensor.cuh", KernelFamily::Cast, "DequantizeParams",
          kDequantizeParams, kDequantizeExample),
    // An MXFP8 / NVFP4 quantized input's copy decoded for Hopper's GEMMs (note "Quantized
    // boundaries"), and opfuse::dequantize's micro-scaled tensors.
    entry("micro_dequantize", "quantized_tensor.cuh", KernelFamily::Cast, "MicroDequantizeParams",
          kMicroDequantizeParams, kMicroDequantizeExample),
    entry("constant_scale", "scale.cuh", KernelFamily::Scale, "ConstantScaleParams",
          kConstantScaleParams, kConstantScaleExample),
    // A debug config's statistics (compiler/passes/debug_instrument.h): partial records, merged.
    entry("tensor_stats_partial", "tensor_stats.cuh", KernelFamily::Stats, "TensorStatsParams",
          kInputOnlyParams, kBf16Example),
    entry("tensor_stats_final", "tensor_stats.cuh", KernelFamily::Stats, "TensorStatsFinalParams",
          kStatsFinalParams, kTensorStatsFinalExample, kServesFusedStats),
    // A debug config's tensor captures (DumpTensors, C++ features' inspect_tensor).
    entry("tensor_capture", "tensor_capture.cuh", KernelFamily::Stats, "TensorCaptureParams",
          kInputOnlyParams, kBf16Example),
    // LogFp8TensorStats (docs/debugging.md): one cast of a tensor measured, partials merged.
    entry("quant_stats_partial", "quant_stats.cuh", KernelFamily::Stats, "QuantStatsParams",
          kFakeQuantizeParams, kFakeQuantizeExample),
    entry("quant_stats_final", "quant_stats.cuh", KernelFamily::Stats, "QuantStatsFinalParams",
          kStatsFinalParams, kStatsFinalExample),
    // Dropout: the Philox mask drawn and saved as bits (forward), read back (backward).
    entry("dropout_fwd", "dropout.cuh", KernelFamily::Dropout, "DropoutFwdParams",
          kDropoutFwdParams, kDropoutFwdExample),
    entry("dropout_bwd", "dropout.cuh", KernelFamily::Dropout, "DropoutBwdParams",
          kDropoutBwdParams, kBf16Example),
    entry("dropout_advance_step", "dropout.cuh", KernelFamily::Dropout, "DropoutStepParams",
          kDropoutStepParams, {}),
    // The user quantize op (Cast family): cast to FP8 and back in one pass.
    entry("fake_quantize", "scale.cuh", KernelFamily::Cast, "FakeQuantizeParams",
          kFakeQuantizeParams, kFakeQuantizeExample),
};

constexpr std::array<ir::DType, 5> kDTypes = {ir::DType::BF16, ir::DType::FP16, ir::DType::FP32,
                                              ir::DType::E4M3, ir::DType::E5M2};
// The functors templates/activation.cuh defines itself (its contract's examples); the real ones
// are generated per op (ir::pointwise_functor_name / pointwise_functor_source).
constexpr std::string_view kActivationSpellings[] = {
    "opfuse::ExampleIdentity", "opfuse::ExampleProduct", "opfuse::ExampleRowL2"};

// A decimal int as C++ reads it: no leading zeros (those would be octal), no '+', fits in int.
bool is_decimal_int(std::string_view text) {
  const std::string_view digits = text.starts_with('-') ? text.substr(1) : text;
  if (digits.empty() || (digits.size() > 1 && digits.front() == '0')) return false;
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

bool fits_kind(TemplateParamKind kind, std::string_view arg) {
  switch (kind) {
    case Kind::DType:
      return parse_cuda_dtype_spelling(arg).has_value();
    case Kind::Activation:
      return std::ranges::find(kActivationSpellings, arg) != std::end(kActivationSpellings) ||
             ir::pointwise_functor_source(arg).has_value() ||
             ir::row_functor_source(arg).has_value();
    case Kind::Int:
      return is_decimal_int(arg);
    case Kind::Bool:
      return arg == "true" || arg == "false";
  }
  return false;
}

std::string_view expected_spelling(TemplateParamKind kind) {
  switch (kind) {
    case Kind::DType:
      return "one of __nv_bfloat16, __half, float, __nv_fp8_e4m3, __nv_fp8_e5m2";
    case Kind::Activation:
      return "a generated pointwise functor (opfuse::pointwise_<op>...) or "
             "opfuse::ExampleIdentity / opfuse::ExampleProduct";
    case Kind::Int:
      return "a decimal int";
    case Kind::Bool:
      return "true or false";
  }
  return "";
}

template <typename Arg>
std::string build_name_expression(const KernelTemplate& t, std::span<const Arg> args) {
  const auto required = static_cast<size_t>(std::ranges::count_if(
      t.params, [](const TemplateParam& p) { return p.default_value.empty(); }));
  if (args.size() < required || args.size() > t.params.size()) {
    throw std::invalid_argument(fmt::format(
        "opfuse::{} takes {} template argument{}, got {}", t.name,
        required == t.params.size() ? fmt::format("{}", required)
                                    : fmt::format("{} to {}", required, t.params.size()),
        t.params.size() == 1 ? "" : "s", args.size()));
  }
  std::string expression = fmt::format("opfuse::{}<", t.name);
  for (size_t i = 0; i < args.size(); ++i) {
    const TemplateParam& param = t.params[i];
    const std::string_view arg = args[i];
    if (!fits_kind(param.kind, arg)) {
      throw std::invalid_argument(
          fmt::format("opfuse::{}: template argument {} ({}) must be {}, got '{}'", t.name, i + 1,
                      param.name, expected_spelling(param.kind), arg));
    }
    if (i > 0) expression += ", ";
    expression += arg;
  }
  return expression + ">";
}

}  // namespace

std::string_view template_param_kind_name(TemplateParamKind kind) {
  switch (kind) {
    case Kind::DType:
      return "dtype";
    case Kind::Activation:
      return "activation";
    case Kind::Int:
      return "int";
    case Kind::Bool:
      return "bool";
  }
  return "?";
}

std::span<const KernelTemplate> kernel_templates() { return kTable; }

const KernelTemplate* find_kernel_template(std::string_view name) {
  const auto* it = std::ranges::find(kTable, name, &KernelTemplate::name);
  return it == std::end(kTable) ? nullptr : it;
}

std::vector<const KernelTemplate*> kernel_templates_for(ir::KernelFamily family) {
  std::vector<const KernelTemplate*> found;
  for (const KernelTemplate& t : kTable) {
    if (t.family == family || std::ranges::find(t.also_serves, family) != t.also_serves.end()) {
      found.push_back(&t);
    }
  }
  return found;
}

std::string name_expression(const KernelTemplate& t, std::span<const std::string> args) {
  return build_name_expression(t, args);
}

std::string name_expression(const KernelTemplate& t, std::span<const std::string_view> args) {
  return build_name_expression(t, args);
}

std::string_view cuda_dtype_spelling(ir::DType d) {
  switch (d) {
    case ir::DType::BF16:
      return "__nv_bfloat16";
    case ir::DType::FP16:
      return "__half";
    case ir::DType::FP32:
      return "float";
    case ir::DType::E4M3:
      return "__nv_fp8_e4m3";
    case ir::DType::E5M2:
      return "__nv_fp8_e5m2";
    case ir::DType::E2M1:
      return "__nv_fp4_e2m1";
    case ir::DType::E8M0:
      return "__nv_fp8_e8m0";
  }
  return "?";
}

std::optional<ir::DType> parse_cuda_dtype_spelling(std::string_view spelling) {
  for (const ir::DType d : kDTypes) {
    if (cuda_dtype_spelling(d) == spelling) return d;
  }
  return std::nullopt;
}

std::span<const std::string_view> activation_spellings() { return kActivationSpellings; }

}  // namespace opfuse::codegen
