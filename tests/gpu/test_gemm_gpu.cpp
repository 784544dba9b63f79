// cuBLASLt GEMMs through GemmRunner against the CPU reference (OpenBLAS, fp32): BF16 and FP8
// fprop/dgrad/wgrad at several shapes, FP8 output codes and amax_D, the epilogues, accumulation,
// and the checks that reject bad descs and pointers before launching. Label `gpu`: skips
// (visibly) where no GPU is present.
//
// Tolerances. Every FP8 operand is quantized on the host (runtime/cpu/numerics.h) and the
// reference multiplies the exact dequantized values, so GPU and reference differ only by
// accumulation order/precision and the rounding of D. Per element we allow
//   |gpu - ref| <= 2^-8 |ref| + acc * L1,   L1 = sum over k of |a_ik b_kj| (scaled)
// 2^-8 covers the bf16 rounding of D (half an ulp is at most 2^-8 relative). acc bounds the
// accumulation error relative to the size of the terms: fp32 accumulation (bf16 GEMMs, FP8 split
// accumulator) loses < k * 2^-24 of L1 (2^-14 at k = 1024), so acc = 2^-11 leaves margin; Hopper's
// FP8 fast accumulation keeps ~14 mantissa bits between promotions to fp32 (DeepSeek-V3's
// measurement), < k * 2^-14 of L1 in the worst case and ~sqrt(k) * 2^-14 typically, so acc = 2^-7
// at k = 256. On top, the relative RMS error over the whole output must stay below 2^-7 (2^-6
// with fast accumulation). A layout, operand-swap or scale mistake moves results by O(|ref|) ~
// L1 / sqrt(k) and fails both checks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cpu/block_quantization.h"
#include "cpu/numerics.h"
#include "gpu/device.h"
#include "gpu/device_memory.h"
#include "gpu/gemm.h"
#include "opfuse/error.h"
#include "reference/reference_ops.h"

namespace opfuse::gpu {
namespace {

// GELU and its derivative as the CPU reference evaluates them (its definition in
// compiler/ir/pointwise_defs.cpp).
float gelu_value(float x) {
  static const ir::PointwiseExpr gelu(*ir::find_pointwise("gelu"), {}, /*device=*/false);
  std::vector<float> scratch(gelu.graph().size());
  return gelu.forward<float>(std::span<const float>(&x, 1), scratch);
}
float gelu_derivative(float x) {
  static const ir::PointwiseExpr gelu(*ir::find_pointwise("gelu"), {}, /*device=*/false);
  std::vector<float> scratch(gelu.graph().size());
  float d = 0;
  gelu.backward<float>(std::span<const float>(&x, 1), 1.0f, std::span<float>(&d, 1), scratch);
  return d;
}

using cpu::Fp8Format;
namespace ops = cpu::ops;

constexpr float kOutputRounding = 1.0f / 256;  // 2^-8
constexpr float kFp32Accumulation = 1.0f / 2048;
constexpr float kFastAccumulation = 1.0f / 128;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A host matrix as the GPU stores it (bits) and as the reference sees it (values).
struct HostBf16 {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};

HostBf16 random_bf16(std::size_t count, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  HostBf16 m;
  for (std::size_t i = 0; i < count; ++i) {
    m.bits.push_back(cpu::float_to_bf16(normal(rng)));
    m.values.push_back(cpu::bf16_to_float(m.bits.back()));
  }
  return m;
}

// FP8 codes of `values * scale`, and the dequantized values code * (1 / scale) the GPU multiplies.
struct HostFp8 {
  std::vector<uint8_t> codes;
  std::vector<float> values;
  float scale_inv = 1.0f;
};

HostFp8 quantize(const std::vector<float>& values, Fp8Format format, float scale) {
  HostFp8 q;
  q.scale_inv = 1.0f / scale;
  q.codes.resize(values.size());
  cpu::quantize_fp8(values, scale, format, q.codes, nullptr);
  q.values.resize(values.size());
  cpu::dequantize_fp8(q.codes, q.scale_inv, format, q.values);
  return q;
}

// A scale that maps amax of `values` to 90% of the format's range: not a power of two, so
// scale_inv != 1 and inexact.
float scale_for(const std::vector<float>& values, Fp8Format format) {
  float amax = 0.0f;
  for (float v : values) amax = std::max(amax, std::fabs(v));
  return 0.9f * cpu::fp8_max(format) / amax;
}

template <typename T>
std::vector<T> transposed(const std::vector<T>& m, std::int64_t rows, std::int64_t cols) {
  std::vector<T> t(m.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  return t;
}

std::vector<float> absolute(std::vector<float> values) {
  for (float& v : values) v = std::fabs(v);
  return values;
}

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host, cudaStream_t stream) {
  DeviceBuffer buffer(host.size() * sizeof(T), stream);
  EXPECT_EQ(
      cudaMemcpyAsync(buffer.data(), host.data(), buffer.size(), cudaMemcpyHostToDevice, stream),
      cudaSuccess);
  return buffer;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& buffer, cudaStream_t stream) {
  std::vector<T> host(buffer.size() / sizeof(T));
  EXPECT_EQ(
      cudaMemcpyAsync(host.data(), buffer.data(), buffer.size(), cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return host;
}

std::vector<float> bf16_to_floats(const std::vector<uint16_t>& bits) {
  std::vector<float> values;
  for (uint16_t b : bits) values.push_back(cpu::bf16_to_float(b));
  return values;
}

// The per-element and RMS checks of the header comment.
::testing::AssertionResult close_to(const std::vector<float>& got, const std::vector<float>& ref,
                                    const std::vector<float>& l1, float acc, float rms_bound) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << "size mismatch";
  std::size_t bad = 0, first_bad = 0;
  double error_squares = 0, ref_squares = 0, worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(double(got[i]) - ref[i]);
    const double allowed = kOutputRounding * std::fabs(ref[i]) + acc * l1[i];
    worst_ratio = std::max(worst_ratio, error / std::max(allowed, 1e-30));
    if (!(error <= allowed)) {
      if (bad++ == 0) first_bad = i;
    }
    error_squares += error * error;
    ref_squares += double(ref[i]) * ref[i];
  }
  const double rms = std::sqrt(error_squares / std::max(ref_squares, 1e-30));
  if (bad == 0 && rms <= rms_bound) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure();
  failure << bad << " of " << got.size()
          << " elements out of tolerance (worst error / allowed = " << worst_ratio
          << "), relative RMS error " << rms << " (bound " << rms_bound << ")";
  if (bad > 0) {
    failure << "; first at " << first_bad << ": got " << got[first_bad] << ", want "
            << ref[first_bad] << ", L1 " << l1[first_bad];
  }
  return failure;
}

class GemmGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_available(&why)) GTEST_SKIP() << "skipping cuBLASLt GEMM tests: " << why;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    runner_ = std::make_unique<GemmRunner>(stream_);
  }
  void TearDown() override {
    runner_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GemmRunner> runner_;
};

