// One compiled sequence on the GPU plan executor (runtime/gpu/plan_executor.h) and on the CPU
// reference executor, side by side (SideBySide): the same parameters and inputs on both, one
// training step at a time, with the relative error norms of the outputs and gradients, the FP8
// weight casts bit for bit and the quantizer state checked after every step. The fixture
// ExecutorGpu skips (visibly) where no GPU is present. Shared by test_executor_gpu.cpp (the
// dsl_examples programs) and test_activations_gpu.cpp (every activation, the user-defined ops).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codegen/plan.h"
#include "cpu/block_quantization.h"
#include "cpu/numerics.h"
#include "gpu/device.h"
#include "gpu/gemm.h"
#include "gpu/plan_executor.h"
#include "gpu_test_support.h"
#include "reference/reference_executor.h"

namespace opfuse::gpu::side_by_side {

using codegen::BufferRole;

// The recipes every program of these tests may name (`compile` picks one for all sequences).
constexpr const char* kRecipes = R"(
recipe delayed = delayed_scaling(format = hybrid, amax_history = 16, amax_compute = max, margin = 0)
recipe current = current_scaling(format = hybrid, power_of_2_scale = true)
recipe blocks = float8_block_scaling(format = hybrid)
recipe mxfp8 = mxfp8_block_scaling(format = hybrid)
recipe nvfp4 = nvfp4_block_scaling(seed = 3)
recipe nvfp4_no_rht = nvfp4_block_scaling(rht = false, w_2d = false, seed = 4)
)";

using test::DeviceArray;
using test::download_bf16;
using test::download_bytes;
using test::download_values;
using test::random_bf16;
using test::upload_bf16;
using test::upload_values;

// Every program here may use the recipes of kRecipes; `recipe` picks one for all its sequences.
// "blocks_emulated": `blocks` run emulated (note "Emulated block scaling" in
// docs/architecture.md: decoded copies, BF16 GEMMs), as on a GPU without cuBLASLt's block-scale
// modes.
inline std::unique_ptr<test::CompiledProgram> compile(const std::string& name,
                                                      const std::string& text,
                                                      const std::string& recipe) {
  if (recipe == "blocks_emulated") {
    driver::CompileOptions options;
    options.recipe = "blocks";
    options.emulate_block_scaling = true;
    return test::compile_program_with(name, std::string(kRecipes) + text, options);
  }
  return test::compile_program(name, std::string(kRecipes) + text, recipe);
}

inline double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

class ExecutorGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "skipping GPU executor tests: " << why;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    gemms_ = std::make_unique<GemmRunner>(stream_);
  }
  void TearDown() override {
    gemms_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GemmRunner> gemms_;
};

// ---- one sequence on the GPU and on the CPU reference, side by side -----------------------------

struct StepErrors {
  double outputs = 0, input_grads = 0, param_grads = 0;  // largest relative error norm of each kind
};

class SideBySide {
 public:
  SideBySide(const test::CompiledProgram& c, std::size_t sequence, const cpu::Bindings& bindings,
             GemmRunner& gemms, cudaStream_t stream, std::uint64_t seed)
      : seq_(c.program.sequences.at(sequence)),
        plan_(c.plan.sequences.at(sequence)),
        stream_(stream),
        gpu_(plan_, *c.modules, gemms, stream),
        ref_(seq_, bindings),
        rng_(seed) {
    gpu_.bind({bindings.begin(), bindings.end()});
    for (const TensorInfo& info : gpu_.tensors()) {
      if (info.role == BufferRole::Result) continue;
      arrays_.emplace(info.name, std::make_unique<DeviceArray>(info.bytes));
      gpu_.set_tensor(info.name, arrays_.at(info.name)->data());
    }
    for (const std::string& name : ref_.param_names()) {
      cpu::Tensor<float>& p = ref_.param(name);
      const bool matrix = p.shape.size() == 2;
      const bool bias = name.ends_with(".bias");
      const double fan_in = matrix ? double(p.shape[1]) : 1.0;
      p.data = matrix ? random_bf16(p.data.size(), 1.0 / std::sqrt(fan_in), rng_)
                      : random_bf16(p.data.size(), 0.1, rng_, bias ? 0.0 : 1.0);
    }
    // Uploaded before params_changed(): under fp8_weights the reference then shows the weights'
    // dequantized FP8 values, and both sides must cast (and take the amax of) the same values.
    upload_params();
    ref_.params_changed();
  }

