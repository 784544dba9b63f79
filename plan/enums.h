// The closed vocabularies of the plan (docs/codegen.md, "plan.json"): every value the compiler
// writes and the runtime reads is one of these enums, printed and parsed through one name table
// each, so a spelling exists in exactly one place and an unknown spelling in a plan.json is an
// error naming the field, never a silent default.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace opfuse::plan {

// Element types of tensors (the IR's dtypes: ir/types.h aliases this one).
// E2M1 (NVFP4's 4-bit values) is a quantizer's format, and the dtype of an NVFP4 quantized
// boundary's copies (note "Quantized boundaries" in docs/architecture.md), whose codes are packed
// two per byte (runtime/cpu/micro_scaling.h; buffer_bytes below); on Hopper a GEMM reads the
// decoded values. E8M0 (a power of 2, one byte) is only the dtype of MXFP8's block scales.
enum class DType : uint8_t { BF16, FP16, FP32, E4M3, E5M2, E2M1, E8M0 };
constexpr int dtype_bytes(DType t) {
  return t == DType::FP32 ? 4 : t == DType::BF16 || t == DType::FP16 ? 2 : 1;
}
inline bool dtype_is_fp8(DType t) { return t == DType::E4M3 || t == DType::E5M2; }
// Bytes of `elements` values of dtype t in memory: E2M1 codes are packed two per byte.
constexpr int64_t buffer_bytes(DType t, int64_t elements) {
  return t == DType::E2M1 ? (elements + 1) / 2 : elements * dtype_bytes(t);
}

// Forward ops run in forward(); backward ops (made by build-backward) in backward().
enum class Phase : uint8_t { Forward, Backward };

// Which GEMM operand (or quantize op tensor) a quantizer serves, in TE's names.
enum class QuantizerRole : uint8_t { Input, Weight, GradOutput, Output, GradInput };

enum class BufferRole : uint8_t {
  Input,       // a sequence input (the caller's)
  Param,       // a parameter (the caller's)
  OutputGrad,  // the gradient of a sequence output, given to backward (the caller's)
  Result,      // made by a step
  Workspace,   // scratch of one group (dbias/dgamma partial sums)
};

// What a buffer is to the caller of the sequence: read back after forward or backward.
enum class InterfaceKind : uint8_t { Output, InputGrad, ParamGrad };

enum class GemmRole : uint8_t { Fprop, Dgrad, Wgrad };

// What cuBLASLt does after the product (the fusions TE makes through its epilogues).
// A collective step's operation over the tensor-parallel group (CollectiveStep).
enum class CollectiveKind : uint8_t { AllReduce, AllGather, ReduceScatter };

enum class GemmEpilogue : uint8_t {
  None,           // D = A B
  Bias,           // D = A B + bias[n] (added to every row)
  GeluAuxBias,    // aux = A B + bias[n] (output: the pre-activation backward needs); D = gelu(aux)
  DGelu,          // D = (A B) * gelu'(aux), aux an input (the forward pre-activation)
  DGeluBiasGrad,  // as DGelu, and bias[n] = sum of D over its m rows (output)
  BiasGradA,      // D = A B, and bias[m] = sum over k of op(A) (output): wgrad's dbias, the sum of
                  // dy over tokens (cuBLASLt's BGRADB: its B operand is our A)
};
bool epilogue_has_aux(GemmEpilogue e);      // GeluAuxBias, DGelu, DGeluBiasGrad
bool epilogue_has_bias(GemmEpilogue e);     // Bias, GeluAuxBias (read); DGeluBiasGrad, BiasGradA
bool epilogue_writes_bias(GemmEpilogue e);  // DGeluBiasGrad, BiasGradA
bool epilogue_writes_aux(GemmEpilogue e);   // GeluAuxBias