struct LinearShape {
  std::int64_t tokens, in, out;
};

// ---- BF16 --------------------------------------------------------------------------------------

TEST_F(GemmGpu, Bf16FpropDgradWgradMatchTheCpuReference) {
  // Non-square, tokens not a multiple of 128 (or even of 8).
  for (const LinearShape s :
       {LinearShape{77, 96, 64}, LinearShape{200, 384, 256}, LinearShape{1000, 136, 520}}) {
    SCOPED_TRACE(testing::Message() << "tokens " << s.tokens << " in " << s.in << " out " << s.out);
    std::mt19937 rng(static_cast<unsigned>(s.tokens + s.in));
    const HostBf16 x = random_bf16(s.tokens * s.in, rng);
    const HostBf16 w = random_bf16(s.out * s.in, rng, 0.05f);
    const HostBf16 dy = random_bf16(s.tokens * s.out, rng);
    DeviceBuffer d_x = to_device(x.bits, stream_), d_w = to_device(w.bits, stream_),
                 d_dy = to_device(dy.bits, stream_);
    DeviceBuffer d_y(s.tokens * s.out * 2, stream_), d_dx(s.tokens * s.in * 2, stream_),
        d_dw(s.out * s.in * 2, stream_);

    GemmArgs args;
    args.a = d_x.data();
    args.b = d_w.data();
    args.d = d_y.data();
    runner_->run(fprop_gemm(s.tokens, s.in, s.out, DType::BF16, DType::BF16, DType::BF16), args,
                 stream_);
    args = GemmArgs{};
    args.a = d_dy.data();
    args.b = d_w.data();
    args.d = d_dx.data();
    runner_->run(dgrad_gemm(s.tokens, s.in, s.out, DType::BF16, DType::BF16, DType::BF16), args,
                 stream_);
    args = GemmArgs{};
    args.a = d_dy.data();
    args.b = d_x.data();
    args.d = d_dw.data();
    runner_->run(wgrad_gemm(s.tokens, s.in, s.out, DType::BF16, DType::BF16, DType::BF16), args,
                 stream_);

    std::vector<float> ref(s.tokens * s.out), l1(ref.size());
    ops::linear_forward<float>(x.values, w.values, s.tokens, s.out, s.in, ref);
    ops::linear_forward<float>(absolute(x.values), absolute(w.values), s.tokens, s.out, s.in, l1);
    EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_y, stream_)), ref, l1,
                         kFp32Accumulation, 1.0f / 128))
        << "fprop";
    ref.assign(s.tokens * s.in, 0.0f);
    l1.assign(ref.size(), 0.0f);
    ops::linear_dgrad<float>(dy.values, w.values, s.tokens, s.out, s.in, ref);
    ops::linear_dgrad<float>(absolute(dy.values), absolute(w.values), s.tokens, s.out, s.in, l1);
    EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_dx, stream_)), ref, l1,
                         kFp32Accumulation, 1.0f / 128))
        << "dgrad";
    ref.assign(s.out * s.in, 0.0f);
    l1.assign(ref.size(), 0.0f);
    ops::linear_wgrad<float>(dy.values, x.values, s.tokens, s.out, s.in, ref);
    ops::linear_wgrad<float>(absolute(dy.values), absolute(x.values), s.tokens, s.out, s.in, l1);
    EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_dw, stream_)), ref, l1,
                         kFp32Accumulation, 1.0f / 128))
        << "wgrad";
  }
  EXPECT_EQ(runner_->cached_plans(), 9u);  // one algorithm per distinct desc
}

