// The fused gated FP8 GEMM (runtime/cutlass/fused_gemm.h) on the GPU against its definition on
// the host: A B^T, scaled and rounded to bf16 as the GEMM's output, the gated activation's
// device-form expression (the functor the kernel compiled, evaluated on the CPU in the same
// operation order), the rounded product and the saturating E4M3 cast. The operands are small
// integers (exact in E4M3) so that every partial sum is an integer below 2^14: exact in the FP8
// tensor cores' fast accumulation as in the host's, whatever the order. (With random values the
// fast accumulation's rounding moves a few codes of a k = 1024 product by several steps where
// the sum cancels; the executor's test compares that case with cuBLASLt's GEMM.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpu/numerics.h"
#include "cutlass/fused_gemm.h"
#include "gpu/device.h"
#include "gpu_test_support.h"
#include "ir/pointwise_ops.h"
#include "opfuse/error.h"

namespace opfuse {
namespace {

using test::DeviceArray;

constexpr std::string_view kSwiglu = "opfuse::pointwise_swiglu";

const ir::PointwiseDef& def_of(std::string_view functor) {
  for (const ir::PointwiseDef* def : ir::pointwise_defs())
    if (ir::pointwise_functor_name(*def, {}) == functor) return *def;
  throw std::runtime_error("no definition for " + std::string(functor));
}

class FusedGemmGpu : public test::GpuStreamTest {
 protected:
  void SetUp() override {
    test::GpuStreamTest::SetUp();
    if (IsSkipped()) return;
    const gpu::DeviceInfo device = gpu::current_device();
    const std::string why =
        gpu::gated_gemm_refusal(kSwiglu, 64, 64, 64, device.major * 10 + device.minor);
    if (!why.empty()) GTEST_SKIP() << why;
  }
  // Scalars each at their own 16-byte aligned allocation.
  float* scalar(float value) {
    DeviceArray& array = new_array(16);
    test::upload_bytes(array, &value, sizeof value);
    return static_cast<float*>(array.data());
  }
};

// Integers in [-3, 3] as E4M3 codes: |a . b| <= 9 k < 2^14 for k <= 1024.
std::vector<uint8_t> random_small_ints(size_t count, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<uint8_t> codes(count);
  for (auto& c : codes) c = cpu::float_to_fp8(float(small(rng)), cpu::Fp8Format::E4M3);
  return codes;
}

// Same sign and at most one step apart in magnitude (E4M3 codes order as their values).
bool neighbours(uint8_t a, uint8_t b) {
  if (a == b) return true;
  if ((a & 0x7f) == 0 && (b & 0x7f) <= 1) return true;
  if ((b & 0x7f) == 0 && (a & 0x7f) <= 1) return true;
  return (a & 0x80) == (b & 0x80) && std::abs(int(a & 0x7f) - int(b & 0x7f)) <= 1;
}

TEST_F(FusedGemmGpu, EveryActivationAndShapeMatchesTheHostDefinition) {
  struct Shape {
    int64_t m, n, k;
  };
  // Ragged m (not a multiple of the 64-row tile), n not a multiple of the 256-column tile, a
  // short and a longer k.
  const Shape shapes[] = {{200, 512, 256}, {77, 160, 64}, {512, 768, 1024}};
  constexpr size_t kTail = 256;  // bytes after the output that must stay untouched
  constexpr uint8_t kSentinel = 0xA5;
  // Powers of two: alpha * sum is exact too. Gates of about +-0.25 (k = 1024) to +-0.06 (k = 64);
  // the largest outputs saturate E4M3.
  const float a_scale_inv = 1.0f / 32, b_scale_inv = 1.0f / 16, out_scale = 256.0f;
  std::mt19937_64 rng(7);
  for (std::string_view activation : gpu::gated_gemm_activations()) {
    const ir::PointwiseExpr expr(def_of(activation), {}, /*device=*/true);
    std::vector<float> scratch(expr.graph().size());
    for (const Shape& s : shapes) {
      SCOPED_TRACE(std::string(activation) + " m=" + std::to_string(s.m) +
                   " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k));
      const std::vector<uint8_t> a = random_small_ints(size_t(s.m * s.k), rng);
      const std::vector<uint8_t> b = random_small_ints(size_t(s.n * s.k), rng);
      DeviceArray& a_dev = new_array(a.size());
      DeviceArray& b_dev = new_array(b.size());
      DeviceArray& b_interleaved = new_array(b.size());
      const size_t out_bytes = size_t(s.m * s.n / 2);
      DeviceArray& out = new_array(out_bytes + kTail);
      test::upload_bytes(a_dev, a.data(), a.size());
      test::upload_bytes(b_dev, b.data(), b.size());
      fill_bytes(out, kSentinel);
      float* amax = scalar(0.0f);
      gpu::interleave_gated_rows(b_dev.data(), b_interleaved.data(), s.n, s.k, stream_);
      gpu::GatedGemmArgs args;
      args.activation = activation;
      args.m = s.m, args.n = s.n, args.k = s.k;
      args.a = a_dev.data(), args.b = b_interleaved.data();
      args.a_scale_inv = scalar(a_scale_inv), args.b_scale_inv = scalar(b_scale_inv);
      args.out_scale = scalar(out_scale);
      args.amax = amax;
      args.out = out.data();
      gpu::launch_gated_gemm(args, stream_);
      OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
      const std::vector<uint8_t> got = test::download_bytes(out.data(), out_bytes + kTail);
      float got_amax = 0;
      OPFUSE_TEST_CUDA_OK(cudaMemcpy(&got_amax, amax, sizeof got_amax, cudaMemcpyDeviceToHost));

      // The host: exact products (FP8 values are exact in double), the GEMM's bf16 output.
      const float alpha = a_scale_inv * b_scale_inv;
      std::vector<float> af(a.size()), bf(b.size());
      for (size_t i = 0; i < a.size(); ++i) af[i] = cpu::fp8_to_float(a[i], cpu::Fp8Format::E4M3);
      for (size_t i = 0; i < b.size(); ++i) bf[i] = cpu::fp8_to_float(b[i], cpu::Fp8Format::E4M3);
      auto gemm = [&](int64_t row, int64_t col) {
        double sum = 0;
        for (int64_t i = 0; i < s.k; ++i)
          sum += double(af[size_t(row * s.k + i)]) * bf[size_t(col * s.k + i)];
        return cpu::bf16_to_float(cpu::float_to_bf16(alpha * static_cast<float>(sum)));
      };
      const int64_t cols = s.n / 2;
      size_t differ = 0, far = 0;
      float want_amax = 0;
      for (int64_t row = 0; row < s.m; ++row)
        for (int64_t col = 0; col < cols; ++col) {
          const float in[2] = {gemm(row, col), gemm(row, cols + col)};
          const float value = expr.forward<float>(in, scratch);
          want_amax = std::fmax(want_amax, std::fabs(value));
          const uint8_t want = cpu::float_to_fp8(value * out_scale, cpu::Fp8Format::E4M3);
          const uint8_t code = got[size_t(row * cols + col)];
          differ += code != want;
          if (!neighbours(code, want) && far++ < 5)
            ADD_FAILURE() << "row " << row << " col " << col << ": code 0x" << std::hex << int(code)
                          << ", the definition gives 0x" << int(want);
        }
      // The GEMM's bf16 outputs are exact on both sides; what is left is the functor's
      // intrinsics on the GPU (exp, division) against the host's evaluation of the same
      // expression, a few ulps apart: a code moves by one step when that straddles a rounding.
      EXPECT_EQ(far, 0u);
      EXPECT_LE(double(differ), 0.002 * double(s.m * cols)) << differ << " codes differ";
      EXPECT_NEAR(got_amax, want_amax, want_amax * 1e-5f);
      size_t touched = 0;
      for (size_t i = out_bytes; i < got.size(); ++i) touched += got[i] != kSentinel;
      EXPECT_EQ(touched, 0u) << "bytes written past the output";
    }
  }
}

TEST_F(FusedGemmGpu, InterleavesGateAndLinearRows) {
  const int64_t rows = 6, row_bytes = 32;
  std::vector<uint8_t> w(size_t(rows * row_bytes));
  for (size_t i = 0; i < w.size(); ++i) w[i] = uint8_t(i / row_bytes);  // each row its index
  DeviceArray& src = new_array(w.size());
  DeviceArray& dst = new_array(w.size());
  test::upload_bytes(src, w.data(), w.size());
  gpu::interleave_gated_rows(src.data(), dst.data(), rows, row_bytes, stream_);
  OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
  const std::vector<uint8_t> got = test::download_bytes(dst.data(), w.size());
  const uint8_t order[] = {0, 3, 1, 4, 2, 5};  // gate 0, linear 0, gate 1, ...
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < row_bytes; ++c)
      ASSERT_EQ(got[size_t(r * row_bytes + c)], order[r]) << "row " << r;
  EXPECT_THROW(gpu::interleave_gated_rows(src.data(), dst.data(), 5, row_bytes, stream_),
               UsageError);
}

TEST_F(FusedGemmGpu, RefusesBadArgumentsBeforeLaunching) {
  DeviceArray& a = new_array(64 * 64 + 16);
  DeviceArray& out = new_array(64 * 32 + 16);
  fill_bytes(out, 0x5A);
  gpu::GatedGemmArgs args;
  args.activation = kSwiglu;
  args.m = 64, args.n = 64, args.k = 64;
  args.a = a.data(), args.b = a.data(), args.out = out.data();
  args.a_scale_inv = scalar(1), args.b_scale_inv = scalar(1), args.out_scale = scalar(1);
  auto message = [&](const gpu::GatedGemmArgs& bad) {
    try {
      gpu::launch_gated_gemm(bad, stream_);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no UsageError");
  };
  gpu::GatedGemmArgs misaligned = args;
  misaligned.a = static_cast<const char*>(a.data()) + 1;
  EXPECT_NE(message(misaligned).find("A at a 16-byte aligned"), std::string::npos);
  gpu::GatedGemmArgs no_scale = args;
  no_scale.out_scale = nullptr;
  EXPECT_NE(message(no_scale).find("output scale"), std::string::npos);
  gpu::GatedGemmArgs bad_n = args;
  bad_n.n = 48;
  EXPECT_NE(message(bad_n).find("n=48 is not a multiple of 32"), std::string::npos);
  gpu::GatedGemmArgs unknown = args;
  unknown.activation = "opfuse::pointwise_gelu";
  EXPECT_NE(message(unknown).find("no fused gated GEMM is compiled"), std::string::npos);
  OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(test::bytes_other_than(out, 0x5A), 0u) << "a refused GEMM wrote its output";
}

}  // namespace
}  // namespace opfuse
