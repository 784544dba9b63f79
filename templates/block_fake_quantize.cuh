// The quantize op under block scaling (float8_block_scaling): x cast to FP8 with one scale per
// 1 x 128 block of a row (its own amax, block_cast.cuh's scale rule) and decoded again, in one
// pass: y = fp8(x * scale) * (1 / scale), rounded to Input. The CPU twin is cpu::fake_quantize of
// a block-scaled quantizer (reference/cpu_quantizers.h): block_quantize_rowwise, then
// block_dequantize.
//
// Entry point: block_fake_quantize<Input, Fp8>. Launch rules are in templates/README.md
// ("Block-scaled cast").
#ifndef OPFUSE_TEMPLATES_BLOCK_FAKE_QUANTIZE_CUH_
#define OPFUSE_TEMPLATES_BLOCK_FAKE_QUANTIZE_CUH_

#include "block_cast.cuh"

namespace opfuse {

// Fp8 is unused by the fields: the params struct takes the kernel's template arguments, as every
// family's does (templates/README.md, "Conventions").
template <typename Input, typename Fp8>
struct BlockFakeQuantizeParams {
  const Input* x;        // [rows, cols]
  Input* y;              // [rows, cols]; may be x
  float epsilon;         // amax floor
  int power_of_2_scale;  // nonzero: scales rounded down to a power of 2
  int rows;              // any >= 0
  int cols;              // multiple of 4 (every 4-element group of a block whole)
};

// Block: launch::kBlockFakeQuantizeWarps warps; warp w of block b owns block row item
// b * warps + w (grid-stride): row item / block_row_count(cols), 128-column block item % count.
// A lane holds 4 consecutive elements of the block (lanes past a ragged block's end hold none).
template <typename Input, typename Fp8>
__global__ void __launch_bounds__(launch::kBlockFakeQuantizeWarps * 32)
    block_fake_quantize(BlockFakeQuantizeParams<Input, Fp8> p) {
  static_assert(DtypeTraits<Fp8>::kIsFp8, "block_fake_quantize casts through an FP8 type");
  constexpr float kFp8Max = DtypeTraits<Fp8>::kMax;
  const int lane = threadIdx.x & 31;
  const long long blocks_per_row = launch::block_row_count(p.cols);
  const long long items = static_cast<long long>(p.rows) * blocks_per_row;
  const long long warps = static_cast<long long>(gridDim.x) * launch::kBlockFakeQuantizeWarps;
  for (long long item = static_cast<long long>(blockIdx.x) * launch::kBlockFakeQuantizeWarps +
                        (threadIdx.x >> 5);
       item < items; item += warps) {
    const long long row = item / blocks_per_row;
    const int col = static_cast<int>(item % blocks_per_row) * launch::kBlockScaleLength + 4 * lane;
    const bool active = col < p.cols;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float amax = 0.0f;
    if (active) {
      const Input* x = p.x + row * p.cols + col;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[i] = to_float(x[i]);
        amax = accumulate_amax(amax, v[i]);
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    const float scale = detail::block_scale(amax, kFp8Max, p.epsilon, p.power_of_2_scale != 0,
                                            detail::BlockScaleValueForInf<Input>::kValue);
    const float scale_inv = __fdiv_rn(1.0f, scale);
    if (active) {
      // The conversion every FP8 output uses (apply_scale, RN, SATFINITE), decoded exactly.
      const Vec<Fp8, 4> codes = float_to_vec<Fp8, 4>(v, scale);
      Input* y = p.y + row * p.cols + col;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        y[i] = from_float<Input>(__fmul_rn(to_float(codes.elems[i]), scale_inv));
    }
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_BLOCK_FAKE_QUANTIZE_CUH_
