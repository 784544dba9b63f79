// Block scaling on the CPU (TE's Float8BlockScaling, DeepSeek-V3's recipe): one FP32 scale per
// 1 x 128 block along a row (inputs and gradients) or per 128 x 128 block (weights), computed
// from the block's own amax. This is the oracle the GPU's block-cast kernels
// (templates/block_cast.cuh) are checked against bit for bit, and the CPU reference's block cast.
//
// Note "Block scale grids": a quantized copy is a stored row-major matrix [rows, cols] (the
// row-wise copy: the source as is; the column-wise copy: the source transposed) whose blocks run
// along its rows: 1 x 128 (1-D) or 128 x 128 (2-D), the last block of a row or column ragged. Its
// scale_inv grid is laid out as cuBLASLt's VEC128_32F / BLK128x128_32F scale modes read it:
//   1-D: [ceil(cols / 128)][roundup(rows, 4)]            entry (r, cb)  at cb * stride + r
//   2-D: [ceil(rows / 128)][roundup(ceil(cols / 128), 4)] entry (rb, cb) at rb * stride + cb
// (stride = the inner extent). The padding entries (rows up to the multiple of 4) belong to no
// block: kernels leave them unwritten and cuBLASLt never reads them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "numerics.h"  // same directory: works with or without runtime/ on the include path

namespace opfuse::cpu {

inline constexpr int kScaleBlock = 128;  // block length of Float8BlockScaling

struct BlockQuantParams {
  Fp8Format format = Fp8Format::E4M3;
  bool two_d = false;            // 128 x 128 blocks (weights) instead of 1 x 128
  bool power_of_2_scale = true;  // TE's default for Float8BlockScaling
  float epsilon = 0.0f;          // amax floor
  // The scale an infinite quotient becomes: the largest finite value of the source's dtype
  // (bf16: 0x7F7F, fp16: 65504, fp32: FLT_MAX), as TE's block quantizers pass it.
  float value_for_inf = 3.38953139e38f;
};

// The largest finite value of a source dtype, for BlockQuantParams::value_for_inf.
float bf16_max_finite();
float fp16_max_finite();

// The scale of one block (TE's compute_scale_from_amax): amax raised to epsilon (a NaN amax stays
// NaN); amax Inf, NaN or 0 gives 1; else fp8_max / amax (IEEE division), an infinite quotient
// becoming value_for_inf; with power_of_2_scale the mantissa bits cleared (rounded down).
float block_scale(float amax, float fp8_max, float epsilon, bool power_of_2_scale,
                  float value_for_inf);

// The extents of the scale_inv grid of a stored [rows, cols] copy (note above).
struct ScaleGridShape {
  int64_t outer = 0;
  int64_t inner = 0;  // the stride; includes the padding
  int64_t size() const { return outer * inner; }
  friend bool operator==(const ScaleGridShape&, const ScaleGridShape&) = default;
};
ScaleGridShape scale_grid_shape(int64_t rows, int64_t cols, bool two_d);
// Index into the grid of the scale of element (r, c) of the stored copy.
int64_t scale_grid_index(int64_t rows, int64_t cols, bool two_d, int64_t r, int64_t c);

// One quantized copy: FP8 bits of the stored matrix and its scale_inv grid (padding entries 0).
struct BlockQuantizedCopy {
  int64_t rows = 0;  // of the stored matrix
  int64_t cols = 0;
  std::vector<uint8_t> data;     // [rows, cols] FP8 bits
  std::vector<float> scale_inv;  // scale_grid_shape(rows, cols, two_d).size()
  float scale_inv_at(int64_t r, int64_t c, bool two_d) const {
    return scale_inv[size_t(scale_grid_index(rows, cols, two_d, r, c))];
  }
};

// Quantizes x ([rows, cols] row-major, values already rounded to the source dtype):
//   rowwise: blocks of 1 x 128 (2-D: 128 x 128) along the rows of x; data [rows, cols].
//   columnwise: the transposed copy [cols, rows]. 1-D: quantized again from x with 128 x 1 blocks
//     down the columns of x (1 x 128 along the rows of the stored copy); 2-D: exactly the row-wise
//     data and scales transposed (the blocks are the same).
// Each element: q = fp8_satfinite_rne(x * scale) with scale = block_scale(block amax, ...), the
// block amax = fmaxf over |x| (NaN elements skipped; they cast to NaN); scale_inv = 1 / scale.
BlockQuantizedCopy block_quantize_rowwise(std::span<const float> x, int64_t rows, int64_t cols,
                                          const BlockQuantParams& params);
BlockQuantizedCopy block_quantize_columnwise(std::span<const float> x, int64_t rows, int64_t cols,
                                             const BlockQuantParams& params);

// The decoded values of a copy: fp8(q) * scale_inv of its block, [rows, cols] of the stored copy.
std::vector<float> block_dequantize(const BlockQuantizedCopy& copy, Fp8Format format, bool two_d);

// Note "Emulated block scaling" (docs/architecture.md): one copy quantized and decoded in x's own
// layout ([rows, cols], values already rounded to the source dtype), as the BF16 GEMMs of an
// architecture without block-scale modes read it. columnwise = false: the row-wise copy's blocks
// (1 x 128, or 128 x 128 with params.two_d); true: the column-wise copy's (128 x 1 down the
// columns, or 128 x 128), decoded and transposed back, so not transposed. With 2-D blocks both
// give the same values. The GPU twin is templates/block_fake_quantize.cuh.
std::vector<float> block_fake_quantize(std::span<const float> x, int64_t rows, int64_t cols,
                                       const BlockQuantParams& params, bool columnwise);

// The block-scaled GEMM's semantics (TE's bit-exact reference of cuBLASLt's block scale modes):
//   d[i, j] = sum over K blocks kb of fma(partial(i, j, kb) * sa(i, kb), sb(j, kb), running)
// where partial is the FP32 dot product of the codes over the 128-wide block kb, in index order,
// and the running sum starts at 0. a is [m, k], b is [n, k] (both K contiguous, cuBLASLt's TN);
// a_two_d / b_two_d say how each operand's grid is laid out. Returns d [m, n] in FP32.
std::vector<float> block_scaled_gemm(const BlockQuantizedCopy& a, bool a_two_d,
                                     const BlockQuantizedCopy& b, bool b_two_d, Fp8Format a_format,
                                     Fp8Format b_format);

}  // namespace opfuse::cpu