  SequenceExecutor& gpu() { return gpu_; }
  cpu::ReferenceExecutor<float>& ref() { return ref_; }
  const DeviceArray& array(const std::string& name) const { return *arrays_.at(name); }

  void upload_params() {
    for (const std::string& name : ref_.param_names())
      upload_values(array(name), ref_.param(name).data, dtype_of(name, ""));
  }

  // Fresh random inputs on both sides; returns them in signature order.
  std::vector<cpu::Tensor<float>> new_inputs() {
    std::vector<cpu::Tensor<float>> inputs;
    const auto shapes = ref_.input_shapes();
    for (std::size_t i = 0; i < seq_.inputs.size(); ++i) {
      cpu::Tensor<float> t = cpu::Tensor<float>::zeros(shapes[i]);
      t.data = random_bf16(t.data.size(), 1.0, rng_);
      upload_bf16(array(tensor_name(seq_.inputs[i])), t.data);
      inputs.push_back(std::move(t));
    }
    return inputs;
  }

  // One training step on both; returns the error norms. Checks the FP8 weight casts bit for bit
  // and the quantizer state after the step.
  StepErrors train_step(int step, double lr, bool update_params = true) {
    StepErrors errors;
    const std::vector<cpu::Tensor<float>> inputs = new_inputs();
    const std::vector<cpu::Tensor<float>> ref_outputs = ref_.forward(inputs);
    gpu_.forward(stream_);
    for (std::size_t i = 0; i < seq_.outputs.size(); ++i) {
      const std::vector<float> got =
          download_bf16(gpu_.output(seq_.outputs[i].name), ref_outputs[i].data.size());
      errors.outputs = std::max(errors.outputs, relative_error(got, ref_outputs[i].data));
    }
    expect_weight_casts_bit_exact();

    std::vector<cpu::Tensor<float>> output_grads;
    for (std::size_t i = 0; i < seq_.output_grads.size(); ++i) {
      cpu::Tensor<float> dy = cpu::Tensor<float>::zeros(ref_outputs[i].shape);
      dy.data = random_bf16(dy.data.size(), 0.05, rng_);
      upload_bf16(array(tensor_name(seq_.output_grads[i])), dy.data);
      output_grads.push_back(std::move(dy));
    }
    const cpu::Gradients<float> ref_grads = ref_.backward(output_grads);
    gpu_.backward(stream_);
    for (std::size_t i = 0; i < seq_.inputs.size(); ++i) {
      const std::string name = seq_.value(seq_.inputs[i]).name;
      const std::vector<float> got =
          download_bf16(gpu_.input_grad(name), ref_grads.inputs[i].data.size());
      const double error = relative_error(got, ref_grads.inputs[i].data);
      errors.input_grads = std::max(errors.input_grads, error);
    }
    for (std::size_t j = 0; j < ref_.param_names().size(); ++j) {
      const std::string& name = ref_.param_names()[j];
      const std::vector<float> got = download_values(
          gpu_.param_grad(name), ref_grads.params[j].data.size(), dtype_of(name, "param_grad"));
      const double error = relative_error(got, ref_grads.params[j].data);
      if (error > errors.param_grads) worst_param_ = name;
      errors.param_grads = std::max(errors.param_grads, error);
    }
    gpu_.end_step(stream_);
    ref_.step();
    const std::vector<cpu::DelayedScalingState> quantizers = gpu_.download_quantizers(stream_);
    expect_quantizers_match(step, quantizers);
    anchor_quantizers(quantizers);
    if (!update_params) return errors;
    // Same new weights on both sides (the reference's update, rounded to bf16), given to both
    // before the reference casts them (under fp8_weights it keeps only the cast).
    for (std::size_t j = 0; j < ref_.param_names().size(); ++j) {
      cpu::Tensor<float>& p = ref_.param(ref_.param_names()[j]);
      for (std::size_t k = 0; k < p.data.size(); ++k)
        p.data[k] -= float(lr) * ref_grads.params[j].data[k];
    }
    upload_params();
    ref_.params_changed();
    gpu_.invalidate_weight_cache();
    weights_changed_ = true;
    return errors;
  }

