// MXFP8 and NVFP4 quantized inputs and outputs on the GPU (docs/embedding.md, "Quantized
// tensors"; note "Quantized boundaries" in docs/architecture.md): a producer's codes, block scales
// and tensor scales bit for bit against cpu::quantize_tensor, opfuse::quantize and
// opfuse::dequantize against the reference (quantize -> set_tensor -> output -> dequantize), a
// consumer reading the copies against the reference consumer, the two-sequence MLP against the
// one-sequence MLP, and views refused before anything runs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/numerics.h"
#include "cpu/quantized_tensor.h"
#include "driver/compile.h"
#include "gpu_test_support.h"
#include "opfuse/program.h"
#include "reference/reference_executor.h"
#include "support/diagnostics.h"

namespace opfuse {
namespace {

constexpr int kTokens = 256;

// MXFP8, NVFP4 with the Hadamard transform of the column-wise copy, and without. Stochastic
// rounding (of gradients only) is off: its Philox streams follow the quantizers' indices, which a
// split changes.
const char* const kRecipes[] = {"mxfp8_block_scaling()",
                                "nvfp4_block_scaling(stochastic_rounding = false)",
                                "nvfp4_block_scaling(rht = false, stochastic_rounding = false)"};

bool is_nvfp4(const std::string& recipe) { return recipe.starts_with("nvfp4"); }

std::string source_of(const std::string& recipe) {
  const std::string h = is_nvfp4(recipe) ? "e2m1" : "e4m3";
  return "recipe r = " + recipe + "\nsequence q(x: bf16[tokens, 256]) -> (h: " + h +
         "[tokens, 256] quantized(rowwise, columnwise)) uses r {\n  quantize()\n}\n"
         "sequence c(h: " +
         h +
         "[tokens, 256] quantized(rowwise, columnwise)) -> (y: bf16[tokens, 128]) uses r {\n"
         "  linear(256, 128, bias = false) as down\n}\n"
         "sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 128]) uses r {\n"
         "  layernorm(256)\n  linear(256, 512, bias = false) as up\n  swiglu()\n"
         "  linear(256, 128, bias = false) as down\n}\n"
         "sequence fc1(x: bf16[tokens, 256]) -> (h: " +
         h +
         "[tokens, 256] quantized(rowwise, columnwise)) uses r {\n  layernorm(256)\n"
         "  linear(256, 512, bias = false) as up\n  swiglu()\n  quantize()\n}\n"
         "sequence fc2(h: " +
         h +
         "[tokens, 256] quantized(rowwise, columnwise)) -> (y: bf16[tokens, 128]) uses r {\n"
         "  linear(256, 128, bias = false) as down\n}\n";
}

cpu::ScaleLayout cpu_layout(ScaleLayout l) {
  return l == ScaleLayout::Nvfp4 ? cpu::ScaleLayout::Nvfp4 : cpu::ScaleLayout::Mxfp8;
}

class QuantizedMicroGpu : public test::GpuStreamTest {
 protected:
  void* upload_bf16(const std::vector<float>& values) {
    const test::DeviceArray& a = new_array(values.size() * 2);
    test::upload_bf16(a, values);
    return a.data();
  }
  std::vector<std::uint8_t> bytes(const void* device, std::size_t n) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return test::download_bytes(device, n);
  }
  float one_float(const float* device) {
    const std::vector<std::uint8_t> b = bytes(device, 4);
    float f = 0;
    std::memcpy(&f, b.data(), 4);
    return f;
  }
  cpu::QuantizedTensor download(const QuantizedTensorView& v, const QuantizedTensorInfo& info) {
    cpu::QuantizedTensor q;
    q.scales = cpu_layout(v.scales);
    q.rows = info.rows;
    q.cols = info.cols;
    q.rowwise = bytes(v.rowwise, info.rowwise_bytes);
    q.block_scales = bytes(v.scale_inv, static_cast<std::size_t>(info.scale_inv_entries));
    if (v.tensor_scale != nullptr) q.tensor_scale = one_float(v.tensor_scale);
    if (v.columnwise != nullptr) {
      q.columnwise = bytes(v.columnwise, info.rowwise_bytes);
      q.columnwise_block_scales = bytes(
          v.columnwise_scale_inv, static_cast<std::size_t>(info.columnwise_scale_inv_entries));
      if (v.columnwise_tensor_scale != nullptr)
        q.columnwise_tensor_scale = one_float(v.columnwise_tensor_scale);
    }
    return q;
  }
  QuantizedTensorView upload(const cpu::QuantizedTensor& q, const QuantizedTensorInfo& info) {
    QuantizedTensorView v;
    v.format = info.format;
    v.scales = info.scales;
    v.shape = info.shape;
    auto put = [&](const void* host, std::size_t n) {
      const test::DeviceArray& a = new_array(n);
      test::upload_bytes(a, host, n);
      return a.data();
    };
    v.rowwise = put(q.rowwise.data(), q.rowwise.size());
    v.scale_inv = put(q.block_scales.data(), q.block_scales.size());
    v.scale_inv_bytes = q.block_scales.size();
    if (!q.columnwise.empty()) {
      v.columnwise = put(q.columnwise.data(), q.columnwise.size());
      v.columnwise_scale_inv =
          put(q.columnwise_block_scales.data(), q.columnwise_block_scales.size());
      v.columnwise_scale_inv_bytes = q.columnwise_block_scales.size();
    }
    if (info.tensor_scales) {
      v.tensor_scale = static_cast<const float*>(put(&q.tensor_scale, 4));
      if (!q.columnwise.empty())
        v.columnwise_tensor_scale = static_cast<const float*>(put(&q.columnwise_tensor_scale, 4));
    }
    return v;
  }
  static QuantizedTensorInfo info_of(const Session& s, const std::string& name) {
    for (const QuantizedTensorInfo& i : s.quantized_tensors())
      if (i.name == name) return i;
    ADD_FAILURE() << "no quantized tensor " << name;
    return {};
  }
  static double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
      err += std::pow(double(got[i]) - want[i], 2);
      norm += std::pow(double(want[i]), 2);
    }
    return std::sqrt(err / std::max(norm, 1e-30));
  }
};