// ---- FP8 ---------------------------------------------------------------------------------------

TEST_F(GemmGpu, Fp8FpropDgradWgradWithScaleInvMatchTheCpuReference) {
  for (const LinearShape s : {LinearShape{208, 256, 384}, LinearShape{48, 512, 128}}) {
    SCOPED_TRACE(testing::Message() << "tokens " << s.tokens << " in " << s.in << " out " << s.out);
    std::mt19937 rng(static_cast<unsigned>(s.tokens * 3 + s.out));
    const HostBf16 x_raw = random_bf16(s.tokens * s.in, rng);
    const HostBf16 w_raw = random_bf16(s.out * s.in, rng, 0.05f);
    const HostBf16 dy_raw = random_bf16(s.tokens * s.out, rng, 1e-3f);
    const HostFp8 x =
        quantize(x_raw.values, Fp8Format::E4M3, scale_for(x_raw.values, Fp8Format::E4M3));
    const HostFp8 w =
        quantize(w_raw.values, Fp8Format::E4M3, scale_for(w_raw.values, Fp8Format::E4M3));
    const HostFp8 dy =
        quantize(dy_raw.values, Fp8Format::E5M2, scale_for(dy_raw.values, Fp8Format::E5M2));
    ASSERT_NE(x.scale_inv, 1.0f);
    // The row-wise copies and the column-wise (transposed) ones cast_transpose would write.
    DeviceBuffer d_x = to_device(x.codes, stream_), d_w = to_device(w.codes, stream_),
                 d_dy = to_device(dy.codes, stream_);
    DeviceBuffer d_xt = to_device(transposed(x.codes, s.tokens, s.in), stream_),
                 d_wt = to_device(transposed(w.codes, s.out, s.in), stream_),
                 d_dyt = to_device(transposed(dy.codes, s.tokens, s.out), stream_);
    // One 16-byte slot per scalar: cuBLASLt 13 needs scale pointers 16-byte aligned.
    DeviceBuffer scale_invs = to_device(
        std::vector<float>{x.scale_inv, 0, 0, 0, w.scale_inv, 0, 0, 0, dy.scale_inv}, stream_);
    const float* x_scale_inv = scale_invs.as<float>();
    const float* w_scale_inv = x_scale_inv + 4;
    const float* dy_scale_inv = x_scale_inv + 8;
    DeviceBuffer d_y(s.tokens * s.out * 2, stream_), d_dx(s.tokens * s.in * 2, stream_),
        d_dw(s.out * s.in * 2, stream_);

    GemmArgs args;
    args.a = d_x.data();
    args.b = d_w.data();
    args.d = d_y.data();
    args.a_scale_inv = x_scale_inv;
    args.b_scale_inv = w_scale_inv;
    runner_->run(fprop_gemm(s.tokens, s.in, s.out, DType::E4M3, DType::E4M3, DType::BF16), args,
                 stream_);
    args.a = d_dy.data();
    args.b = d_wt.data();  // W^T [in, out]
    args.d = d_dx.data();
    args.a_scale_inv = dy_scale_inv;
    args.b_scale_inv = w_scale_inv;
    runner_->run(dgrad_gemm(s.tokens, s.in, s.out, DType::E5M2, DType::E4M3, DType::BF16), args,
                 stream_);
    args.a = d_dyt.data();  // dy^T [out, tokens]
    args.b = d_xt.data();   // x^T [in, tokens]
    args.d = d_dw.data();
    args.a_scale_inv = dy_scale_inv;
    args.b_scale_inv = x_scale_inv;
    runner_->run(wgrad_gemm(s.tokens, s.in, s.out, DType::E5M2, DType::E4M3, DType::BF16), args,
                 stream_);

    std::vector<float> ref(s.tokens * s.out), l1(ref.size());
    ops::linear_forward<float>(x.values, w.values, s.tokens, s.out, s.in, ref);
    ops::linear_forward<float>(absolute(x.values), absolute(w.values), s.tokens, s.out, s.in, l1);
    EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_y, stream_)), ref, l1,
                         kFastAccumulation, 1.0f / 64))
        << "fprop (fast accumulation)";
    ref.assign(s.tokens * s.in, 0.0f);
    l1.assign(ref.size(), 0.0f);
    ops::linear_dgrad<float>(dy.values, w.values, s.tokens, s.out, s.in, ref);
    ops::linear_dgrad<float>(absolute(dy.values), absolute(w.values), s.tokens, s.out, s.in, l1);
    EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_dx, stream_)), ref, l1,
                         kFp32Accumulation, 1.0f / 128))
        << "dgrad";
    ref.assign(s.out * s.in, 0.0f);
    l1.assign(ref.size(), 0.0f);
    ops::linear_wgrad<float>(dy.values, x.values, s.tokens, s.out, s.in, ref);
    ops::linear_wgrad<float>(absolute(dy.values), absolute(x.values), s.tokens, s.out, s.in, l1);
    EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_dw, stream_)), ref, l1,
                         kFp32Accumulation, 1.0f / 128))
        << "wgrad";
  }
}

