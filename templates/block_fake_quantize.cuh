// Block-scaled fake quantization (float8_block_scaling): x cast to FP8 with one scale per block
// (its own amax, block_cast.cuh's scale rule) and decoded again, in one pass:
// y = fp8(x * scale) * (1 / scale), rounded to Input, in x's layout. Two users:
//   - the quantize op under block scaling (1 x 128 blocks of a row);
//   - Float8 block scaling emulated where cuBLASLt has no block-scale GEMM modes (note "Emulated
//     block scaling" in docs/architecture.md): each GEMM operand's copy decoded for a BF16 GEMM,
//     1 x 128 blocks (row-wise copies), 128 x 1 blocks down the columns (column-wise copies of
//     1-D tensors, not transposed) or 128 x 128 blocks (2-D tensors: both copies are these).
// The CPU twin is cpu::block_fake_quantize (runtime/cpu/block_quantization.h): block_quantize_*,
// block_dequantize, the column-wise copy transposed back to x's layout.
//
// Entry point: block_fake_quantize<Input, Fp8, kBlocks>. Launch rules are in templates/README.md
// ("Block-scaled fake quantization").
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
  int cols;              // launch::kBlockRows: a multiple of 4 (every 4-element group whole)
};

namespace detail {

// One element through its block's scale: the conversion every FP8 output uses (apply_scale, RN,
// SATFINITE), decoded exactly, rounded to Input.
template <typename Input, typename Fp8>
__device__ __forceinline__ Input block_fake_quantize_one(float v, float scale, float scale_inv) {
  Fp8 code;
  code.__x = float_to_fp8_bits<Fp8>(apply_scale(v, scale));
  return from_float<Input>(__fmul_rn(to_float(code), scale_inv));
}

// 1 x 128 blocks: warp w of block b owns block row item b * warps + w (grid-stride): row
// item / block_row_count(cols), 128-column block item % count. A lane holds 4 consecutive
// elements of the block (lanes past a ragged block's end hold none).
template <typename Input, typename Fp8>
__device__ __forceinline__ void block_fake_quantize_rows(
    const BlockFakeQuantizeParams<Input, Fp8>& p, float fp8_max) {
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
    const float scale = block_scale(amax, fp8_max, p.epsilon, p.power_of_2_scale != 0,
                                    BlockScaleValueForInf<Input>::kValue);
    const float scale_inv = __fdiv_rn(1.0f, scale);
    if (active) {
      Input* y = p.y + row * p.cols + col;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        y[i] = block_fake_quantize_one<Input, Fp8>(v[i], scale, scale_inv);
    }
  }
}

// 128 x 1 blocks: thread t of block b owns column item b * threads + t (grid-stride): row strip
// item / cols, column item % cols, so a warp reads 32 neighbouring columns of each row. It reads
// its up to 128 elements twice (amax, then the cast: the second pass mostly hits the L1/L2)
// rather than holding 128 values in registers.
template <typename Input, typename Fp8>
__device__ __forceinline__ void block_fake_quantize_columns(
    const BlockFakeQuantizeParams<Input, Fp8>& p, float fp8_max) {
  const long long strips = launch::block_row_count(p.rows);
  const long long items = strips * p.cols;
  const long long threads = static_cast<long long>(gridDim.x) * launch::kBlockFakeQuantizeThreads;
  for (long long item =
           static_cast<long long>(blockIdx.x) * launch::kBlockFakeQuantizeThreads + threadIdx.x;
       item < items; item += threads) {
    const long long first = (item / p.cols) * launch::kBlockScaleLength;
    const long long col = item % p.cols;
    const long long end = first + launch::kBlockScaleLength < p.rows
                              ? first + launch::kBlockScaleLength
                              : static_cast<long long>(p.rows);
    float amax = 0.0f;
    for (long long r = first; r < end; ++r)
      amax = accumulate_amax(amax, to_float(p.x[r * p.cols + col]));
    const float scale = block_scale(amax, fp8_max, p.epsilon, p.power_of_2_scale != 0,
                                    BlockScaleValueForInf<Input>::kValue);
    const float scale_inv = __fdiv_rn(1.0f, scale);
    for (long long r = first; r < end; ++r) {
      p.y[r * p.cols + col] =
          block_fake_quantize_one<Input, Fp8>(to_float(p.x[r * p.cols + col]), scale, scale_inv);
    }
  }
}

