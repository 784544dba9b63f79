// LayerNorm and RMSNorm, forward and backward.
//
// Forward: input bf16/fp16/fp32, gamma/beta of the input dtype, fp32 math; output of the input
// dtype, or FP8 (scale pointer, amax of y before scaling) with an optional transposed FP8 copy
// [hidden, rows] written by the same kernel (Hopper FP8 GEMMs take only the TN layout); mean and
// rstd (fp32) saved for the backward. zero_centered_gamma multiplies by (gamma + 1).
// Under float8_block_scaling (layernorm_block_fwd, rmsnorm_block_fwd): the output's 1 x 128
// block-scaled row-wise copy and its scale_inv grid, from the output rounded to the input dtype
// (what the norm and block_cast_transpose write unfused), and with kWriteColumnwiseSource that
// rounded output too, which block_cast_transpose reads for the 128 x 1 column-wise copy.
// Backward: norm_backward.cuh, included here, so this header gives every norm entry point.
//
// Entry points: layernorm_fwd, rmsnorm_fwd, layernorm_block_fwd, rmsnorm_block_fwd; layernorm_bwd,
// rmsnorm_bwd and reduce_column_partials through norm_backward.cuh. The hidden size is a
// template parameter: a row lives in registers (a group of threads per row, 16-byte vectors), so
// statistics and normalization cost one read of x. Launch rules: templates/README.md.
#ifndef OPFUSE_TEMPLATES_NORM_CUH_
#define OPFUSE_TEMPLATES_NORM_CUH_

#include "common/block_scale.cuh"
#include "common/fp8.cuh"
#include "common/launch_rules.h"
#include "common/micro_scale_math.cuh"
#include "common/norm_shape.cuh"
#include "common/quantizer_record.cuh"
#include "common/reduce.cuh"
#include "common/transpose.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"
#include "norm_backward.cuh"