// A sequence's quantized output, opfuse::quantize's tensor and cpu::quantize_tensor agree byte for
// byte (codes, block scales, tensor scales); dequantize decodes either copy as the reference
// does; a consumer reading the copies computes what the reference consumer computes.
TEST_F(QuantizedMicroGpu, OutputsHelpersAndConsumersMatchTheReference) {
  std::mt19937_64 rng(5);
  const std::vector<float> x = test::random_bf16(kTokens * 256, 2.0, rng);
  const std::vector<float> w = test::random_bf16(128 * 256, 0.05, rng);
  void* input = upload_bf16(x);
  for (const char* recipe : kRecipes) {
    SCOPED_TRACE(recipe);
    const bool nvfp4 = is_nvfp4(recipe);
    const bool hadamard = nvfp4 && std::string(recipe).find("rht = false") == std::string::npos;
    const Program program = Program::compile(source_of(recipe), "micro.fuse");
    Session q(program, "q", stream_);
    q.bind({{"tokens", kTokens}});
    q.set_tensor("x", input);
    q.forward(stream_);
    const QuantizedTensorInfo info = info_of(q, "h");
    EXPECT_EQ(info.scales, nvfp4 ? ScaleLayout::Nvfp4 : ScaleLayout::Mxfp8);
    EXPECT_EQ(info.format, nvfp4 ? TensorDType::E2M1 : TensorDType::E4M3);
    EXPECT_EQ(info.tensor_scales, nvfp4);
    const cpu::QuantizedTensor want =
        cpu::quantize_tensor(x, kTokens, 256, cpu::Fp8Format::E4M3, cpu_layout(info.scales), true,
                             true, 1.0f, true, 0.0f, hadamard);
    const cpu::QuantizedTensor got = download(q.quantized_output("h"), info);
    EXPECT_EQ(got.rowwise, want.rowwise);
    EXPECT_EQ(got.columnwise, want.columnwise);
    EXPECT_EQ(got.block_scales, want.block_scales);
    EXPECT_EQ(got.columnwise_block_scales, want.columnwise_block_scales);
    EXPECT_EQ(got.tensor_scale, want.tensor_scale);
    EXPECT_EQ(got.columnwise_tensor_scale, want.columnwise_tensor_scale);

    // opfuse::quantize into the test's memory gives the same bytes.
    QuantizedTensorBuffers into;
    into.format = info.format;
    into.scales = info.scales;
    into.shape = {kTokens, 256};
    into.rowwise = new_array(info.rowwise_bytes).data();
    into.columnwise = new_array(info.rowwise_bytes).data();
    into.scale_inv_bytes = static_cast<std::size_t>(info.scale_inv_entries);
    into.scale_inv = new_array(into.scale_inv_bytes).data();
    into.columnwise_scale_inv_bytes = static_cast<std::size_t>(info.columnwise_scale_inv_entries);
    into.columnwise_scale_inv = new_array(into.columnwise_scale_inv_bytes).data();
    if (nvfp4) {
      into.tensor_scale = static_cast<float*>(new_array(4).data());
      into.columnwise_tensor_scale = static_cast<float*>(new_array(4).data());
    }
    QuantizeOptions options;
    options.hadamard = hadamard;
    quantize(input, into, stream_, options);
    const cpu::QuantizedTensor helper = download(into.view(), info);
    EXPECT_EQ(helper.rowwise, want.rowwise);
    EXPECT_EQ(helper.columnwise, want.columnwise);
    EXPECT_EQ(helper.block_scales, want.block_scales);
    EXPECT_EQ(helper.columnwise_block_scales, want.columnwise_block_scales);
    EXPECT_EQ(helper.tensor_scale, want.tensor_scale);
    EXPECT_EQ(helper.columnwise_tensor_scale, want.columnwise_tensor_scale);

    // Both copies decoded as stored, against the reference rounded to bf16.
    for (const bool columnwise : {false, true}) {
      void* out = new_array(kTokens * 256 * 2).data();
      dequantize(into.view(), out, stream_, columnwise);
      std::vector<float> ref = cpu::dequantize_tensor(want, columnwise);
      if (columnwise && nvfp4) {  // NVFP4's column-wise copy is stored [cols, rows]
        std::vector<float> stored(ref.size());
        for (std::int64_t r = 0; r < kTokens; ++r)
          for (std::int64_t c = 0; c < 256; ++c) stored[c * kTokens + r] = ref[r * 256 + c];
        ref = std::move(stored);
      }
      cpu::round_to_bf16(ref);
      EXPECT_EQ(test::download_bf16(out, kTokens * 256), ref)
          << (columnwise ? "column-wise" : "row-wise");
    }
    EXPECT_LT(relative_error(cpu::dequantize_tensor(want), x), nvfp4 ? 0.2 : 0.06);

    // The consumer, given the helper's copies, against the reference consumer.
    Session c(program, "c", stream_);
    c.bind({{"tokens", kTokens}});
    c.set_tensor("down.weight", upload_bf16(w));
    c.set_tensor("h", into.view());
    c.forward(stream_);
    const std::vector<float> y = test::download_bf16(c.output("y"), kTokens * 128);
    SourceManager sources;
    DiagnosticEngine diags(sources);
    driver::CompileOptions front;
    front.last_stage = driver::Stage::FrontEnd;
    const driver::CompileResult r =
        driver::compile_source("micro.fuse", source_of(recipe), sources, diags, front);
    cpu::ReferenceExecutor<float> ref(*r.program.find_sequence("c"), {{"tokens", kTokens}});
    ref.param("down.weight").data = w;
    ref.params_changed();
    ref.set_quantized_input(want);
    const std::vector<cpu::Tensor<float>> y_ref = ref.forward({cpu::Tensor<float>{}});
    // The same decoded operands in an emulated (bf16) GEMM and in the reference's fp32 one.
    EXPECT_LT(relative_error(y, y_ref[0].data), 4e-3);
  }
}