  const std::string& worst_param() const { return worst_param_; }
  double worst_quantizer_error() const { return worst_quantizer_; }

 private:
  // The dtype of the executor's tensor `name`: the caller's (`result_kind` empty) or a result.
  plan::DType dtype_of(const std::string& name, const std::string& result_kind) const {
    for (const TensorInfo& info : gpu_.tensors())
      if (info.name == name && info.result_kind == result_kind) return info.dtype;
    ADD_FAILURE() << "no tensor " << name << " " << result_kind;
    return plan::DType::BF16;
  }

  // The executor's name of the caller's tensor holding IR value `value` (an output gradient's
  // value is named after its output, its buffer "%d<output>").
  std::string tensor_name(ir::ValueId value) const {
    for (const codegen::Buffer& buffer : plan_.buffers) {
      if (buffer.value == value && buffer.alias_of < 0) return buffer.name.substr(1);
    }
    ADD_FAILURE() << "no buffer holds value " << value;
    return {};
  }

  // A quantizer whose source is a tensor the caller gives (a weight, an input, an output
  // gradient) sees the same values on both sides: its amax and scale must agree to the bit.
  bool isolated(const codegen::QuantizerPlan& q) const {
    if (q.source_buffer < 0) return false;
    const codegen::Buffer& source = plan_.buffers[static_cast<std::size_t>(q.source_buffer)];
    return source.role == BufferRole::Input || source.role == BufferRole::Param ||
           source.role == BufferRole::OutputGrad;
  }

  void expect_quantizers_match(int step, const std::vector<cpu::DelayedScalingState>& got) {
    const std::vector<cpu::QuantizerInfo> want = ref_.quantizers();
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(got.size(), plan_.quantizers.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      const codegen::QuantizerPlan& q = plan_.quantizers[i];
      SCOPED_TRACE("step " + std::to_string(step) + ", quantizer " + q.name);
      ASSERT_EQ(want[i].name, q.name);
      ASSERT_EQ(got[i].amax_history.size(), want[i].amax_history.size());
      if (isolated(q)) {
        for (std::size_t k = 0; k < got[i].amax_history.size(); ++k) {
          EXPECT_TRUE(same_bits(got[i].amax_history[k], want[i].amax_history[k]))
              << "slot " << k << ": " << got[i].amax_history[k] << " vs "
              << want[i].amax_history[k];
        }
        EXPECT_TRUE(same_bits(got[i].scale, want[i].scale))
            << got[i].scale << " vs " << want[i].scale;
        EXPECT_TRUE(same_bits(got[i].scale_inv, want[i].scale_inv));
        continue;
      }
      // A computed source (a norm's or a GEMM's result) differs in rounding between cuBLASLt and
      // the CPU: its amax agrees to a few parts in a thousand (7.4e-3 at most, measured on an
      // H100); a power-of-2 scale to a factor 2.
      for (std::size_t k = 0; k < got[i].amax_history.size(); ++k) {
        const double a = got[i].amax_history[k], b = want[i].amax_history[k];
        const double error = std::abs(a - b) / std::max(std::abs(b), 1e-30);
        worst_quantizer_ = std::max(worst_quantizer_, error);
        EXPECT_LE(error, 2e-2) << "slot " << k << ": " << a << " vs " << b;
      }
      const double ratio = double(got[i].scale) / want[i].scale;
      const double allowed = q.spec.power_of_2_scale ? 2.0 : 1.02;
      EXPECT_TRUE(ratio <= allowed && ratio >= 1 / allowed)
          << got[i].scale << " vs " << want[i].scale;
    }
  }