namespace opfuse {

template <typename Input, typename Output>
struct NormFwdParams {
  static constexpr bool kBlockScaled = false;
  const Input* x;      // [rows, hidden]
  const Input* gamma;  // [hidden]
  const Input* beta;   // [hidden] (LayerNorm; RMSNorm ignores it, may be nullptr)
  Output* y;           // [rows, hidden]; nullptr: only the transposed copy is written
  Output* y_t;         // [hidden, rows] FP8 transposed copy (kWriteTranspose)
  const float* scale;  // FP8 output: y = fp8(value * *scale)
  float* amax;         // max |y| (before scaling; as stored if not FP8), one atomicMax per block;
                       // nullptr: not tracked
  const QuantizerRecord* scale_record;  // current scaling measured here (derive_current_scale)
  float* mean;                          // [rows] saved mean (LayerNorm); nullptr: not saved
  float* rstd;                          // [rows] saved 1 / sqrt(var + epsilon); nullptr: not saved
  float epsilon;
  int rows;  // any value >= 0
};

// The block-scaled forward's params (layernorm_block_fwd, rmsnorm_block_fwd).
template <typename Input, typename Output>
struct NormBlockFwdParams {
  static constexpr bool kBlockScaled = true;
  const Input* x;        // [rows, hidden]
  const Input* gamma;    // [hidden]
  const Input* beta;     // [hidden] (LayerNorm; RMSNorm ignores it, may be nullptr)
  Output* y;             // [rows, hidden] FP8 codes, one scale per 1 x 128 block of a row
  float* y_scale_inv;    // its grid (launch::block_scale_grid_outer/inner of rows, hidden, 1-D)
  Input* y_hp;           // [rows, hidden] the output in the input dtype (kWriteColumnwiseSource)
  float* mean;           // [rows] saved mean (LayerNorm); nullptr: not saved
  float* rstd;           // [rows] saved 1 / sqrt(var + epsilon); nullptr: not saved
  float epsilon;         // the norm's
  float block_epsilon;   // the blocks' amax floor
  int power_of_2_scale;  // nonzero: block scales rounded down to a power of 2
  int rows;              // any value >= 0
};

// The MXFP8 forward's params (layernorm_micro_fwd, rmsnorm_micro_fwd).
template <typename Input>
struct NormMicroFwdParams {
  static constexpr bool kBlockScaled = true;
  const Input* x;      // [rows, hidden]
  const Input* gamma;  // [hidden]
  const Input* beta;   // [hidden] (LayerNorm; RMSNorm ignores it, may be nullptr)
  Input* y;            // [rows, hidden] the 1 x 32 MXFP8 row-wise copy, decoded; nullptr: none
  Input* y_hp;         // [rows, hidden] the output in the input dtype (kWriteColumnwiseSource)
  float* mean;         // [rows] saved mean (LayerNorm); nullptr: not saved
  float* rstd;         // [rows] saved 1 / sqrt(var + epsilon); nullptr: not saved
  float epsilon;       // the norm's
  int rows;            // any value >= 0
};

namespace detail {

// Dynamic shared memory of the transposed-copy forward: kTileRows staged FP8 rows, each
// launch::norm_transpose_stage_pitch(kHidden) bytes apart.
extern __shared__ __align__(16) unsigned char norm_staged_rows[];

// Writes a tile of staged FP8 rows as column segments of y_t [hidden, rows]. Item = (4-column
// group, 16-row half): a thread turns 4 columns x 16 rows into four 16-byte stores. With 32-row
// tiles, lanes 2g and 2g + 1 hold the two halves of the same columns, so each pair of lanes fills
// a whole 32-byte sector; the +4 pitch puts those two halves on different banks.
template <int kHidden, int kTileRows, int kBlockThreads>
__device__ __forceinline__ void write_norm_transposed_tile(const unsigned char* staged,
                                                           unsigned char* y_t, long long rows,
                                                           long long tile_row0) {
  constexpr int kPitch = launch::norm_transpose_stage_pitch(kHidden);
  constexpr int kHalves = kTileRows / 16;
  const bool rows_multiple_of_16 = (rows % 16) == 0;
  for (int item = threadIdx.x; item < (kHidden / 4) * kHalves; item += kBlockThreads) {
    const int half = item % kHalves;
    const int group = item / kHalves;
    const long long row0 = tile_row0 + 16 * half;
    if (row0 >= rows) continue;
    const unsigned char* block = staged + (16 * half) * kPitch + 4 * group;
    if (!rows_multiple_of_16) {
#pragma unroll 1
      for (int k = 0; k < 4; ++k) {
        store_column_bytes(y_t + static_cast<long long>(4 * group + k) * rows + row0, block + k,
                           kPitch, rows - row0);
      }
      continue;
    }
    unsigned int words[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      words[i] = *reinterpret_cast<const unsigned int*>(block + i * kPitch);
    }
    uint4 columns[4];
    transpose_16x4_bytes(words, columns);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      *reinterpret_cast<uint4*>(y_t + static_cast<long long>(4 * group + k) * rows + row0) =
          columns[k];
    }
  }
}

// Params: NormFwdParams, NormBlockFwdParams (kBlockScaled: the 1 x 128 row-wise copy,
// kWriteSource: and the rounded output y_hp) or NormMicroFwdParams with kMicroFormat
// (launch::kMicroScaleE4M3 / E5M2: the 1 x 32 MXFP8 row-wise copy decoded, Output = Input;
// kWriteSource as above).
template <bool kIsRms, typename Input, typename Output, int kHidden, bool kZeroCenteredGamma,
          bool kWriteTranspose, typename Params = NormFwdParams<Input, Output>,
          bool kWriteSource = false, int kMicroFormat = -1>
__device__ __forceinline__ void norm_fwd(const Params& params) {
  using Shape = NormFwdShape<Input, kHidden, kWriteTranspose>;
  constexpr int kVec = Shape::kVec;
  constexpr int kSlots = Shape::kVecsPerThread;
  constexpr int kRowsPerBlock = Shape::kRowsPerBlock;
  constexpr int kBlockThreads = Shape::kBlockThreads;
  constexpr bool kIsFp8 = DtypeTraits<Output>::kIsFp8;
  constexpr int kTileRows = launch::norm_transpose_tile_rows(kHidden);
  constexpr int kPitch = launch::norm_transpose_stage_pitch(kHidden);
  static_assert(!kWriteTranspose || kIsFp8, "the transposed copy is an FP8 output");
  static_assert(!kWriteTranspose || kTileRows % kRowsPerBlock == 0, "whole row groups per tile");
  constexpr bool kBlock = Params::kBlockScaled;
  constexpr bool kMicro = kMicroFormat >= 0;
  constexpr int kBlockLength = kMicro ? launch::micro_scale_block_size(kMicro ? kMicroFormat : 0)
                                      : launch::kBlockScaleLength;
  // Under block scaling the lanes of one 1 x 128 (MXFP8: 1 x 32) block: consecutive lanes of one
  // slot (vector t + s * kThreadsPerRow), within one warp since kThreadsPerRow is a multiple of 32.
  constexpr int kBlockLanes = kBlockLength / kVec;
  static_assert(!kMicro || kBlock, "MXFP8 takes NormMicroFwdParams");
  static_assert(!kBlock || (kIsFp8 != kMicro && !kWriteTranspose),
                "block scaling writes FP8 row-wise; MXFP8 its decoded copy in the input dtype");
  static_assert(!kMicro || kMicroFormat == launch::kMicroScaleE4M3 ||
                    kMicroFormat == launch::kMicroScaleE5M2,
                "MXFP8 only: NVFP4 needs the tensor's amax before the first block is cast");
  static_assert(!kBlock || (kHidden % kBlockLength == 0 && kBlockLanes >= 1 &&
                            Shape::kThreadsPerRow % kBlockLanes == 0 && kBlockLanes <= 32),
                "block-scaled norm: hidden a multiple of the block (128; MXFP8 32)");
  static_assert(!kWriteTranspose || kTileRows * kPitch <= launch::kMaxDynamicSharedBytes,
                "hidden too wide to stage 16 rows in shared memory: write the norm output in "
                "bf16 and use cast_transpose for the FP8 copies");

  __shared__ float2 reduce_scratch[kRowsPerBlock][2 * Shape::kWarpsPerRow];
  __shared__ float amax_scratch[kBlockThreads / 32];

  const int group = threadIdx.x / Shape::kThreadsPerRow;
  const int thread_in_row = threadIdx.x % Shape::kThreadsPerRow;
  GroupReducer<Shape::kWarpsPerRow, kRowsPerBlock> reducer(reduce_scratch[group], group);

  [[maybe_unused]] float scale = 1.0f;
  if constexpr (kIsFp8 && !kBlock) scale = *params.scale;
  [[maybe_unused]] float amax = 0.0f;

  // gamma (+ 1 when zero-centered) and beta widened to fp32 once per block, when they fit
  // (launch::norm_affine_shared_bytes). A vector's kVec floats lie in kVec / 4 float4 planes
  // ([plane][vector]), so a warp's reads of consecutive vectors are free of bank conflicts.
  constexpr int kAffineBytes =
      launch::norm_affine_shared_bytes(kHidden, Shape::kInputBytes, kIsRms, kWriteTranspose);
  constexpr int kPlanes = kVec / 4;
  constexpr int kBetaOffset = kHidden / 4;  // float4s of gamma before beta's
  __shared__ float4 affine[kAffineBytes > 0 ? kAffineBytes / 16 : 1];
  if constexpr (kAffineBytes > 0) {
    for (int vector = threadIdx.x; vector < Shape::kVecsPerRow; vector += kBlockThreads) {
      float g[kVec], b[kVec];
      vec_to_float(load_vec<Input, kVec>(params.gamma + vector * kVec), g);
      if constexpr (!kIsRms) vec_to_float(load_vec<Input, kVec>(params.beta + vector * kVec), b);
#pragma unroll
      for (int p = 0; p < kPlanes; ++p) {
        const int j = 4 * p;
        affine[p * Shape::kVecsPerRow + vector] =
            kZeroCenteredGamma
                ? make_float4(g[j] + 1.0f, g[j + 1] + 1.0f, g[j + 2] + 1.0f, g[j + 3] + 1.0f)
                : make_float4(g[j], g[j + 1], g[j + 2], g[j + 3]);
        if constexpr (!kIsRms) {
          affine[kBetaOffset + p * Shape::kVecsPerRow + vector] =
              make_float4(b[j], b[j + 1], b[j + 2], b[j + 3]);
        }
      }
    }
    __syncthreads();
  }
  // gamma (+ 1 when zero-centered) and beta of one vector as fp32.
  auto load_affine = [&](int vector, float(&g)[kVec], float(&b)[kVec]) {
    if constexpr (kAffineBytes > 0) {
#pragma unroll
      for (int p = 0; p < kPlanes; ++p) {
        const float4 gp = affine[p * Shape::kVecsPerRow + vector];
        g[4 * p] = gp.x;
        g[4 * p + 1] = gp.y;
        g[4 * p + 2] = gp.z;
        g[4 * p + 3] = gp.w;
        if constexpr (!kIsRms) {
          const float4 bp = affine[kBetaOffset + p * Shape::kVecsPerRow + vector];
          b[4 * p] = bp.x;
          b[4 * p + 1] = bp.y;
          b[4 * p + 2] = bp.z;
          b[4 * p + 3] = bp.w;
        }
      }
    } else {
      // Re-read per row (L1 hits after the first row): holding them in registers across rows
      // would cost 2 * kSlots * kVec registers and halve the occupancy.
      vec_to_float(load_vec<Input, kVec>(params.gamma + vector * kVec), g);
      if constexpr (!kIsRms) vec_to_float(load_vec<Input, kVec>(params.beta + vector * kVec), b);
      if constexpr (kZeroCenteredGamma) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) g[j] += 1.0f;
      }
    }
  };

  using RowVectors = Vec<Input, kVec>[kSlots];
  // Issues the loads of one row (zeros past the end).
  auto load_row = [&](long long row, RowVectors& raw) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int vector = Shape::vector_index(thread_in_row, s);
      if (row < params.rows && Shape::slot_in_row(vector)) {
        raw[s] = load_vec<Input, kVec>(params.x + row * kHidden + vector * kVec);
      } else {
        raw[s] = zero_vec<Input, kVec>();
      }
    }
  };

  // Block scaling: each vector's outputs rounded to Input (what the unfused norm stores) and each
  // lane's amax per slot; then the amax of each 1 x 128 block by shuffles among its lanes, ending
  // with one block per lane (LaneGroupMax); that lane derives the block's scale, the first of its
  // replicas stores the scale_inv, and the scales go back to the blocks' lanes by shuffles. Per
  // lane and row: 9 shuffles and one scale for 4 slots of 16 lanes, where a butterfly per slot
  // and a scale and scale_inv per slot took 16 shuffles and 8 divisions (H200, a [16384, 4096]
  // layernorm to E4M3: 90 -> about 77 us; with the per-tensor FP8 output 62 us; bench/RESULTS.md).
  // Every lane of a warp runs every shuffle (a slot past the row, or a row past the end, computes
  // on zeros and stores nothing).
  [[maybe_unused]] auto normalize_block_row = [&](const RowVectors& raw, long long row, bool valid,
                                                  float rstd, float shift) {
    if constexpr (kBlock) {
      const int lane = threadIdx.x & 31;
      Vec<Input, kVec> rounded[kSlots];
      float block_amax[kSlots];
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int vector = Shape::vector_index(thread_in_row, s);
        float x[kVec], g[kVec], b[kVec], y[kVec];
        vec_to_float(raw[s], x);
        if (Shape::slot_in_row(vector)) {
          load_affine(vector, g, b);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) g[j] = b[j] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          y[j] = kIsRms ? x[j] * rstd * g[j] : fmaf(fmaf(x[j], rstd, shift), g[j], b[j]);
        rounded[s] = float_to_vec<Input, kVec>(y, 1.0f);
        vec_to_float(rounded[s], y);
        block_amax[s] = 0.0f;
#pragma unroll
        for (int j = 0; j < kVec; ++j) block_amax[s] = accumulate_amax(block_amax[s], y[j]);
      }
      // Each block's amax, one block per lane (common/reduce.cuh, LaneGroupMax).
      using GroupMax = LaneGroupMax<kSlots, kBlockLanes>;
      const float amax_of_lane = GroupMax::reduce(block_amax, lane);
      const int slot_of_lane = GroupMax::value_of_lane(lane);
      if constexpr (kMicro) {
        // MXFP8: each block's E8M0 exponent back to its lanes, and each value quantized and
        // decoded with micro_scale_cast's functions (common/micro_scale_math.cuh).
        const int exponent_of_lane = static_cast<int>(
            detail::micro_block_scale<kMicroFormat>(amax_of_lane, 1.0f, 1.0f).bits);
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const detail::MicroBlockScale scale = detail::mxfp8_block_scale(
              __shfl_sync(kFullWarpMask, exponent_of_lane, GroupMax::lane_of_value(lane, s)));
          const int vector = Shape::vector_index(thread_in_row, s);
          if (!valid || !Shape::slot_in_row(vector)) continue;
          if (params.y != nullptr) {
            float y[kVec];
            vec_to_float(rounded[s], y);
            detail::micro_fake_quantize<kMicroFormat>(y, scale);
            store_vec(params.y + row * kHidden + vector * kVec, float_to_vec<Input, kVec>(y, 1.0f));
          }
          if constexpr (kWriteSource) {
            store_vec(params.y_hp + row * kHidden + vector * kVec, rounded[s]);
          }
        }
      } else {
        constexpr float kFp8Max = DtypeTraits<Output>::kMax;
        const float scale_of_lane = detail::block_scale(
            amax_of_lane, kFp8Max, params.block_epsilon, params.power_of_2_scale != 0,
            BlockScaleValueForInf<Input>::kValue);
        if (GroupMax::lane_of_value(lane, slot_of_lane) == lane && slot_of_lane < kSlots &&
            valid && params.y != nullptr) {
          const int vector = Shape::vector_index(
              (thread_in_row & ~31) + (lane & ~(kBlockLanes - 1)), slot_of_lane);
          if (Shape::slot_in_row(vector)) {
            const long long grid_inner =
                launch::block_scale_grid_inner(params.rows, kHidden, /*two_d=*/false);
            params.y_scale_inv[(vector / kBlockLanes) * grid_inner + row] =
                __fdiv_rn(1.0f, scale_of_lane);
          }
        }
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const float scale_value =
              __shfl_sync(kFullWarpMask, scale_of_lane, GroupMax::lane_of_value(lane, s));
          const int vector = Shape::vector_index(thread_in_row, s);
          if (!valid || !Shape::slot_in_row(vector)) continue;
          if (params.y != nullptr) {
            float y[kVec];
            vec_to_float(rounded[s], y);
            store_vec(params.y + row * kHidden + vector * kVec,
                      float_to_vec<Output, kVec>(y, scale_value));
          }
          if constexpr (kWriteSource) {
            store_vec(params.y_hp + row * kHidden + vector * kVec, rounded[s]);
          }
        }
      }
    }
  };

  // Normalizes one row (all threads of the block call it together: it holds barriers). An
  // invalid row (past the end) computes on zeros and stores nothing.
  auto normalize_row = [&](const RowVectors& raw, long long row, bool valid,
                           unsigned char* staged_row) {
    // The row stays packed in `raw` and is widened to floats in each pass: holding kSlots * kVec
    // floats across the reductions' barriers costs that many registers more, and with them the
    // occupancy that hides the loads' latency (launch::norm_fwd_register_budget).
    // Two-pass statistics from registers: mean first, then the centered sum of squares.
    float mean = 0.0f;
    if constexpr (!kIsRms) {
      float sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        float x[kVec];
        vec_to_float(raw[s], x);
#pragma unroll
        for (int j = 0; j < kVec; ++j) sum += x[j];
      }
      mean = reducer.allreduce(sum, SumOp{}) / static_cast<float>(kHidden);
    }
    float squares = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (Shape::slot_in_row(Shape::vector_index(thread_in_row, s))) {
        float x[kVec];
        vec_to_float(raw[s], x);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float centered = x[j] - mean;
          squares += centered * centered;
        }
      }
    }
    const float variance = reducer.allreduce(squares, SumOp{}) / static_cast<float>(kHidden);
    const float rstd = rsqrtf(variance + params.epsilon);
    const float shift = -mean * rstd;  // (x - mean) * rstd as one fused multiply-add

    if constexpr (kBlock) {
      normalize_block_row(raw, row, valid, rstd, shift);
    } else {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int vector = Shape::vector_index(thread_in_row, s);
      if (!Shape::slot_in_row(vector)) continue;
      float x[kVec], g[kVec], b[kVec], y[kVec];
      vec_to_float(raw[s], x);
      load_affine(vector, g, b);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        y[j] = kIsRms ? x[j] * rstd * g[j] : fmaf(fmaf(x[j], rstd, shift), g[j], b[j]);
        if (valid) amax = accumulate_amax(amax, y[j]);
      }
      const Vec<Output, kVec> converted = float_to_vec<Output, kVec>(y, scale);
      if (valid && params.y != nullptr) {
        store_vec(params.y + row * kHidden + vector * kVec, converted);
      }
      if constexpr (kWriteTranspose) {
        // kVec FP8 bytes at a 4-byte aligned offset (the pitch is hidden + 4).
        unsigned int* dst = reinterpret_cast<unsigned int*>(staged_row + vector * kVec);
        const unsigned int* src = reinterpret_cast<const unsigned int*>(&converted);
#pragma unroll
        for (int w = 0; w < kVec / 4; ++w) dst[w] = src[w];
      }
    }
    }
    if (valid && thread_in_row == 0) {
      if (!kIsRms && params.mean != nullptr) params.mean[row] = mean;
      if (params.rstd != nullptr) params.rstd[row] = rstd;
    }
  };

  if constexpr (!kWriteTranspose) {
    // Row groups stride over the rows; the loop bound depends on blockIdx only, so every thread
    // of the block runs the same iterations (the reductions' barriers stay matched).
    const long long stride = static_cast<long long>(gridDim.x) * kRowsPerBlock;
    const long long first = static_cast<long long>(blockIdx.x) * kRowsPerBlock;
    // Latency is hidden by occupancy (768-1024 threads per SM), not by prefetching: loads ahead
    // into registers measured slower for want of registers, and rows staged ahead in shared
    // memory by cp.async slower too (H100: the FP8-output layernorm 92% -> 78% of copy).
    for (long long base = first; base < params.rows; base += stride) {
      const long long row = base + group;
      RowVectors raw;
      load_row(row, raw);
      normalize_row(raw, row, row < params.rows, nullptr);
    }
  } else {
    // Tiles of kTileRows rows: each row group normalizes kTileRows / kRowsPerBlock rows of the tile
    // into shared memory, then the block writes the tile's column segments of y_t. With one
    // block per SM (shared memory), the next row, possibly of the next tile, is loaded one step
    // ahead so it is in flight during this row's reductions and the write phase (2.7 -> 2.9
    // TB/s, measured on an H200; two or three rows ahead measured slower on an H100).
    constexpr int kStepsPerTile = kTileRows / kRowsPerBlock;
    const long long tile_stride = static_cast<long long>(gridDim.x) * kTileRows;
    RowVectors raw;
    load_row(static_cast<long long>(blockIdx.x) * kTileRows + group, raw);
    for (long long tile_row0 = static_cast<long long>(blockIdx.x) * kTileRows;
         tile_row0 < params.rows; tile_row0 += tile_stride) {
#pragma unroll 1
      for (int i = 0; i < kStepsPerTile; ++i) {
        const int row_in_tile = i * kRowsPerBlock + group;
        const long long row = tile_row0 + row_in_tile;
        const long long next_row =
            i + 1 < kStepsPerTile ? row + kRowsPerBlock : tile_row0 + tile_stride + group;
        RowVectors next;
        load_row(next_row, next);
        normalize_row(raw, row, row < params.rows, norm_staged_rows + row_in_tile * kPitch);
#pragma unroll
        for (int s = 0; s < kSlots; ++s) raw[s] = next[s];
      }
      __syncthreads();
      write_norm_transposed_tile<kHidden, kTileRows, kBlockThreads>(
          norm_staged_rows, reinterpret_cast<unsigned char*>(params.y_t), params.rows, tile_row0);
      __syncthreads();
    }
  }
  if constexpr (!kBlock) {
    commit_block_amax<kBlockThreads>(published_amax<Output>(amax), params.amax, amax_scratch);
    derive_current_scale(params.scale_record);  // thread 0, after its block's amax atomic
  }
}

}  // namespace detail