// ---- block-scaled FP8 (float8_block_scaling)
// -----------------------------------------------------

// The same copy with every code's sign cleared: the block GEMM of two such copies bounds the sum of
// |a| |b| each output accumulates (the tolerance's L1 term).
cpu::BlockQuantizedCopy absolute(cpu::BlockQuantizedCopy copy) {
  for (uint8_t& code : copy.data) code &= 0x7F;
  return copy;
}

// cuBLASLt's VEC128_32F x BLK128x128_32F and VEC128_32F x VEC128_32F modes against TE's reference
// semantics (cpu::block_scaled_gemm: each 128-wide partial sum in FP32, then scaled and added).
// Not bit-exact: inside a 128-wide block the tensor cores sum in another order (and round each
// partial to FP32 differently), and D is rounded to bf16 once; the bound is the FP32 accumulation
// one of the per-tensor GEMMs.
TEST_F(GemmGpu, BlockScaledFpropDgradWgradMatchTheBlockGemmReference) {
  using cpu::BlockQuantParams;
  for (const LinearShape s : {LinearShape{256, 384, 512}, LinearShape{208, 272, 144}}) {
    SCOPED_TRACE(testing::Message() << "tokens " << s.tokens << " in " << s.in << " out " << s.out);
    std::mt19937 rng(static_cast<unsigned>(s.tokens + s.in));
    HostBf16 x_raw = random_bf16(s.tokens * s.in, rng);
    const HostBf16 w_raw = random_bf16(s.out * s.in, rng, 0.05f);
    const HostBf16 dy_raw = random_bf16(s.tokens * s.out, rng, 1e-3f);
    x_raw.values[7] = 300.0f;  // one outlier: only its own block's scale changes
    BlockQuantParams one_d{Fp8Format::E4M3, false, true, 0.0f, cpu::bf16_max_finite()};
    BlockQuantParams two_d = one_d;
    two_d.two_d = true;
    BlockQuantParams grad = one_d;
    grad.format = Fp8Format::E5M2;
    const auto x = cpu::block_quantize_rowwise(x_raw.values, s.tokens, s.in, one_d);
    const auto xt = cpu::block_quantize_columnwise(x_raw.values, s.tokens, s.in, one_d);
    const auto w = cpu::block_quantize_rowwise(w_raw.values, s.out, s.in, two_d);
    const auto wt = cpu::block_quantize_columnwise(w_raw.values, s.out, s.in, two_d);
    const auto dy = cpu::block_quantize_rowwise(dy_raw.values, s.tokens, s.out, grad);
    const auto dyt = cpu::block_quantize_columnwise(dy_raw.values, s.tokens, s.out, grad);

    struct Case {
      const char* name;
      GemmDesc desc;
      const cpu::BlockQuantizedCopy *a, *b;
      bool a_two_d, b_two_d;
      Fp8Format a_format, b_format;
    };
    auto block = [](GemmDesc d, ScaleMode a, ScaleMode b) {
      d.fast_accum = false;
      d.a_scale = a;
      d.b_scale = b;
      return d;
    };
    const Case cases[] = {
        {"fprop",
         block(fprop_gemm(s.tokens, s.in, s.out, DType::E4M3, DType::E4M3, DType::BF16),
               ScaleMode::Block1D, ScaleMode::Block2D),
         &x, &w, false, true, Fp8Format::E4M3, Fp8Format::E4M3},
        {"dgrad",
         block(dgrad_gemm(s.tokens, s.in, s.out, DType::E5M2, DType::E4M3, DType::BF16),
               ScaleMode::Block1D, ScaleMode::Block2D),
         &dy, &wt, false, true, Fp8Format::E5M2, Fp8Format::E4M3},
        {"wgrad",
         block(wgrad_gemm(s.tokens, s.in, s.out, DType::E5M2, DType::E4M3, DType::BF16),
               ScaleMode::Block1D, ScaleMode::Block1D),
         &dyt, &xt, false, false, Fp8Format::E5M2, Fp8Format::E4M3},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      ASSERT_TRUE(check_gemm(c.desc).empty()) << describe(c.desc);
      DeviceBuffer a = to_device(c.a->data, stream_), b = to_device(c.b->data, stream_);
      DeviceBuffer a_scales = to_device(c.a->scale_inv, stream_),
                   b_scales = to_device(c.b->scale_inv, stream_);
      DeviceBuffer d(static_cast<std::size_t>(c.desc.m * c.desc.n) * 2, stream_);
      GemmArgs args;
      args.a = a.data();
      args.b = b.data();
      args.d = d.data();
      args.a_scale_inv = a_scales.as<float>();
      args.b_scale_inv = b_scales.as<float>();
      runner_->run(c.desc, args, stream_);
      const std::vector<float> ref =
          cpu::block_scaled_gemm(*c.a, c.a_two_d, *c.b, c.b_two_d, c.a_format, c.b_format);
      const std::vector<float> l1 = cpu::block_scaled_gemm(
          absolute(*c.a), c.a_two_d, absolute(*c.b), c.b_two_d, c.a_format, c.b_format);
      EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d, stream_)), ref, l1,
                           kFp32Accumulation, 1.0f / 128));
    }
  }
}