  // After the comparison above, the reference takes the GPU's quantizer state, so each step's
  // errors measure that step's kernels. Left apart, a computed tensor's amax (its bf16 values
  // differ between cuBLASLt and the CPU in the last bit here and there) gives the next step's
  // delayed scale a relative difference d; the FP8 grid then moves by about 2^m * d of a step
  // (m mantissa bits) and that share of the values rounds the other way, by a whole step of the
  // grid. For E5M2 and d = 0.4-0.8% (one bf16 ulp of the amax) that is 2-5% of the gradient's
  // values, off by 12-25% each: a relative error of about 0.035 from two correct runs (measured:
  // the gated activation unfused under delayed scaling, where the fused kernel's fp32 amax
  // happened to agree).
  void anchor_quantizers(const std::vector<cpu::DelayedScalingState>& got) {
    std::vector<cpu::QuantizerInfo> states = ref_.quantizers();
    for (std::size_t i = 0; i < states.size() && i < got.size(); ++i) {
      if (!states[i].has_tensor_scale) continue;
      states[i].amax_history = got[i].amax_history;
      states[i].scale = got[i].scale;
      states[i].scale_inv = got[i].scale_inv;
    }
    ref_.set_quantizer_states(states);
  }

  // The FP8 copies of each weight (kept by the weight cache after forward) are fp8(W * scale)
  // with the scale the GPU held when it cast them (this step's; under fp8_weights the one at
  // the forward after the last parameter change), and the transposed copy is their transpose,
  // bit for bit.
  void expect_weight_casts_bit_exact() {
    if (plan_.quantizers.empty()) return;
    if (!seq_.fp8_weights || weights_changed_) cast_states_ = gpu_.download_quantizers(stream_);
    weights_changed_ = false;
    const std::vector<cpu::DelayedScalingState>& states = cast_states_;
    for (const codegen::Buffer& buffer : plan_.buffers) {
      if (buffer.quantizer < 0) continue;
      const codegen::QuantizerPlan& q =
          plan_.quantizers[static_cast<std::size_t>(buffer.quantizer)];
      if (q.role != ir::QuantizerRole::Weight) continue;
      SCOPED_TRACE("weight copy " + buffer.name + " of " + q.name);
      const std::string weight =
          plan_.buffers[static_cast<std::size_t>(q.source_buffer)].name.substr(1);
      const cpu::Tensor<float>& w = ref_.param(weight);
      const cpu::Fp8Format format =
          q.format() == ir::DType::E4M3 ? cpu::Fp8Format::E4M3 : cpu::Fp8Format::E5M2;
      if (!q.spec.per_tensor()) {
        expect_block_weight_copy(buffer, q, w, format);
        continue;
      }
      std::vector<std::uint8_t> want(w.data.size());
      cpu::quantize_fp8(w.data, states[static_cast<std::size_t>(q.index)].scale, format, want,
                        nullptr);
      const void* device = gpu_.debug_buffer(buffer.id);
      ASSERT_NE(device, nullptr) << "the weight cache keeps the FP8 copies";
      const std::vector<std::uint8_t> got = download_bytes(device, want.size());
      const std::int64_t rows = w.shape[0], cols = w.shape[1];
      std::size_t mismatches = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t col = 0; col < cols; ++col) {
          const std::size_t at = buffer.layout == plan::CopyLayout::Transposed
                                     ? std::size_t(col * rows + r)
                                     : std::size_t(r * cols + col);
          mismatches += got[at] != want[std::size_t(r * cols + col)];
        }
      }
      EXPECT_EQ(mismatches, 0u);
    }
  }

  // A block-scaled weight copy: its decoded values (codes times their block's scale_inv from the
  // copy's grid) equal the CPU oracle's block cast of the weight. Values, not codes: under
  // fp8_weights the reference holds the weight dequantized, whose re-cast may double a block's
  // power-of-2 scale and halve its codes, the same values.
  void expect_block_weight_copy(const codegen::Buffer& buffer, const codegen::QuantizerPlan& q,
                                const cpu::Tensor<float>& w, cpu::Fp8Format format) {
    cpu::BlockQuantParams params;
    params.format = format;
    params.two_d = q.spec.scaling == plan::ScalingKind::Block2D;
    params.power_of_2_scale = q.spec.power_of_2_scale;
    params.epsilon = static_cast<float>(q.spec.epsilon);
    const std::int64_t rows = w.shape[0], cols = w.shape[1];
    const cpu::BlockQuantizedCopy want =
        buffer.layout == plan::CopyLayout::Transposed
            ? cpu::block_quantize_columnwise(w.data, rows, cols, params)
            : cpu::block_quantize_rowwise(w.data, rows, cols, params);
    cpu::BlockQuantizedCopy got = want;
    got.data = download_bytes(gpu_.debug_buffer(buffer.id), want.data.size());
    ASSERT_GE(buffer.scale_inv.buffer, 0);
    const std::vector<std::uint8_t> grid =
        download_bytes(gpu_.debug_buffer(buffer.scale_inv.buffer), want.scale_inv.size() * 4);
    std::memcpy(got.scale_inv.data(), grid.data(), grid.size());
    const std::vector<float> got_values = cpu::block_dequantize(got, format, params.two_d);
    const std::vector<float> want_values = cpu::block_dequantize(want, format, params.two_d);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < want_values.size(); ++i)
      mismatches += std::memcmp(&got_values[i], &want_values[i], 4) != 0;
    EXPECT_EQ(mismatches, 0u);
  }

  const ir::Sequence& seq_;
  const codegen::SequencePlan& plan_;
  cudaStream_t stream_;
  SequenceExecutor gpu_;
  cpu::ReferenceExecutor<float> ref_;
  std::mt19937_64 rng_;
  std::map<std::string, std::unique_ptr<DeviceArray>> arrays_;
  std::string worst_param_;
  double worst_quantizer_ = 0;
  std::vector<cpu::DelayedScalingState> cast_states_;  // the quantizers when the weights were cast
  bool weights_changed_ = true;
};

