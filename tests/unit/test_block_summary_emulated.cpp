// The block summary kernels (templates/block_summary.cuh) run on the host through
// tests/support/cuda_host_emulation.h, against the CPU summaries (runtime/cpu/block_summary.h)
// exactly: Float8 copies of both orientations and 2-D blocks over ragged shapes (the kernel reads
// the oracle's scale grids, padding poisoned), MXFP8 of both formats and copies, NVFP4's 1-D,
// 2-D and Hadamard-transformed copies with a tensor scale, bf16 and fp32 sources, with zero
// blocks, NaN, Inf and tiny blocks, and grids smaller than the work (the grid-stride loops).
// This checks the kernels' indexing and arithmetic where no GPU is present;
// tests/gpu/test_block_summaries_gpu.cpp checks them on a GPU through the runtime.
#include "cuda_host_emulation.h"  // first: the device built-ins the template uses
// clang-format off
#include "../../templates/block_summary.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/block_summary.h"
#include "cpu/numerics.h"
#include "emulated_values.h"

namespace opfuse {
namespace {

using test::emulation::emulate_launch;

using test::emulation::cast_to;
using test::emulation::value_of;

// N(0, 1) times 2^e per 16-row band; zero blocks (rows 0..15, and columns 32..63 of rows 16..47),
// a tiny band, NaN and Inf elements.
std::vector<float> values(int rows, int cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(size_t(rows) * size_t(cols));
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      float x = std::ldexp(normal(rng), (r / 16) % 7 - 3);
      if (r < 16 || (r >= 16 && r < 48 && c >= 32 && c < 64)) x = 0.0f;
      if (r >= 48 && r < 64) x = std::ldexp(x, -30);
      v[size_t(r) * size_t(cols) + size_t(c)] = x;
    }
  }
  if (rows > 70 && cols > 10) {
    v[size_t(70) * size_t(cols) + 3] = std::numeric_limits<float>::quiet_NaN();
    v[size_t(rows - 1) * size_t(cols) + size_t(cols - 1)] = -std::numeric_limits<float>::infinity();
  }
  return v;
}

template <typename Input>
std::vector<Input> source(int rows, int cols, uint64_t seed, std::vector<float>& stored) {
  const std::vector<float> raw = values(rows, cols, seed);
  std::vector<Input> x(raw.size());
  stored.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    x[i] = cast_to<Input>(raw[i]);
    stored[i] = value_of(x[i]);
  }
  return x;
}

cpu::BlockSummary summary_of(const BlockSummaryRecord& r, int64_t blocks) {
  cpu::BlockSummary s;
  s.blocks = blocks;
  s.zero_blocks = int64_t(r.zero_blocks);
  if (blocks > 0) {
    s.scale_inv_min = std::bit_cast<float>(~r.least_complement);
    s.scale_inv_max = std::bit_cast<float>(r.greatest_bits);
  }
  return s;
}

std::string text(const cpu::BlockSummary& s) {
  return std::to_string(s.blocks) + " blocks, " + std::to_string(s.zero_blocks) + " zero, " +
         std::to_string(std::bit_cast<uint32_t>(s.scale_inv_min)) + " .. " +
         std::to_string(std::bit_cast<uint32_t>(s.scale_inv_max)) + " (bits)";
}

// The kernel reads the FP8 copy itself (codes and grid), as stored.
template <typename Fp8, bool kColumnwise, bool kTwoD>
int64_t check_float8(int rows, int cols, unsigned int grid, float epsilon = 0.0f) {
  std::vector<float> stored;
  (void)source<__nv_bfloat16>(rows, cols, uint64_t(rows * 7 + cols), stored);
  const cpu::Fp8Format format =
      sizeof(Fp8) == 1 && kIsSame<Fp8, __nv_fp8_e5m2> ? cpu::Fp8Format::E5M2 : cpu::Fp8Format::E4M3;
  cpu::BlockQuantParams params;
  params.format = format;
  params.two_d = kTwoD;
  params.epsilon = epsilon;
  params.value_for_inf = cpu::bf16_max_finite();
  const cpu::BlockQuantizedCopy copy =
      kColumnwise ? cpu::block_quantize_columnwise(stored, rows, cols, params)
                  : cpu::block_quantize_rowwise(stored, rows, cols, params);
  const cpu::BlockSummary want = cpu::summarize_block_copy(copy, format, kTwoD);
  // Padding entries (0 in the oracle) poisoned: a kernel reading one would show it.
  std::vector<float> grid_values = copy.scale_inv;
  const cpu::ScaleGridShape shape = cpu::scale_grid_shape(copy.rows, copy.cols, kTwoD);
  const int64_t used = kTwoD ? (copy.cols + 127) / 128 : copy.rows;
  for (int64_t o = 0; o < shape.outer; ++o)
    for (int64_t i = used; i < shape.inner; ++i) grid_values[size_t(o * shape.inner + i)] = -7.0f;
  std::vector<Fp8> codes(copy.data.size());
  for (size_t i = 0; i < codes.size(); ++i) codes[i].__x = copy.data[i];
  BlockSummaryRecord record{};
  const BlockSummaryParams<Fp8> p{codes.data(), grid_values.data(), nullptr,
                                  &record,      copy.rows,          copy.cols};
  emulate_launch(&float8_block_summary<Fp8, kTwoD>, {grid, 1, 1}, launch::kBlockSummaryThreads, p);
  EXPECT_EQ(text(summary_of(record, want.blocks)), text(want))
      << rows << " x " << cols << (kColumnwise ? " column-wise" : " row-wise")
      << (kTwoD ? " 2-D" : "") << ", epsilon " << epsilon;
  EXPECT_EQ(record.tensor_scale, 0.0f);
  return want.zero_blocks;
}