// cuBLASLt is told the alignment a call's pointers have: 16-byte aligned operands get an algorithm
// of their own (kept beside the 256-byte one) and the same results within the same bounds.
TEST_F(GemmGpu, PointersOfAnotherAlignmentGetTheirOwnAlgorithm) {
  const LinearShape s{256, 512, 384};
  std::mt19937 rng(5);
  const HostBf16 x = random_bf16(s.tokens * s.in, rng);
  const HostBf16 w = random_bf16(s.out * s.in, rng, 0.05f);
  std::vector<uint16_t> shifted(8, 0);  // x 16 bytes into its buffer
  shifted.insert(shifted.end(), x.bits.begin(), x.bits.end());
  DeviceBuffer d_x = to_device(x.bits, stream_), d_x16 = to_device(shifted, stream_),
               d_w = to_device(w.bits, stream_);
  std::vector<float> ref(s.tokens * s.out), l1(ref.size());
  ops::linear_forward<float>(x.values, w.values, s.tokens, s.out, s.in, ref);
  ops::linear_forward<float>(absolute(x.values), absolute(w.values), s.tokens, s.out, s.in, l1);
  const GemmDesc desc = fprop_gemm(s.tokens, s.in, s.out, DType::BF16, DType::BF16, DType::BF16);
  for (const void* a : {static_cast<const void*>(d_x.data()),
                        static_cast<const void*>(static_cast<const char*>(d_x16.data()) + 16)}) {
    DeviceBuffer d_y(s.tokens * s.out * 2, stream_);
    GemmArgs args;
    args.a = a;
    args.b = d_w.data();
    args.d = d_y.data();
    runner_->run(desc, args, stream_);
    EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_y, stream_)), ref, l1,
                         kFp32Accumulation, 1.0f / 128));
  }
  EXPECT_EQ(runner_->cached_plans(), 2u);
}

// GemmOptions::autotune: the fastest of cuBLASLt's candidates computes the same GEMM within the
// same bounds, and every runner in the process takes the same one (bit-identical results).
TEST_F(GemmGpu, AutotunedGemmsMatchTheReferenceAndAgreeAcrossRunners) {
  const LinearShape s{512, 1024, 768};
  std::mt19937 rng(41);
  const HostBf16 x_raw = random_bf16(s.tokens * s.in, rng);
  const HostBf16 w_raw = random_bf16(s.out * s.in, rng, 0.05f);
  const HostFp8 x =
      quantize(x_raw.values, Fp8Format::E4M3, scale_for(x_raw.values, Fp8Format::E4M3));
  const HostFp8 w =
      quantize(w_raw.values, Fp8Format::E4M3, scale_for(w_raw.values, Fp8Format::E4M3));
  DeviceBuffer d_x = to_device(x.codes, stream_), d_w = to_device(w.codes, stream_);
  DeviceBuffer scale_invs =
      to_device(std::vector<float>{x.scale_inv, 0, 0, 0, w.scale_inv, 0, 0, 0}, stream_);
  std::vector<float> ref(s.tokens * s.out), l1(ref.size());
  ops::linear_forward<float>(x.values, w.values, s.tokens, s.out, s.in, ref);
  ops::linear_forward<float>(absolute(x.values), absolute(w.values), s.tokens, s.out, s.in, l1);
  const GemmDesc desc = fprop_gemm(s.tokens, s.in, s.out, DType::E4M3, DType::E4M3, DType::BF16);
  std::vector<std::vector<uint16_t>> results;
  for (int runner_index = 0; runner_index < 2; ++runner_index) {
    GemmRunner tuned(stream_, GemmOptions{true});
    DeviceBuffer d_y(s.tokens * s.out * 2, stream_);
    GemmArgs args;
    args.a = d_x.data();
    args.b = d_w.data();
    args.d = d_y.data();
    args.a_scale_inv = scale_invs.as<float>();
    args.b_scale_inv = scale_invs.as<float>() + 4;
    tuned.run(desc, args, stream_);  // the first run times the candidates
    tuned.run(desc, args, stream_);
    EXPECT_EQ(tuned.cached_plans(), 1u);
    results.push_back(to_host<uint16_t>(d_y, stream_));
    EXPECT_TRUE(close_to(bf16_to_floats(results.back()), ref, l1, kFastAccumulation, 1.0f / 64));
  }
  EXPECT_EQ(results[0], results[1]);
}

// Position of an FP8 code on the number line, so that neighbours differ by 1 (-0 and +0 both 0).
int fp8_rank(uint8_t code) { return (code & 0x80) ? -(code & 0x7F) : (code & 0x7F); }

