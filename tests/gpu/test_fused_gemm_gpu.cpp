// The fused gated FP8 GEMM (runtime/cutlass/fused_gemm.h) on the GPU against its definition on
// the host: A B^T, scaled and rounded to bf16 as the GEMM's output, the gated activation's
// device-form expression (the functor the kernel compiled, evaluated on the CPU in the same
// operation order), the rounded product and the saturating E4M3 cast. The operands are small
// integers (exact in E4M3) so that every partial sum is an integer below 2^14: exact in the FP8
// tensor cores' fast accumulation as in the host's, whatever the order. (With random values the
// fast accumulation's rounding moves a few codes of a k = 1024 product by several steps where
// the sum cancels; the executor's test compares that case with cuBLASLt's GEMM.) The training
// form's BF16 output is then exact too, and its transposed copy must be the output's transpose.
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

struct Shape {
  int64_t m, n, k;
};

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
  void check_product(std::string_view activation, const Shape& s, bool training,
                     std::mt19937_64& rng);
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

// One product on the GPU against the host definition; `training` also checks the BF16 output
// (exact: integer sums) and the transposed copy (the output's transpose, byte for byte).
void FusedGemmGpu::check_product(std::string_view activation, const Shape& s, bool training,
                                 std::mt19937_64& rng) {
  SCOPED_TRACE(std::string(activation) + (training ? " training" : " inference") + " m=" +
               std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k));
  const ir::PointwiseExpr expr(def_of(activation), {}, /*device=*/true);
  std::vector<float> scratch(expr.graph().size());
  constexpr size_t kTail = 256;  // bytes after each output that must stay untouched
  constexpr uint8_t kSentinel = 0xA5;
  // Powers of two: alpha * sum is exact too. Gates of about +-0.25 (k = 1024) to +-0.06 (k = 64);
  // the largest outputs saturate E4M3.
  const float a_scale_inv = 1.0f / 32, b_scale_inv = 1.0f / 16, out_scale = 256.0f;
  const std::vector<uint8_t> a = random_small_ints(size_t(s.m * s.k), rng);
  const std::vector<uint8_t> b = random_small_ints(size_t(s.n * s.k), rng);
  DeviceArray& a_dev = new_array(a.size());
  DeviceArray& b_dev = new_array(b.size());
  DeviceArray& b_interleaved = new_array(b.size());
  const size_t out_bytes = size_t(s.m * s.n / 2), d_bytes = size_t(s.m * s.n * 2);
  DeviceArray& out = new_array(out_bytes + kTail);
  DeviceArray& out_t = new_array(out_bytes + kTail);
  DeviceArray& d = new_array(d_bytes + kTail);
  test::upload_bytes(a_dev, a.data(), a.size());
  test::upload_bytes(b_dev, b.data(), b.size());
  for (DeviceArray* array : {&out, &out_t, &d}) fill_bytes(*array, kSentinel);
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
  if (training) args.out_t = out_t.data(), args.d = d.data();
  gpu::launch_gated_gemm(args, stream_);
  OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
  const std::vector<uint8_t> got = test::download_bytes(out.data(), out_bytes + kTail);
  const std::vector<uint8_t> got_t = test::download_bytes(out_t.data(), out_bytes + kTail);
  const std::vector<uint8_t> got_d = test::download_bytes(d.data(), d_bytes + kTail);
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
    return cpu::float_to_bf16(alpha * static_cast<float>(sum));
  };
  const int64_t cols = s.n / 2;
  size_t differ = 0, far = 0, d_differ = 0, t_differ = 0;
  float want_amax = 0;
  for (int64_t row = 0; row < s.m; ++row)
    for (int64_t col = 0; col < cols; ++col) {
      const uint16_t gate = gemm(row, col), linear = gemm(row, cols + col);
      const float in[2] = {cpu::bf16_to_float(gate), cpu::bf16_to_float(linear)};
      const float value = expr.forward<float>(in, scratch);
      want_amax = std::fmax(want_amax, std::fabs(value));
      const uint8_t want = cpu::float_to_fp8(value * out_scale, cpu::Fp8Format::E4M3);
      const uint8_t code = got[size_t(row * cols + col)];
      differ += code != want;
      if (!neighbours(code, want) && far++ < 5)
        ADD_FAILURE() << "row " << row << " col " << col << ": code 0x" << std::hex << int(code)
                      << ", the definition gives 0x" << int(want);
      if (!training) continue;
      t_differ += got_t[size_t(col * s.m + row)] != code;
      for (const auto& [bits, at] : {std::pair{gate, col}, std::pair{linear, cols + col}}) {
        const size_t byte = size_t(row * s.n + at) * 2;
        d_differ += (got_d[byte] | (got_d[byte + 1] << 8)) != bits;
      }
    }
  // The GEMM's bf16 outputs are exact on both sides; what is left is the functor's
  // intrinsics on the GPU (exp, division) against the host's evaluation of the same
  // expression, a few ulps apart: a code moves by one step when that straddles a rounding.
  EXPECT_EQ(far, 0u);
  EXPECT_LE(double(differ), 0.002 * double(s.m * cols)) << differ << " codes differ";
  EXPECT_NEAR(got_amax, want_amax, want_amax * 1e-5f);
  EXPECT_EQ(d_differ, 0u) << "BF16 outputs differ from the exact products";
  EXPECT_EQ(t_differ, 0u) << "the transposed copy is not the output's transpose";
  const auto touched = [&](const std::vector<uint8_t>& bytes, size_t from) {
    size_t n = 0;
    for (size_t i = from; i < bytes.size(); ++i) n += bytes[i] != kSentinel;
    return n;
  };
  EXPECT_EQ(touched(got, out_bytes), 0u) << "bytes written past the output";
  // The inference form writes neither; the training form nothing past them.
  EXPECT_EQ(touched(got_t, training ? out_bytes : 0), 0u) << "the transposed copy";
  EXPECT_EQ(touched(got_d, training ? d_bytes : 0), 0u) << "the BF16 output";
}

