// Block summaries (note "Block summaries" in runtime/cpu/block_summary.h, the CPU twin): one
// quantized copy of a block-scaled or micro-scaled quantizer reduced into a BlockSummaryRecord:
// the least and greatest block decode scale (scale_inv), the blocks whose amax is 0, and NVFP4's
// tensor scale. Launched by the runtime (runtime/gpu/block_summaries.h) right after the plan step
// that made the copy, on the same stream, only for sessions that ask (SessionOptions::
// block_summaries): a pass over the copy's source that a normal run never pays.
//
// Entry points:
//   float8_block_summary<Fp8, kTwoD>: a Float8 block-scaled copy, read alone: its scale_inv
//     values from the grid the cast wrote (note "Block scale grids" in
//     runtime/cpu/block_quantization.h; padding entries are no block's), its zero blocks from its
//     codes (all +-0 or NaN). One warp per block.
//   micro_block_summary<Input, kFormat, kColumnwise, kTwoD, kRht>: MXFP8 / NVFP4, whose emulated
//     casts store no scales (micro_scale.cuh writes only the decoded copy): each block's amax and
//     scale are computed again from the source with common/micro_scale_math.cuh's functions, the
//     ones micro_scale_cast computes them with (the Hadamard transform first for kRht), so they
//     are the cast's bit for bit. One thread per block.
// Launch: launch::kBlockSummaryThreads threads; grid x = launch::block_summary_grid_x(work items:
// warps for float8_block_summary, threads for micro_block_summary), a grid-stride loop. The record
// must be zeroed before the launch (every field's "nothing yet" is 0).
#ifndef OPFUSE_TEMPLATES_BLOCK_SUMMARY_CUH_
#define OPFUSE_TEMPLATES_BLOCK_SUMMARY_CUH_

#include "common/fp8.cuh"
#include "common/launch_rules.h"
#include "common/micro_scale_math.cuh"
#include "common/types.cuh"

namespace opfuse {

// One copy's summary (32 bytes; host mirror in runtime/gpu/block_summaries.h). scale_inv values
// are never negative, so their bits order as their values: the greatest is an atomicMax of the
// bits, the least an atomicMax of the complemented bits (0, the zeroed record, is "none yet").
struct BlockSummaryRecord {
  unsigned int least_complement;  // ~bits of the least scale_inv
  unsigned int greatest_bits;     // bits of the greatest scale_inv
  unsigned long long zero_blocks;
  float tensor_scale;  // NVFP4: the S_enc the cast read; 0 otherwise
  unsigned int unused[3];
};

template <typename Input>
struct BlockSummaryParams {
  // micro_block_summary: the copy's source [rows, cols]; float8_block_summary: the FP8 copy
  // itself, [rows, cols] as stored (the column-wise copy transposed).
  const Input* x;
  const float* scale_inv;     // float8_block_summary: the copy's scale_inv grid
  const float* tensor_scale;  // micro_block_summary, NVFP4: S_enc; nullptr otherwise
  BlockSummaryRecord* record;
  long long rows;
  long long cols;
};

namespace detail {

// One thread's blocks so far.
struct SummaryPart {
  unsigned int least_bits = 0xFFFFFFFFu;
  unsigned int greatest_bits = 0u;
  unsigned int zero_blocks = 0u;