// Forward. Block: NormFwdShape<Input, kHidden>::kBlockThreads; grid: any gridDim.x >= 1, see
// README. kWriteTranspose needs dynamic shared memory of launch::norm_fwd_dynamic_smem_bytes.
template <typename Input, typename Output, int kHidden, bool kZeroCenteredGamma = false,
          bool kWriteTranspose = false>
__global__ void __launch_bounds__(
    NormFwdShape<Input, kHidden, kWriteTranspose>::kBlockThreads,
    launch::min_blocks(NormFwdShape<Input, kHidden, kWriteTranspose>::kBlockThreads,
                       launch::norm_fwd_register_budget(false, kWriteTranspose)))
    layernorm_fwd(NormFwdParams<Input, Output> params) {
  detail::norm_fwd<false, Input, Output, kHidden, kZeroCenteredGamma, kWriteTranspose>(params);
}

template <typename Input, typename Output, int kHidden, bool kZeroCenteredGamma = false,
          bool kWriteTranspose = false>
__global__ void __launch_bounds__(
    NormFwdShape<Input, kHidden, kWriteTranspose>::kBlockThreads,
    launch::min_blocks(NormFwdShape<Input, kHidden, kWriteTranspose>::kBlockThreads,
                       launch::norm_fwd_register_budget(true, kWriteTranspose)))
    rmsnorm_fwd(NormFwdParams<Input, Output> params) {
  detail::norm_fwd<true, Input, Output, kHidden, kZeroCenteredGamma, kWriteTranspose>(params);
}

