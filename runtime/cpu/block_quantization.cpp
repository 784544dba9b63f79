#include "block_quantization.h"

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace opfuse::cpu {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

void check_extents(std::span<const float> x, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0 || static_cast<int64_t>(x.size()) != rows * cols)
    throw std::invalid_argument("block quantization: the tensor's size is not rows * cols");
}

// Quantizes the stored matrix `stored` ([rows, cols], already in the copy's orientation) with
// blocks along its rows.
BlockQuantizedCopy quantize_stored(std::span<const float> stored, int64_t rows, int64_t cols,
                                   const BlockQuantParams& params) {
  BlockQuantizedCopy copy;
  copy.rows = rows;
  copy.cols = cols;
  copy.data.assign(size_t(rows * cols), 0);
  copy.scale_inv.assign(size_t(scale_grid_shape(rows, cols, params.two_d).size()), 0.0f);
  const float fp8_limit = fp8_max(params.format);
  const int64_t block_rows = params.two_d ? kScaleBlock : 1;
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    const int64_t r1 = std::min(rows, r0 + block_rows);
    for (int64_t c0 = 0; c0 < cols; c0 += kScaleBlock) {
      const int64_t c1 = std::min(cols, c0 + kScaleBlock);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          amax = std::fmax(amax, std::fabs(stored[size_t(r * cols + c)]));
      const float scale = block_scale(amax, fp8_limit, params.epsilon, params.power_of_2_scale,
                                      params.value_for_inf);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c)
          copy.data[size_t(r * cols + c)] =
              float_to_fp8(stored[size_t(r * cols + c)] * scale, params.format);
        if (!params.two_d || r == r0)
          copy.scale_inv[size_t(scale_grid_index(rows, cols, params.two_d, r, c0))] = 1.0f / scale;
      }
    }
  }
  return copy;
}

std::vector<float> transpose(std::span<const float> x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return t;
}

}  // namespace

float bf16_max_finite() { return bf16_to_float(0x7F7F); }
float fp16_max_finite() { return fp16_to_float(0x7BFF); }

float block_scale(float amax, float fp8_max, float epsilon, bool power_of_2_scale,
                  float value_for_inf) {
  // Why `<`: TE raises amax to epsilon this way, so a NaN amax (which compares false) stays NaN
  // and gets scale 1 just below.
  if (amax < epsilon) amax = epsilon;
  if (std::isinf(amax) || std::isnan(amax) || amax == 0.0f) return 1.0f;
  float scale = fp8_max / amax;  // IEEE division, as TE's __fdiv_rn
  // Why value_for_inf: a block of tiny values gives a quotient beyond FP32; TE caps it at the
  // source dtype's largest finite value.
  if (std::isinf(scale)) scale = value_for_inf;
  if (power_of_2_scale) scale = std::bit_cast<float>(std::bit_cast<uint32_t>(scale) & 0xFF800000u);
  return scale;
}

ScaleGridShape scale_grid_shape(int64_t rows, int64_t cols, bool two_d) {
  if (two_d) return {ceil_div(rows, kScaleBlock), round_up(ceil_div(cols, kScaleBlock), 4)};
  return {ceil_div(cols, kScaleBlock), round_up(rows, 4)};
}

int64_t scale_grid_index(int64_t rows, int64_t cols, bool two_d, int64_t r, int64_t c) {
  const ScaleGridShape grid = scale_grid_shape(rows, cols, two_d);
  if (two_d) return (r / kScaleBlock) * grid.inner + c / kScaleBlock;
  return (c / kScaleBlock) * grid.inner + r;
}

BlockQuantizedCopy block_quantize_rowwise(std::span<const float> x, int64_t rows, int64_t cols,
                                          const BlockQuantParams& params) {
  check_extents(x, rows, cols);
  return quantize_stored(x, rows, cols, params);
}

BlockQuantizedCopy block_quantize_columnwise(std::span<const float> x, int64_t rows, int64_t cols,
                                             const BlockQuantParams& params) {
  check_extents(x, rows, cols);
  // 1-D: 128 x 1 blocks down the columns of x are 1 x 128 blocks along the rows of x^T. 2-D: the
  // 128 x 128 blocks of x^T are those of x transposed, so this equals the row-wise copy
  // transposed, data and scales alike.
  const std::vector<float> t = transpose(x, rows, cols);
  return quantize_stored(t, cols, rows, params);
}

std::vector<float> block_dequantize(const BlockQuantizedCopy& copy, Fp8Format format, bool two_d) {
  std::vector<float> out(copy.data.size());
  for (int64_t r = 0; r < copy.rows; ++r)
    for (int64_t c = 0; c < copy.cols; ++c)
      out[size_t(r * copy.cols + c)] = fp8_to_float(copy.data[size_t(r * copy.cols + c)], format) *
                                       copy.scale_inv_at(r, c, two_d);
  return out;
}

std::vector<float> block_fake_quantize(std::span<const float> x, int64_t rows, int64_t cols,
                                       const BlockQuantParams& params, bool columnwise) {
  if (!columnwise) {
    return block_dequantize(block_quantize_rowwise(x, rows, cols, params), params.format,
                            params.two_d);
  }
  const std::vector<float> decoded = block_dequantize(
      block_quantize_columnwise(x, rows, cols, params), params.format, params.two_d);
  return transpose(decoded, cols, rows);
}

std::vector<float> block_scaled_gemm(const BlockQuantizedCopy& a, bool a_two_d,
                                     const BlockQuantizedCopy& b, bool b_two_d, Fp8Format a_format,
                                     Fp8Format b_format) {
  if (a.cols != b.cols) throw std::invalid_argument("block_scaled_gemm: k differs");
  const int64_t m = a.rows, n = b.rows, k = a.cols;
  std::vector<float> a_values(a.data.size()), b_values(b.data.size());
  for (size_t i = 0; i < a.data.size(); ++i) a_values[i] = fp8_to_float(a.data[i], a_format);
  for (size_t i = 0; i < b.data.size(); ++i) b_values[i] = fp8_to_float(b.data[i], b_format);
  std::vector<float> d(size_t(m * n), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float running = 0.0f;
      for (int64_t k0 = 0; k0 < k; k0 += kScaleBlock) {
        float partial = 0.0f;
        for (int64_t kk = k0; kk < std::min(k, k0 + kScaleBlock); ++kk)
          partial = std::fma(a_values[size_t(i * k + kk)], b_values[size_t(j * k + kk)], partial);
        const float scaled = partial * a.scale_inv_at(i, k0, a_two_d);
        running = std::fma(scaled, b.scale_inv_at(j, k0, b_two_d), running);
      }
      d[size_t(i * n + j)] = running;
    }
  }
  return d;
}

}  // namespace opfuse::cpu