// Bounds on the relative error norm ||gpu - cpu|| / ||cpu||. bf16: both sides compute in fp32 and
// round the same tensors to bf16 (2^-9 relative), so what remains is summation order inside GEMMs
// and norms and cuBLASLt's tanh GELU against the reference's formula: measured up to 4.5e-3 on an
// H100; 1e-2 leaves room. FP8: a bf16-level difference in a GEMM input moves some elements across
// an FP8 rounding boundary (E4M3 steps are 2^-3 relative, E5M2 2^-2), and fprop accumulates in
// the tensor cores' fast mode: measured up to 8.4e-3; 3e-2, a few percent, is the bound.
// The GPU and the reference differ where an input of a cast differs by a rounding (a norm or an
// activation computed in another order): the cast then moves that value by one step of the
// format. NVFP4's steps are a quarter to a half of a value's magnitude, so one flipped rounding
// costs more than FP8's; a wrong cast (wrong blocks, untransformed operands, other random bits)
// is off by O(1) or by the format's whole error (~0.2 relative under NVFP4).
inline double bound_for(const std::string& recipe) {
  return recipe == "bf16" ? 1e-2 : recipe.starts_with("nvfp4") ? 6e-2 : 3e-2;
}

}  // namespace opfuse::gpu::side_by_side