// Forward under float8_block_scaling: the 1 x 128 row-wise copy and its grid (and, with
// kWriteColumnwiseSource, the output in the input dtype for the column-wise cast). Block and grid
// as the forward without kWriteTranspose; hidden a multiple of 128.
template <typename Input, typename Output, int kHidden, bool kZeroCenteredGamma = false,
          bool kWriteColumnwiseSource = false>
__global__ void __launch_bounds__(
    NormFwdShape<Input, kHidden>::kBlockThreads,
    launch::min_blocks(NormFwdShape<Input, kHidden>::kBlockThreads,
                       launch::norm_fwd_register_budget(false, false)))
    layernorm_block_fwd(NormBlockFwdParams<Input, Output> params) {
  detail::norm_fwd<false, Input, Output, kHidden, kZeroCenteredGamma, false,
                   NormBlockFwdParams<Input, Output>, kWriteColumnwiseSource>(params);
}

template <typename Input, typename Output, int kHidden, bool kZeroCenteredGamma = false,
          bool kWriteColumnwiseSource = false>
__global__ void __launch_bounds__(
    NormFwdShape<Input, kHidden>::kBlockThreads,
    launch::min_blocks(NormFwdShape<Input, kHidden>::kBlockThreads,
                       launch::norm_fwd_register_budget(true, false)))
    rmsnorm_block_fwd(NormBlockFwdParams<Input, Output> params) {
  detail::norm_fwd<true, Input, Output, kHidden, kZeroCenteredGamma, false,
                   NormBlockFwdParams<Input, Output>, kWriteColumnwiseSource>(params);
}