TEST_F(GemmGpu, Fp8OutputCodesAndAmaxMatchHostConversion) {
  // Small integers times power-of-two scale_invs: every product and partial sum is exact in
  // fp32, so the GPU's fp32 result equals the reference exactly and only the final
  // fp8(result * d_scale) conversion is left to compare.
  const std::int64_t tokens = 208, in = 256, out = 384;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<float> x_ints(tokens * in), w_ints(out * in);
  for (float& v : x_ints) v = float(small(rng));
  for (float& v : w_ints) v = float(small(rng));
  const HostFp8 x = quantize(x_ints, Fp8Format::E4M3, 2.0f);  // scale_inv 0.5
  const HostFp8 w = quantize(w_ints, Fp8Format::E4M3, 4.0f);  // scale_inv 0.25
  ASSERT_EQ(x.values, x_ints);  // exact: code = 2 x, dequantized = code * 0.5
  const float d_scale = 448.0f / 700.0f;
  DeviceBuffer d_x = to_device(x.codes, stream_), d_w = to_device(w.codes, stream_);
  DeviceBuffer scalars = to_device(
      std::vector<float>{x.scale_inv, 0, 0, 0, w.scale_inv, 0, 0, 0, d_scale, 0, 0, 0, 0.0f},
      stream_);
  DeviceBuffer d_y(tokens * out, stream_);
  GemmArgs args;
  args.a = d_x.data();
  args.b = d_w.data();
  args.d = d_y.data();
  args.a_scale_inv = scalars.as<float>();
  args.b_scale_inv = scalars.as<float>() + 4;
  args.d_scale = scalars.as<float>() + 8;
  args.d_amax = scalars.as<float>() + 12;
  GemmDesc desc = fprop_gemm(tokens, in, out, DType::E4M3, DType::E4M3, DType::E4M3);
  desc.fast_accum = false;
  runner_->run(desc, args, stream_);

  std::vector<float> ref(tokens * out);
  ops::linear_forward<float>(x.values, w.values, tokens, out, in, ref);
  float ref_amax = 0.0f;
  for (float v : ref) ref_amax = std::max(ref_amax, std::fabs(v));
  const auto got = to_host<uint8_t>(d_y, stream_);
  std::size_t exact = 0, off_by_one = 0, worse = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const uint8_t want = cpu::float_to_fp8(ref[i] * d_scale, Fp8Format::E4M3);
    const int distance = std::abs(fp8_rank(got[i]) - fp8_rank(want));
    exact += distance == 0;
    off_by_one += distance == 1;
    worse += distance > 1;
  }
  EXPECT_EQ(worse, 0u) << exact << " exact, " << off_by_one << " one code away";
  EXPECT_GE(exact, ref.size() * 99 / 100) << off_by_one << " one code away";
  const float amax = to_host<float>(scalars, stream_)[12];
  // amax_D is taken before d_scale; the result is exact here, so only cuBLASLt's own reduction
  // could differ, and a max cannot round.
  EXPECT_FLOAT_EQ(amax, ref_amax);
  EXPECT_GT(ref_amax * d_scale, 448.0f) << "the test should saturate some codes";
}

// ---- epilogues and accumulation (BF16) ---------------------------------------------------------

TEST_F(GemmGpu, BiasAndGeluAuxBiasEpiloguesMatchTheReference) {
  const std::int64_t tokens = 200, in = 256, out = 384;
  std::mt19937 rng(9);
  const HostBf16 x = random_bf16(tokens * in, rng);
  const HostBf16 w = random_bf16(out * in, rng, 0.05f);
  const HostBf16 bias = random_bf16(out, rng);
  DeviceBuffer d_x = to_device(x.bits, stream_), d_w = to_device(w.bits, stream_),
               d_bias = to_device(bias.bits, stream_);
  DeviceBuffer d_y(tokens * out * 2, stream_), d_aux(tokens * out * 2, stream_);
  std::vector<float> pre(tokens * out), l1(pre.size());
  ops::linear_forward<float>(x.values, w.values, tokens, out, in, pre);
  ops::linear_forward<float>(absolute(x.values), absolute(w.values), tokens, out, in, l1);
  ops::add_bias<float>(pre, bias.values, out);
  ops::add_bias<float>(l1, absolute(bias.values), out);

  GemmDesc desc = fprop_gemm(tokens, in, out, DType::BF16, DType::BF16, DType::BF16);
  desc.epilogue = GemmEpilogue::Bias;
  GemmArgs args;
  args.a = d_x.data();
  args.b = d_w.data();
  args.d = d_y.data();
  args.bias = d_bias.data();
  runner_->run(desc, args, stream_);
  EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_y, stream_)), pre, l1, kFp32Accumulation,
                       1.0f / 128))
      << "bias";

  desc.epilogue = GemmEpilogue::GeluAuxBias;
  args.aux = d_aux.data();
  runner_->run(desc, args, stream_);
  EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_aux, stream_)), pre, l1,
                       kFp32Accumulation, 1.0f / 128))
      << "aux must hold the pre-activation";
  std::vector<float> activated(pre.size()), activated_l1(pre.size());
  for (std::size_t i = 0; i < pre.size(); ++i) {
    activated[i] = gelu_value(pre[i]);
    // |gelu'| <= 1.13: an error in the pre-activation grows at most that much.
    activated_l1[i] = 1.13f * l1[i];
  }
  EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_y, stream_)), activated, activated_l1,
                       kFp32Accumulation, 1.0f / 128))
      << "gelu(pre-activation)";
}