TEST_F(FusedGemmGpu, EveryActivationAndShapeMatchesTheHostDefinition) {
  // Ragged m (not a multiple of the 64-row tile), n not a multiple of the 256-column tile, a
  // short and a longer k; the training form's m are multiples of 16.
  const Shape inference[] = {{200, 512, 256}, {77, 160, 64}, {512, 768, 1024}};
  const Shape training[] = {{208, 512, 256}, {80, 160, 64}, {512, 768, 1024}};
  std::mt19937_64 rng(7);
  for (std::string_view activation : gpu::gated_gemm_activations()) {
    for (const Shape& s : inference) check_product(activation, s, false, rng);
    for (const Shape& s : training) check_product(activation, s, true, rng);
  }
}

TEST_F(FusedGemmGpu, InterleavesGateAndLinearRows) {
  // 16-byte rows take the kernel, others the strided copies; a large one many blocks.
  for (const auto& [rows, row_bytes] :
       {std::pair<int64_t, int64_t>{6, 32}, {6, 24}, {4096, 1040}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows of " + std::to_string(row_bytes) + " bytes");
    std::vector<uint8_t> w(size_t(rows * row_bytes));
    for (size_t i = 0; i < w.size(); ++i)  // each row's bytes its index, mixed with the column
      w[i] = uint8_t(i / size_t(row_bytes) * 7 + i % size_t(row_bytes));
    DeviceArray& src = new_array(w.size());
    DeviceArray& dst = new_array(w.size());
    test::upload_bytes(src, w.data(), w.size());
    gpu::interleave_gated_rows(src.data(), dst.data(), rows, row_bytes, stream_);
    OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
    const std::vector<uint8_t> got = test::download_bytes(dst.data(), w.size());
    size_t wrong = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t from = r % 2 == 0 ? r / 2 : rows / 2 + r / 2;  // gate 0, linear 0, gate 1, ...
      for (int64_t c = 0; c < row_bytes; ++c)
        wrong += got[size_t(r * row_bytes + c)] != w[size_t(from * row_bytes + c)];
    }
    EXPECT_EQ(wrong, 0u);
  }
  DeviceArray& src = new_array(64);
  EXPECT_THROW(gpu::interleave_gated_rows(src.data(), src.data(), 5, 32, stream_), UsageError);
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
  gpu::GatedGemmArgs half_training = args;
  half_training.out_t = out.data();
  EXPECT_NE(message(half_training).find("needs both the transposed copy and the BF16 output"),
            std::string::npos);
  gpu::GatedGemmArgs ragged_training = args;
  ragged_training.m = 40;
  ragged_training.out_t = out.data(), ragged_training.d = out.data();
  EXPECT_NE(message(ragged_training).find("m=40 is not a multiple of 16"), std::string::npos);
  gpu::GatedGemmArgs misaligned_d = args;
  misaligned_d.out_t = out.data();
  misaligned_d.d = static_cast<char*>(out.data()) + 2;
  EXPECT_NE(message(misaligned_d).find("the BF16 output at a 16-byte aligned"), std::string::npos);
  gpu::GatedGemmArgs unknown = args;
  unknown.activation = "opfuse::pointwise_gelu";
  EXPECT_NE(message(unknown).find("no fused gated GEMM is compiled"), std::string::npos);
  OPFUSE_TEST_CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(test::bytes_other_than(out, 0x5A), 0u) << "a refused GEMM wrote its output";
}

}  // namespace
}  // namespace opfuse