// The device state of one quantizer a kernel or GEMM is given (templates/README.md, "Quantizer
// records"): Amax is the slot a producing kernel raises (delayed: history slot 0; current: the
// record's single amax); RunningAmax the amax a current-scaling producer measures before the
// scale is derived from it; GemmScaleInv the scale_inv the GEMMs read with the quantizer's copies:
// ScaleInv, except for an FP8 weight kept across steps (`with fp8_weights`), whose copy keeps the
// scale_inv it was cast with (note "Weight cache" in runtime/gpu/plan_executor.cpp).
// Measurements: the count of a current-scaling (or NVFP4) quantizer's measurements, the step of
// NVFP4's stochastic rounding (templates/common/quantizer_record.cuh, word 3).
enum class QuantizerValue : uint8_t {
  Scale,
  ScaleInv,
  Amax,
  RunningAmax,
  GemmScaleInv,
  Measurements
};

// How a quantizer turns amax into a scale (note "Quantization specs" in docs/architecture.md).
enum class ScalingKind : uint8_t {
  Delayed,      // TE DelayedScaling: from an amax history, updated after the step
  Current,      // TE Float8CurrentScaling: from this tensor's amax, before its cast
  Block1D,      // one scale per 1 x N block (TE Float8BlockScaling 1x128)
  Block2D,      // one scale per N x N block (TE Float8BlockScaling 128x128 weights)
  MicroScaled,  // MXFP8 / NVFP4: small blocks with E8M0 / E4M3 scales
};
enum class AmaxCompute : uint8_t { Max, MostRecent };
enum class ScaleDType : uint8_t { FP32, E8M0, E4M3 };

// Which copy of a quantized tensor: the row-wise one GEMMs read with K along rows, or the
// column-wise one (K along columns of the source), kept apart from how the copy is laid out.
enum class CopyUsage : uint8_t { Rowwise, Columnwise };
// How a copy is stored relative to its source: as is, or transposed ([k, rows...]), which is how
// Hopper's TN-only FP8 GEMMs take a column-wise copy.
enum class CopyLayout : uint8_t { AsIs, Transposed };

// What one field of a kernel's params struct is bound to.
enum class ParamKind : uint8_t {
  Null,       // nullptr / unused
  Buffer,     // buffers[0]
  Buffers,    // an array field (reduce_column_partials' partials/outputs); -1 = nullptr
  Quantizer,  // a device scalar of a quantizer (QuantizerValue)
  Records,    // a device array of QuantizerRecord for the listed quantizers
  Int,        // a 4-byte int field
  Int64,      // a `long long` field (amax_reduce's element count)
  Float,
  StatRecord,  // the executor's statistics record of a slot (SequencePlan::stat_slots)
  Capture,     // the executor's float32 capture of a slot (SequencePlan::capture_slots)
  // The executor's training-step counter (an unsigned int in device memory, 0 at the first step,
  // advanced by end_step()): dropout's Philox counter reads it at run time, so a recorded graph
  // draws a fresh mask every step (note "Dropout" in docs/language.md).
  DropoutStep,
};

// The name table of an enum: its values in order with their plan.json spellings.
template <typename Enum>
struct EnumNames;

#define OPFUSE_ENUM_NAMES(Enum, ...)                                             \
  template <>                                                                    \
  struct EnumNames<Enum> {                                                       \
    static constexpr std::pair<Enum, std::string_view> kNames[] = {__VA_ARGS__}; \
  };

OPFUSE_ENUM_NAMES(DType, {DType::BF16, "bf16"}, {DType::FP16, "fp16"}, {DType::FP32, "fp32"},
                  {DType::E4M3, "e4m3"}, {DType::E5M2, "e5m2"}, {DType::E2M1, "e2m1"},
                  {DType::E8M0, "e8m0"})
OPFUSE_ENUM_NAMES(Phase, {Phase::Forward, "forward"}, {Phase::Backward, "backward"})
OPFUSE_ENUM_NAMES(QuantizerRole, {QuantizerRole::Input, "input"}, {QuantizerRole::Weight, "weight"},
                  {QuantizerRole::GradOutput, "grad_output"}, {QuantizerRole::Output, "output"},
                  {QuantizerRole::GradInput, "grad_input"})
OPFUSE_ENUM_NAMES(BufferRole, {BufferRole::Input, "input"}, {BufferRole::Param, "param"},
                  {BufferRole::OutputGrad, "output_grad"}, {BufferRole::Result, "result"},
                  {BufferRole::Workspace, "workspace"})
OPFUSE_ENUM_NAMES(InterfaceKind, {InterfaceKind::Output, "output"},
                  {InterfaceKind::InputGrad, "input_grad"},
                  {InterfaceKind::ParamGrad, "param_grad"})