// 128 x 128 blocks: block (bx, by) owns the tile of column tile bx and row tiles by, by +
// gridDim.y, ...; thread t owns tile column t % 128 and tile rows t / 128, + 2, ... (a warp reads
// 32 neighbouring columns of a row). The tile's amax: per thread, by shuffles within each warp,
// then over the warps through shared memory; then each thread reads its elements again and casts.
template <typename Input, typename Fp8>
__device__ __forceinline__ void block_fake_quantize_tiles(
    const BlockFakeQuantizeParams<Input, Fp8>& p, float fp8_max) {
  constexpr int kTile = launch::kBlockScaleLength;
  constexpr int kRowStep = launch::kBlockFakeQuantizeThreads / kTile;
  constexpr int kWarps = launch::kBlockFakeQuantizeWarps;
  __shared__ float warp_amax[kWarps];
  const int warp = threadIdx.x >> 5;
  const long long col = static_cast<long long>(blockIdx.x) * kTile + (threadIdx.x % kTile);
  const bool active_col = col < p.cols;
  for (long long tile = blockIdx.y; tile * kTile < p.rows; tile += gridDim.y) {
    const long long first = tile * kTile + threadIdx.x / kTile;
    const long long end =
        (tile + 1) * kTile < p.rows ? (tile + 1) * kTile : static_cast<long long>(p.rows);
    float amax = 0.0f;
    if (active_col) {
      for (long long r = first; r < end; r += kRowStep)
        amax = accumulate_amax(amax, to_float(p.x[r * p.cols + col]));
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    if ((threadIdx.x & 31) == 0) warp_amax[warp] = amax;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[w]);
    __syncthreads();  // warp_amax is written again by the next tile
    const float scale = block_scale(amax, fp8_max, p.epsilon, p.power_of_2_scale != 0,
                                    BlockScaleValueForInf<Input>::kValue);
    const float scale_inv = __fdiv_rn(1.0f, scale);
    if (active_col) {
      for (long long r = first; r < end; r += kRowStep) {
        p.y[r * p.cols + col] =
            block_fake_quantize_one<Input, Fp8>(to_float(p.x[r * p.cols + col]), scale, scale_inv);
      }
    }
  }
}

}  // namespace detail

// kBlocks: launch::kBlockRows (1 x 128), kBlockColumns (128 x 1), kBlockTiles (128 x 128).
// Block: launch::kBlockFakeQuantizeThreads (256) threads; grids in launch_rules.h
// (block_fake_quantize_grid_x / _y).
template <typename Input, typename Fp8, int kBlocks = launch::kBlockRows>
__global__ void __launch_bounds__(launch::kBlockFakeQuantizeThreads)
    block_fake_quantize(BlockFakeQuantizeParams<Input, Fp8> p) {
  static_assert(DtypeTraits<Fp8>::kIsFp8, "block_fake_quantize casts through an FP8 type");
  static_assert(kBlocks == launch::kBlockRows || kBlocks == launch::kBlockColumns ||
                    kBlocks == launch::kBlockTiles,
                "kBlocks is launch::kBlockRows, kBlockColumns or kBlockTiles");
  constexpr float kFp8Max = DtypeTraits<Fp8>::kMax;
  if constexpr (kBlocks == launch::kBlockRows) {
    detail::block_fake_quantize_rows(p, kFp8Max);
  } else if constexpr (kBlocks == launch::kBlockColumns) {
    detail::block_fake_quantize_columns(p, kFp8Max);
  } else {
    detail::block_fake_quantize_tiles(p, kFp8Max);
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_BLOCK_FAKE_QUANTIZE_CUH_
