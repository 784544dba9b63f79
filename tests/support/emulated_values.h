// Host-side data for the CPU tests that run kernel templates under cuda_host_emulation.h
// (test_block_fake_quantize_emulated, test_micro_scale_emulated, test_block_summary_emulated):
// conversions between fp32 and a kernel's input dtype, and the random inputs with special values
// the quantization tests share (the region-scaled values also test_micro_scale_gpu's).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpu/numerics.h"

namespace opfuse::test::emulation {

// A stored element as fp32 (exact), and fp32 rounded to the dtype (bf16: to nearest even).
inline float value_of(float v) { return v; }
inline float value_of(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
T cast_to(float v);
template <>
inline float cast_to(float v) {
  return v;
}
template <>
inline __nv_bfloat16 cast_to(float v) {
  return __float2bfloat16_rn(v);
}

// rows x cols values: N(0, 1) times 2^e per 16 x 32 region (e in [-20, 20]), drawn from rng.
inline std::vector<float> region_scaled_values(int rows, int cols, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  const int region_cols = (cols + 31) / 32;
  std::vector<int> exponents(size_t((rows + 15) / 16) * size_t(region_cols));
  for (int& e : exponents) e = exponent(rng);
  std::vector<float> v(size_t(rows) * size_t(cols));
  auto at = [&](int r, int c) -> float& { return v[size_t(r) * size_t(cols) + size_t(c)]; };
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      at(r, c) = std::ldexp(normal(rng), exponents[size_t(r / 16) * region_cols + size_t(c / 32)]);
  return v;
}

// region_scaled_values from a generator seeded with `seed`. With `special` (and at least 32 x 32):
// a zero block x block block (rows [0, block), columns [block, 2 * block)), zero 1 x block blocks
// (every fifth row's first block), subnormal rows, +-Inf, NaN, the largest bf16 and a huge value.
inline std::vector<float> random_values(int rows, int cols, uint64_t seed, bool special,
                                        int block) {
  std::mt19937_64 rng(seed);
  std::vector<float> v = region_scaled_values(rows, cols, rng);
  auto at = [&](int r, int c) -> float& { return v[size_t(r) * size_t(cols) + size_t(c)]; };
  if (!special || rows < 32 || cols < 32) return v;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      if (c >= block && c < 2 * block && r < block) at(r, c) = 0.0f;
      if (r % 5 == 2 && c < block) at(r, c) = 0.0f;
      if (r % 7 == 4) at(r, c) = std::ldexp(float((r + c) % 13 + 1), -136) * (c % 2 ? -1.0f : 1.0f);
    }
  }
  at(1, 3) = std::numeric_limits<float>::infinity();
  at(rows - 1, cols - 1) = -std::numeric_limits<float>::infinity();
  at(0, 7) = std::numeric_limits<float>::quiet_NaN();
  at(rows / 2, cols / 2) = std::numeric_limits<float>::quiet_NaN();
  at(rows - 3, 5) = cpu::bf16_to_float(0x7F7F);
  at(rows - 4, 9) = -1e30f;
  return v;
}

}  // namespace opfuse::test::emulation