OPFUSE_ENUM_NAMES(GemmRole, {GemmRole::Fprop, "fprop"}, {GemmRole::Dgrad, "dgrad"},
                  {GemmRole::Wgrad, "wgrad"})
OPFUSE_ENUM_NAMES(CollectiveKind, {CollectiveKind::AllReduce, "all_reduce"},
                  {CollectiveKind::AllGather, "all_gather"},
                  {CollectiveKind::ReduceScatter, "reduce_scatter"})
OPFUSE_ENUM_NAMES(GemmEpilogue, {GemmEpilogue::None, "none"}, {GemmEpilogue::Bias, "bias"},
                  {GemmEpilogue::GeluAuxBias, "gelu_aux_bias"}, {GemmEpilogue::DGelu, "dgelu"},
                  {GemmEpilogue::DGeluBiasGrad, "dgelu_bias_grad"},
                  {GemmEpilogue::BiasGradA, "bias_grad_a"})
OPFUSE_ENUM_NAMES(QuantizerValue, {QuantizerValue::Scale, "scale"},
                  {QuantizerValue::ScaleInv, "scale_inv"}, {QuantizerValue::Amax, "amax"},
                  {QuantizerValue::RunningAmax, "running_amax"},
                  {QuantizerValue::Measurements, "measurements"},
                  {QuantizerValue::GemmScaleInv, "gemm_scale_inv"})
OPFUSE_ENUM_NAMES(ScalingKind, {ScalingKind::Delayed, "delayed"}, {ScalingKind::Current, "current"},
                  {ScalingKind::Block1D, "block_1d"}, {ScalingKind::Block2D, "block_2d"},
                  {ScalingKind::MicroScaled, "micro_scaled"})
OPFUSE_ENUM_NAMES(AmaxCompute, {AmaxCompute::Max, "max"}, {AmaxCompute::MostRecent, "most_recent"})
OPFUSE_ENUM_NAMES(ScaleDType, {ScaleDType::FP32, "fp32"}, {ScaleDType::E8M0, "e8m0"},
                  {ScaleDType::E4M3, "e4m3"})
OPFUSE_ENUM_NAMES(CopyUsage, {CopyUsage::Rowwise, "rowwise"}, {CopyUsage::Columnwise, "columnwise"})
OPFUSE_ENUM_NAMES(CopyLayout, {CopyLayout::AsIs, "as_is"}, {CopyLayout::Transposed, "transposed"})
OPFUSE_ENUM_NAMES(ParamKind, {ParamKind::Null, "null"}, {ParamKind::Buffer, "buffer"},
                  {ParamKind::Buffers, "buffers"}, {ParamKind::Quantizer, "quantizer"},
                  {ParamKind::Records, "quantizer_records"}, {ParamKind::Int, "int"},
                  {ParamKind::Int64, "int64"}, {ParamKind::Float, "float"},
                  {ParamKind::StatRecord, "stat_record"}, {ParamKind::Capture, "capture"},
                  {ParamKind::DropoutStep, "dropout_step"})
#undef OPFUSE_ENUM_NAMES

// The spelling of `value` ("?" for a value outside the table, which a cast from an int can make).
template <typename Enum>
constexpr std::string_view name(Enum value) {
  for (const auto& [v, n] : EnumNames<Enum>::kNames)
    if (v == value) return n;
  return "?";
}

// The value spelled `text`; nullopt when no value is.
template <typename Enum>
constexpr std::optional<Enum> parse(std::string_view text) {
  for (const auto& [v, n] : EnumNames<Enum>::kNames)
    if (n == text) return v;
  return std::nullopt;
}

// Every value, in declaration order.
template <typename Enum>
constexpr auto all_values() {
  constexpr auto& names = EnumNames<Enum>::kNames;
  std::array<Enum, std::size(names)> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = names[i].first;
  return out;
}

inline constexpr std::string_view dtype_name(DType t) { return name(t); }
inline constexpr std::string_view phase_name(Phase p) { return name(p); }
inline constexpr std::string_view quantizer_role_name(QuantizerRole r) { return name(r); }

}  // namespace opfuse::plan