TEST_F(GemmGpu, DgeluBiasGradAndWgradBiasGradMatchTheReference) {
  const std::int64_t tokens = 200, in = 256, out = 384;
  std::mt19937 rng(13);
  const HostBf16 dy = random_bf16(tokens * out, rng);
  const HostBf16 w = random_bf16(out * in, rng, 0.05f);
  const HostBf16 pre = random_bf16(tokens * in, rng, 1.5f);  // the saved pre-activation
  const HostBf16 x = random_bf16(tokens * in, rng);
  DeviceBuffer d_dy = to_device(dy.bits, stream_), d_w = to_device(w.bits, stream_),
               d_pre = to_device(pre.bits, stream_), d_x = to_device(x.bits, stream_);
  DeviceBuffer d_dx(tokens * in * 2, stream_), d_dbias(in * 2, stream_),
      d_dw(out * in * 2, stream_), d_dbias_out(out * 2, stream_);

  GemmDesc desc = dgrad_gemm(tokens, in, out, DType::BF16, DType::BF16, DType::BF16);
  desc.epilogue = GemmEpilogue::DGeluBiasGrad;
  GemmArgs args;
  args.a = d_dy.data();
  args.b = d_w.data();
  args.d = d_dx.data();
  args.aux = d_pre.data();
  args.bias = d_dbias.data();
  runner_->run(desc, args, stream_);

  std::vector<float> ref(tokens * in), l1(ref.size());
  ops::linear_dgrad<float>(dy.values, w.values, tokens, out, in, ref);
  ops::linear_dgrad<float>(absolute(dy.values), absolute(w.values), tokens, out, in, l1);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float derivative = gelu_derivative(pre.values[i]);
    // Why the |A B| term: measured on an H200, cuBLASLt rounds A B to bf16 before the dgelu
    // epilogue (every worst case equals bf16(bf16(A B) * gelu')) and evaluates gelu' in reduced
    // precision: the error divided by |A B| reached 0.0037 (2^-8.1) beyond D's own rounding. 2^-7
    // |A B| gives a 2x margin; a wrong aux layout or a missing derivative errs by O(|A B|).
    const float product_error = std::fabs(ref[i]) / 128;
    ref[i] *= derivative;
    l1[i] = l1[i] * std::fabs(derivative) + product_error / kFp32Accumulation;
  }
  EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_dx, stream_)), ref, l1, kFp32Accumulation,
                       1.0f / 128))
      << "dgelu";
  std::vector<float> dbias(in, 0.0f), dbias_l1(in, 0.0f);
  ops::bias_grad<float>(ref, in, dbias);
  ops::bias_grad<float>(l1, in, dbias_l1);
  EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_dbias, stream_)), dbias, dbias_l1,
                       kFp32Accumulation, 1.0f / 128))
      << "dbias = column sums of the dgelu output";

  GemmDesc wgrad = wgrad_gemm(tokens, in, out, DType::BF16, DType::BF16, DType::BF16);
  wgrad.epilogue = GemmEpilogue::BiasGradA;
  args = GemmArgs{};
  args.a = d_dy.data();
  args.b = d_x.data();
  args.d = d_dw.data();
  args.bias = d_dbias_out.data();
  runner_->run(wgrad, args, stream_);
  std::vector<float> dw(out * in), dw_l1(dw.size());
  ops::linear_wgrad<float>(dy.values, x.values, tokens, out, in, dw);
  ops::linear_wgrad<float>(absolute(dy.values), absolute(x.values), tokens, out, in, dw_l1);
  EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_dw, stream_)), dw, dw_l1,
                       kFp32Accumulation, 1.0f / 128))
      << "wgrad with dbias";
  std::vector<float> dbias_out(out, 0.0f), dbias_out_l1(out, 0.0f);
  ops::bias_grad<float>(dy.values, out, dbias_out);
  ops::bias_grad<float>(absolute(dy.values), out, dbias_out_l1);
  EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_dbias_out, stream_)), dbias_out,
                       dbias_out_l1, kFp32Accumulation, 1.0f / 128))
      << "dbias = sum of dy over tokens";
}