// Forward under mxfp8_block_scaling (emulated on Hopper): the output's 1 x 32 row-wise MXFP8 copy
// decoded to Input, the values micro_scale_cast<Input, Input, kFormat> writes from the norm's
// output (and, with kWriteColumnwiseSource, that output, which the column-wise cast reads).
// kFormat: launch::kMicroScaleE4M3 or kMicroScaleE5M2. Block and grid as the forward without
// kWriteTranspose; hidden a multiple of 32.
template <typename Input, int kFormat, int kHidden, bool kZeroCenteredGamma = false,
          bool kWriteColumnwiseSource = false>
__global__ void __launch_bounds__(
    NormFwdShape<Input, kHidden>::kBlockThreads,
    launch::min_blocks(NormFwdShape<Input, kHidden>::kBlockThreads,
                       launch::norm_fwd_register_budget(false, false)))
    layernorm_micro_fwd(NormMicroFwdParams<Input> params) {
  detail::norm_fwd<false, Input, Input, kHidden, kZeroCenteredGamma, false,
                   NormMicroFwdParams<Input>, kWriteColumnwiseSource, kFormat>(params);
}

template <typename Input, int kFormat, int kHidden, bool kZeroCenteredGamma = false,
          bool kWriteColumnwiseSource = false>
__global__ void __launch_bounds__(
    NormFwdShape<Input, kHidden>::kBlockThreads,
    launch::min_blocks(NormFwdShape<Input, kHidden>::kBlockThreads,
                       launch::norm_fwd_register_budget(true, false)))
    rmsnorm_micro_fwd(NormMicroFwdParams<Input> params) {
  detail::norm_fwd<true, Input, Input, kHidden, kZeroCenteredGamma, false,
                   NormMicroFwdParams<Input>, kWriteColumnwiseSource, kFormat>(params);
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_NORM_CUH_