TEST(BlockSummaryEmulated, Float8CopiesOfRaggedShapes) {
  int64_t zero_blocks = 0;
  zero_blocks += check_float8<__nv_fp8_e4m3, false, false>(96, 200, 2);
  zero_blocks += check_float8<__nv_fp8_e4m3, true, false>(96, 200, 1);
  zero_blocks += check_float8<__nv_fp8_e5m2, false, true>(130, 260, 3);
  zero_blocks += check_float8<__nv_fp8_e4m3, true, true>(130, 260, 1);
  zero_blocks += check_float8<__nv_fp8_e5m2, true, false>(75, 129, 1);
  // amax_epsilon far above the tiny band: its blocks round to zero codes.
  const int64_t plain = check_float8<__nv_fp8_e4m3, false, false>(96, 200, 1);
  const int64_t with_epsilon = check_float8<__nv_fp8_e4m3, false, false>(96, 200, 1, 1e3f);
  EXPECT_GT(with_epsilon, plain);
  EXPECT_GT(zero_blocks, 0);
}

template <typename Input, int kFormat, bool kColumnwise, bool kTwoD = false, bool kRht = false>
void check_micro(int rows, int cols, unsigned int grid) {
  std::vector<float> stored;
  const std::vector<Input> x = source<Input>(rows, cols, uint64_t(rows * 5 + cols), stored);
  cpu::BlockSummary want;
  float tensor_scale = 0.0f;
  if constexpr (kFormat == launch::kMicroScaleE2M1) {
    float amax = 0.0f;
    for (float v : stored)
      if (std::isfinite(v)) amax = std::fmax(amax, std::fabs(v));
    tensor_scale = cpu::nvfp4_tensor_scale(kRht ? cpu::rht_amax(stored, rows, cols) : amax);
    cpu::Nvfp4Params params;
    params.columnwise = kColumnwise;
    params.two_d = kTwoD;
    params.rht = kRht;
    want = cpu::summarize_nvfp4_copy(stored,
                                     cpu::nvfp4_quantize(stored, rows, cols, tensor_scale, params));
  } else {
    const cpu::Fp8Format format =
        kFormat == launch::kMicroScaleE4M3 ? cpu::Fp8Format::E4M3 : cpu::Fp8Format::E5M2;
    want = cpu::summarize_mxfp8_copy(stored,
                                     cpu::mxfp8_quantize(stored, rows, cols, format, kColumnwise));
  }
  BlockSummaryRecord record{};
  const BlockSummaryParams<Input> p{
      x.data(), nullptr, kFormat == launch::kMicroScaleE2M1 ? &tensor_scale : nullptr,
      &record,  rows,    cols};
  emulate_launch(&micro_block_summary<Input, kFormat, kColumnwise, kTwoD, kRht>, {grid, 1, 1},
                 launch::kBlockSummaryThreads, p);
  EXPECT_EQ(text(summary_of(record, want.blocks)), text(want))
      << "format " << kFormat << ", " << rows << " x " << cols
      << (kColumnwise ? " column-wise" : " row-wise") << (kTwoD ? " 2-D" : "")
      << (kRht ? " RHT" : "");
  EXPECT_EQ(std::bit_cast<uint32_t>(record.tensor_scale), std::bit_cast<uint32_t>(tensor_scale));
}

TEST(BlockSummaryEmulated, Mxfp8CopiesOfBothFormats) {
  check_micro<__nv_bfloat16, launch::kMicroScaleE4M3, false>(96, 128, 1);
  check_micro<float, launch::kMicroScaleE4M3, true>(96, 64, 2);
  check_micro<__nv_bfloat16, launch::kMicroScaleE5M2, false>(80, 96, 1);
  check_micro<__nv_bfloat16, launch::kMicroScaleE5M2, true>(96, 96, 1);
}

TEST(BlockSummaryEmulated, Nvfp4CopiesTwoDimensionalAndHadamard) {
  check_micro<__nv_bfloat16, launch::kMicroScaleE2M1, false>(96, 80, 1);
  check_micro<float, launch::kMicroScaleE2M1, true>(96, 48, 2);
  check_micro<__nv_bfloat16, launch::kMicroScaleE2M1, false, true>(96, 64, 1);
  check_micro<__nv_bfloat16, launch::kMicroScaleE2M1, true, true>(80, 48, 1);
  check_micro<__nv_bfloat16, launch::kMicroScaleE2M1, true, false, true>(96, 64, 1);
}

}  // namespace
}  // namespace opfuse