// fc1 -> fc2 through the micro-scaled boundary computes what the one-sequence MLP computes: the
// consumer decodes exactly the values the whole MLP's emulated casts decode, so every result
// agrees up to the GEMMs' algorithm choice (the operands sit at other addresses; see
// test_quantized_boundary_gpu.cpp); the CPU test proves the programs equal bit for bit.
TEST_F(QuantizedMicroGpu, SplitMlpEqualsWholeMlp) {
  std::mt19937_64 rng(9);
  for (const char* recipe : kRecipes) {
    SCOPED_TRACE(recipe);
    const Program program = Program::compile(source_of(recipe), "micro.fuse");
    Session whole(program, "mlp", stream_), fc1(program, "fc1", stream_),
        fc2(program, "fc2", stream_);
    for (Session* s : {&whole, &fc1, &fc2}) s->bind({{"tokens", kTokens}});
    whole.own_parameters(3, stream_);
    for (const std::string name : {"layernorm_0.weight", "layernorm_0.bias", "up.weight"})
      fc1.set_tensor(name, whole.parameter(name));
    fc2.set_tensor("down.weight", whole.parameter("down.weight"));
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE(step);
      void* x = upload_bf16(test::random_bf16(kTokens * 256, 1.0 + step, rng));
      void* dy = upload_bf16(test::random_bf16(kTokens * 128, 0.01, rng));
      whole.set_tensor("x", x);
      whole.set_tensor("dy", dy);
      fc1.set_tensor("x", x);
      fc2.set_tensor("dy", dy);
      whole.forward(stream_);
      fc1.forward(stream_);
      fc2.set_tensor("h", fc1.quantized_output("h"));
      fc2.forward(stream_);
      const auto compare = [&](const void* a, const void* b, std::size_t n, const char* what) {
        EXPECT_LT(relative_error(test::download_bf16(b, n), test::download_bf16(a, n)), 1e-2)
            << what;
      };
      compare(whole.output("y"), fc2.output("y"), kTokens * 128, "y");
      whole.backward(stream_);
      fc2.backward(stream_);
      fc1.set_tensor("dh", fc2.input_grad("h"));
      fc1.backward(stream_);
      compare(whole.input_grad("x"), fc1.input_grad("x"), kTokens * 256, "dx");
      compare(whole.param_grad("up.weight"), fc1.param_grad("up.weight"), 512 * 256, "d up");
      compare(whole.param_grad("down.weight"), fc2.param_grad("down.weight"), 128 * 256, "d down");
      for (Session* s : {&whole, &fc1, &fc2}) s->step(stream_);
    }
    fc1.forward(stream_, RunMode::Inference);
    const QuantizedTensorView v = fc1.quantized_output("h");
    EXPECT_EQ(v.columnwise, nullptr);
    EXPECT_EQ(v.columnwise_tensor_scale, nullptr);
    fc2.set_tensor("h", v);
    fc2.forward(stream_, RunMode::Inference);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    fc2.forward(stream_);
    EXPECT_THROW(fc2.backward(stream_), UsageError);
  }
}