  __device__ __forceinline__ void add(bool zero, float scale_inv) {
    const unsigned int bits = __float_as_uint(scale_inv);
    least_bits = bits < least_bits ? bits : least_bits;
    greatest_bits = bits > greatest_bits ? bits : greatest_bits;
    if (zero) ++zero_blocks;
  }
  // Every lane of the warp calls it; lane 0 adds the warp's part to the record.
  __device__ __forceinline__ void commit(BlockSummaryRecord* record) const {
    unsigned int least_complement = ~least_bits, greatest = greatest_bits, zeros = zero_blocks;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const unsigned int other_least = __shfl_xor_sync(0xFFFFFFFFu, least_complement, offset);
      const unsigned int other_greatest = __shfl_xor_sync(0xFFFFFFFFu, greatest, offset);
      least_complement = other_least > least_complement ? other_least : least_complement;
      greatest = other_greatest > greatest ? other_greatest : greatest;
      zeros += __shfl_xor_sync(0xFFFFFFFFu, zeros, offset);
    }
    if ((threadIdx.x & 31) != 0) return;
    if (least_complement != 0u) atomicMax(&record->least_complement, least_complement);
    if (greatest != 0u) atomicMax(&record->greatest_bits, greatest);
    if (zeros != 0u) atomicAdd(&record->zero_blocks, static_cast<unsigned long long>(zeros));
  }
};

// MXFP8's element format, whose largest value divides the block amax.
template <int kFormat>
struct MicroSummaryFp8 {
  using Type = __nv_fp8_e4m3;
};
template <>
struct MicroSummaryFp8<launch::kMicroScaleE5M2> {
  using Type = __nv_fp8_e5m2;
};

template <typename Input>
__device__ __forceinline__ void record_tensor_scale(const BlockSummaryParams<Input>& p) {
  if (p.tensor_scale != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    p.record->tensor_scale = *p.tensor_scale;
}

}  // namespace detail

// The blocks of the stored copy (x: the FP8 copy itself, rows x cols as stored): 1 x 128 along
// its rows, 128 x 128 with kTwoD, ragged at the edges; block (bi, bj) is warp work item
// bi * column_blocks + bj. Its zero test reads the codes (runtime/cpu/block_summary.h: all +-0 or
// NaN), so the copy's source need not exist (a cast folded into an activation keeps it in
// registers).
template <typename Fp8, bool kTwoD>
__global__ void __launch_bounds__(launch::kBlockSummaryThreads)
    float8_block_summary(BlockSummaryParams<Fp8> p) {
  static_assert(DtypeTraits<Fp8>::kIsFp8, "the copy's codes");
  constexpr long long kBlock = launch::kBlockScaleLength;
  constexpr long long kRows = kTwoD ? kBlock : 1;
  const long long column_blocks = (p.cols + kBlock - 1) / kBlock;
  const long long blocks = (p.rows + kRows - 1) / kRows * column_blocks;
  const long long inner = launch::block_scale_grid_inner(p.rows, p.cols, kTwoD);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
  detail::SummaryPart part;
  for (long long block = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       block < blocks; block += warps) {
    const long long r0 = block / column_blocks * kRows, c0 = block % column_blocks * kBlock;
    // At most 128 x 128: int arithmetic, no 64-bit division in the loops.
    const int height = static_cast<int>(launch::min_of(kRows, p.rows - r0));
    const int width = static_cast<int>(launch::min_of(kBlock, p.cols - c0));
    const Fp8* first = p.x + r0 * p.cols + c0;
    unsigned int informative = 0u;  // a code that is neither +-0 nor NaN
    for (int r = 0; r < height; ++r) {
      for (int c = lane; c < width; c += 32) {
        const float v = to_float(first[static_cast<long long>(r) * p.cols + c]);
        if (v != 0.0f && !is_nan_float(v)) informative = 1u;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      informative |= __shfl_xor_sync(0xFFFFFFFFu, informative, offset);
    if (lane != 0) continue;
    const long long entry = kTwoD ? r0 / kBlock * inner + c0 / kBlock : c0 / kBlock * inner + r0;
    part.add(informative == 0u, p.scale_inv[entry]);
  }
  part.commit(p.record);
}

// Blocks in the source's orientation: 1 x B (row-wise) or B x 1 (column-wise), B = 32 (MXFP8) or
// 16 (NVFP4); 16 x 16 for NVFP4's kTwoD. The blocked dimensions are whole blocks (the bind checks
// of the casts). Block (bi, bj) is thread work item bi * column_blocks + bj, so neighbouring
// threads read neighbouring blocks of a row group.
template <typename Input, int kFormat, bool kColumnwise, bool kTwoD, bool kRht>
__global__ void __launch_bounds__(launch::kBlockSummaryThreads)
    micro_block_summary(BlockSummaryParams<Input> p) {
  constexpr int kBlock = launch::micro_scale_block_size(kFormat);
  constexpr int kRows = kTwoD || kColumnwise ? kBlock : 1;
  constexpr int kCols = kTwoD || !kColumnwise ? kBlock : 1;
  static_assert(!kRht || (kColumnwise && !kTwoD && kFormat == launch::kMicroScaleE2M1),
                "the Hadamard transform is NVFP4's, of 16 x 1 column-wise blocks");
  static_assert(!kTwoD || kFormat == launch::kMicroScaleE2M1, "2-D blocks are NVFP4's");
  detail::record_tensor_scale(p);
  const long long column_blocks = p.cols / kCols;
  const long long blocks = p.rows / kRows * column_blocks;
  const float tensor_scale =
      kFormat == launch::kMicroScaleE2M1 && p.tensor_scale != nullptr ? *p.tensor_scale : 1.0f;
  const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
  detail::SummaryPart part;
  for (long long block = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       block < blocks; block += threads) {
    const long long r0 = block / column_blocks * kRows, c0 = block % column_blocks * kCols;
    float amax = 0.0f;
    if constexpr (kRht) {
      float v[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = to_float(p.x[(r0 + k) * p.cols + c0]);
      rht16(v);
#pragma unroll
      for (int k = 0; k < 16; ++k) amax = accumulate_amax(amax, v[k]);
    } else {
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          amax = accumulate_amax(amax, to_float(p.x[(r0 + r) * p.cols + c0 + c]));
      }
    }
    float scale_inv = 0.0f;
    if constexpr (kFormat == launch::kMicroScaleE2M1) {
      __nv_fp8_e4m3 block_scale;
      block_scale.__x = nvfp4_block_scale(amax, tensor_scale);
      scale_inv = static_cast<float>(block_scale);
    } else {
      using Fp8 = typename detail::MicroSummaryFp8<kFormat>::Type;
      scale_inv = pow2_float(e8m0_round_up(__fdiv_rn(amax, DtypeTraits<Fp8>::kMax)) - 127);
    }
    part.add(amax == 0.0f, scale_inv);
  }
  part.commit(p.record);
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_BLOCK_SUMMARY_CUH_