TEST_F(GemmGpu, AccumulateAddsIntoDOrIntoASeparateC) {
  const std::int64_t tokens = 136, in = 256, out = 128;
  std::mt19937 rng(17);
  const HostBf16 x = random_bf16(tokens * in, rng);
  const HostBf16 w = random_bf16(out * in, rng, 0.05f);
  const HostBf16 old = random_bf16(tokens * out, rng);
  DeviceBuffer d_x = to_device(x.bits, stream_), d_w = to_device(w.bits, stream_);
  DeviceBuffer d_y = to_device(old.bits, stream_), d_c = to_device(old.bits, stream_);
  DeviceBuffer d_out(tokens * out * 2, stream_);
  std::vector<float> ref(tokens * out), l1(ref.size());
  ops::linear_forward<float>(x.values, w.values, tokens, out, in, ref);
  ops::linear_forward<float>(absolute(x.values), absolute(w.values), tokens, out, in, l1);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ref[i] += old.values[i];
    l1[i] += std::fabs(old.values[i]);
  }
  // Why a second bound for in place: measured on an H200, with C == D cuBLASLt rounds x W^T to
  // bf16 before adding C (every element equals bf16(bf16(x W^T) + C)), so half a bf16 ulp of
  // |x W^T| (2^-9) comes on top; a separate C is added in fp32 and keeps the plain bound. A
  // missing or doubled C errs by |C| and still fails.
  std::vector<float> in_place_l1(l1);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    in_place_l1[i] += std::fabs(ref[i] - old.values[i]) / 512 / kFp32Accumulation;
  }
  GemmDesc desc = fprop_gemm(tokens, in, out, DType::BF16, DType::BF16, DType::BF16);
  desc.accumulate = true;
  GemmArgs args;
  args.a = d_x.data();
  args.b = d_w.data();
  args.d = d_y.data();  // in place: D += x W^T
  runner_->run(desc, args, stream_);
  EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_y, stream_)), ref, in_place_l1,
                       kFp32Accumulation, 1.0f / 128))
      << "in place";
  args.d = d_out.data();
  args.c = d_c.data();  // out = x W^T + C, C untouched
  runner_->run(desc, args, stream_);
  EXPECT_TRUE(close_to(bf16_to_floats(to_host<uint16_t>(d_out, stream_)), ref, l1,
                       kFp32Accumulation, 1.0f / 128))
      << "separate C";
  EXPECT_EQ(to_host<uint16_t>(d_c, stream_), old.bits);

  // The main-gradient case: an FP32 dW accumulated over two wgrads.
  const HostBf16 dy = random_bf16(tokens * out, rng);
  DeviceBuffer d_dy = to_device(dy.bits, stream_);
  DeviceBuffer d_main_grad = to_device(std::vector<float>(out * in, 0.0f), stream_);
  GemmDesc wgrad = wgrad_gemm(tokens, in, out, DType::BF16, DType::BF16, DType::FP32);
  wgrad.accumulate = true;
  args = GemmArgs{};
  args.a = d_dy.data();
  args.b = d_x.data();
  args.d = d_main_grad.data();
  runner_->run(wgrad, args, stream_);
  runner_->run(wgrad, args, stream_);
  std::vector<float> dw(out * in), dw_l1(dw.size());
  ops::linear_wgrad<float>(dy.values, x.values, tokens, out, in, dw);
  ops::linear_wgrad<float>(absolute(dy.values), absolute(x.values), tokens, out, in, dw_l1);
  for (std::size_t i = 0; i < dw.size(); ++i) {
    dw[i] *= 2;
    dw_l1[i] *= 2;
  }
  EXPECT_TRUE(
      close_to(to_host<float>(d_main_grad, stream_), dw, dw_l1, kFp32Accumulation, 1.0f / 128))
      << "fp32 main grad accumulated twice";
}

// ---- misuse is refused before launch ------------------------------------------------------------

TEST_F(GemmGpu, MisalignedPointerAndBadDescAreRejectedBeforeLaunch) {
  const std::int64_t tokens = 64, in = 128, out = 64;
  std::mt19937 rng(21);
  const HostBf16 x = random_bf16(tokens * in + 8, rng);
  const HostBf16 w = random_bf16(out * in, rng);
  DeviceBuffer d_x = to_device(x.bits, stream_), d_w = to_device(w.bits, stream_);
  const std::vector<uint16_t> poison(tokens * out, 0x7FC1);
  DeviceBuffer d_y = to_device(poison, stream_);
  GemmArgs args;
  args.a = d_x.as<uint16_t>() + 1;  // 2 bytes past a 256-byte boundary
  args.b = d_w.data();
  args.d = d_y.data();
  const GemmDesc desc = fprop_gemm(tokens, in, out, DType::BF16, DType::BF16, DType::BF16);
  try {
    runner_->run(desc, args, stream_);
    FAIL() << "a misaligned A was accepted";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("is not 16-byte aligned"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(to_host<uint16_t>(d_y, stream_), poison) << "nothing may have run";

  GemmDesc nn = fprop_gemm(tokens, in, out, DType::E4M3, DType::E4M3, DType::BF16);
  nn.b_transposed = false;
  args.a = d_x.data();
  try {
    runner_->run(nn, args, stream_);
    FAIL() << "an FP8 NN desc was accepted";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("TN layout"), std::string::npos) << error.what();
  }
  EXPECT_EQ(runner_->cached_plans(), 0u);

  // An FP8 desc whose args lack the scale_inv pointers.
  const GemmDesc fp8 = fprop_gemm(tokens, in, out, DType::E4M3, DType::E4M3, DType::BF16);
  EXPECT_THROW(runner_->run(fp8, args, stream_), UsageError);
  EXPECT_EQ(to_host<uint16_t>(d_y, stream_), poison) << "nothing may have run";
}

}  // namespace
}  // namespace opfuse::gpu