// Micro-scaled views the consumer cannot read are refused before anything runs.
TEST_F(QuantizedMicroGpu, BadViewsAreUsageErrors) {
  for (const char* recipe : {kRecipes[0], kRecipes[1]}) {
    SCOPED_TRACE(recipe);
    const Program program = Program::compile(source_of(recipe), "micro.fuse");
    Session c(program, "c", stream_);
    c.bind({{"tokens", kTokens}});
    const QuantizedTensorInfo info = info_of(c, "h");
    std::mt19937_64 rng(1);
    const cpu::QuantizedTensor q = cpu::quantize_tensor(
        test::random_bf16(kTokens * 256, 1.0, rng), kTokens, 256, cpu::Fp8Format::E4M3,
        cpu_layout(info.scales), true, true, 1.0f, true, 0.0f, is_nvfp4(recipe));
    const QuantizedTensorView good = upload(q, info);
    auto refused = [&](QuantizedTensorView v, const std::string& words) {
      try {
        c.set_tensor("h", v);
        ADD_FAILURE() << "accepted a view that should fail with: " << words;
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    };
    QuantizedTensorView v = good;
    v.scale_inv = static_cast<const char*>(good.scale_inv) + 1;
    refused(v, "scale_inv pointer is not 16-byte aligned");
    v = good;
    v.scale_inv_bytes = good.scale_inv_bytes - 1;
    refused(v, "its scale_inv buffer holds");
    v = good;
    v.columnwise_scale_inv_bytes = 16;
    refused(v, "column-wise scale_inv buffer holds");
    v = good;
    v.scales = ScaleLayout::Block1x128;
    refused(v, "scales are");
    if (info.tensor_scales) {
      v = good;
      v.tensor_scale = nullptr;
      refused(v, "tensor_scale is null");
      v = good;
      v.columnwise_tensor_scale = nullptr;
      refused(v, "columnwise_tensor_scale is null");
    } else {
      v = good;
      v.tensor_scale = static_cast<const float*>(good.scale_inv);
      refused(v, "has no tensor scales");
    }
    EXPECT_THROW(c.set_tensor("h.scale_inv", good.scale_inv), UsageError);
    if (info.tensor_scales) {
      EXPECT_THROW(c.set_tensor("h.tensor_scale", good.tensor_scale), UsageError);
    }
    // quantize() and dequantize() refuse what their layout cannot take.
    QuantizedTensorView small = good;
    small.scale_inv_bytes = 1;
    EXPECT_THROW(dequantize(small, new_array(kTokens * 256 * 2).data(), stream_), UsageError);
    if (info.tensor_scales) {
      small = good;
      small.tensor_scale = nullptr;
      EXPECT_THROW(dequantize(small, new_array(kTokens * 256 * 2).data(), stream_), UsageError);
    }
    c.set_tensor("h", good);  // and the good one is taken
  }
}

}  // namespace
}  // namespace opfuse
