// Block-scaled FP8 cast (TE's Float8BlockScaling, DeepSeek-V3's recipe): x cast to FP8 with one
// scale per block computed from that block's own amax, into a row-wise copy and a column-wise
// (transposed) copy in one pass, each with its grid of scale_inv values.
//
// Entry point: block_cast_transpose<Input, Output, kTwoD, kWriteTranspose>. kTwoD = false: 1 x 128
// blocks along the rows of x for the row-wise copy; the column-wise copy is quantized again from x
// with 128 x 1 blocks down its columns (inputs and gradients). kTwoD = true: one scale per
// 128 x 128 block; the column-wise copy is the row-wise data and scales transposed (weights).
// kWriteTranspose = false compiles the column-wise copy out (y_t is ignored). Launch rules,
// shapes, numerics and the scale_inv grids are in templates/README.md ("Block-scaled cast"); the
// CPU oracle, bit for bit, is runtime/cpu/block_quantization.h.
//
// Geometry (launch_rules.h): a block of 256 threads owns a 128 x 128 tile of x. A thread owns one
// 16-byte input vector (kVec columns) in each of kPasses rows of the tile (8 rows for 2-byte
// inputs, 16 threads per tile row; 16 rows for fp32, 32 threads per tile row), all loaded before
// any is used and held in registers until the column scales are known. A thread's own maxima:
// packed 2-byte maxima (block_cast_packed_absmax). Row amax: LaneGroupMax among the threads of a
// tile row, one row's scale per lane; column amax: per thread over its rows, then over the warps
// through shared memory. The column-wise FP8 bytes are staged in shared memory and written
// transposed, 16 rows x 4 columns per thread (transpose.cuh), 16-byte stores when
// rows % 16 == 0.
#ifndef OPFUSE_TEMPLATES_BLOCK_CAST_CUH_
#define OPFUSE_TEMPLATES_BLOCK_CAST_CUH_

#include "common/block_scale.cuh"
#include "common/fp8.cuh"
#include "common/launch_rules.h"
#include "common/reduce.cuh"
#include "common/transpose.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"

namespace opfuse {

template <typename Input, typename Output>
struct BlockCastParams {
  const Input* x;        // [rows, cols] row-major
  Output* y;             // [rows, cols] row-wise copy; nullptr: not written
  float* y_scale_inv;    // its scale_inv grid (README, "Block-scaled cast"); with y
  Output* y_t;           // [cols, rows] column-wise (transposed) copy; nullptr: not written
  float* y_t_scale_inv;  // its grid; with y_t
  float epsilon;         // amax floor
  int power_of_2_scale;  // nonzero: scales rounded down to a power of 2
  int rows;              // any >= 0
  int cols;              // multiple of 16 / sizeof(Input) (every row 16-byte aligned)
};

namespace detail {

// Staging pitch in bytes of one tile row of FP8 bytes: 33 words, so that the two 16-row halves one
// warp reads in the transposed write phase fall on different banks.
constexpr int kBlockCastStagePitch = launch::kBlockCastTile + 4;

// The threads of one block_cast_rows_tile call: the whole block (kGrouped = false; a barrier is
// __syncthreads) or, in a larger block, the group of launch::kBlockCastThreads threads [256 g,
// +256), whose barrier is named barrier 1 + g (the gated activation's backward casts its two
// output planes at once, a group each).
template <bool kGrouped>
__device__ __forceinline__ unsigned int block_cast_tid() {
  return kGrouped ? threadIdx.x % launch::kBlockCastThreads : threadIdx.x;
}
template <bool kGrouped>
__device__ __forceinline__ void block_cast_sync() {
  if constexpr (kGrouped) {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + threadIdx.x / launch::kBlockCastThreads),
                 "n"(launch::kBlockCastThreads)
                 : "memory");
  } else {
    __syncthreads();
  }
}

// Writes the transposed copy of one staged 128 x 128 FP8 tile: thread = (16-row block, 4-column
// group), 8 x 32 items; a warp covers 2 row blocks x 16 column groups, so lanes (block 2i, g) and
// (block 2i + 1, g) fill one 32-byte sector of output row g. rows % 16 == 0: 16-byte stores;
// rows % 4 == 0: 4-byte stores; else byte stores (the segments' alignment is that of c * rows).
template <bool kGrouped = false>
__device__ __forceinline__ void write_block_cast_transposed(
    const unsigned char (*staged)[kBlockCastStagePitch], unsigned char* out_t, long long rows,
    int cols, long long tile_row0, int tile_col0) {
  constexpr int kRowBlocks = launch::kBlockCastTile / 16;
  constexpr int kColumnGroups = launch::kBlockCastTile / 4;
  static_assert(kRowBlocks * kColumnGroups == launch::kBlockCastThreads, "one item per thread");
  const unsigned int tid = block_cast_tid<kGrouped>();
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int row_block = 2 * (warp % (kRowBlocks / 2)) + (lane & 1);
  const int column_group = 16 * (warp / (kRowBlocks / 2)) + (lane >> 1);
  const int col = tile_col0 + 4 * column_group;
  const long long row0 = tile_row0 + 16 * row_block;
  if (col >= cols || row0 >= rows) return;  // cols % 4 == 0: a group is whole or absent

  const unsigned char* block = &staged[16 * row_block][4 * column_group];
  const long long rows_left = rows - row0;
  if (rows % 4 != 0) {
#pragma unroll 1
    for (int k = 0; k < 4; ++k) {
      store_column_bytes(out_t + (col + k) * rows + row0, block + k, kBlockCastStagePitch,
                         rows_left);
    }
    return;
  }
  unsigned int words[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    words[i] = *reinterpret_cast<const unsigned int*>(block + i * kBlockCastStagePitch);
  }
  uint4 columns[4];
  transpose_16x4_bytes(words, columns);
  if (rows % 16 == 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      *reinterpret_cast<uint4*>(out_t + (col + k) * rows + row0) = columns[k];
    }
    return;
  }
  // rows % 4 == 0, so rows_left is a multiple of 4: whole 4-byte words of the segment.
  const int quads = rows_left < 16 ? static_cast<int>(rows_left / 4) : 4;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    unsigned int* dst = reinterpret_cast<unsigned int*>(out_t + (col + k) * rows + row0);
    dst[0] = columns[k].x;
    if (quads > 1) dst[1] = columns[k].y;
    if (quads > 2) dst[2] = columns[k].z;
    if (quads > 3) dst[3] = columns[k].w;
  }
}

// 16 bytes of x as four 32-bit words: raw vectors kept as words stay packed in registers (a
// Vec of 2-byte elements splits into 16-bit registers, one 32-bit register each, which doubles
// the 128 x 128 tile's footprint and spills).
using BlockCastWords = Vec<unsigned int, 4>;

// The elements of one vector of x, widened to fp32 exactly (bf16: the bits shifted, as
// __bfloat162float; fp16: cvt.f32.f16; fp32: the bits).
template <typename Input>
__device__ __forceinline__ void block_cast_widen(
    const BlockCastWords& words, float (&out)[launch::vector_elems(sizeof(Input))]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned int w = words.elems[i];
    if constexpr (kIsSame<Input, __nv_bfloat16>) {
      out[2 * i] = __uint_as_float(w << 16);
      out[2 * i + 1] = __uint_as_float(w & 0xFFFF0000u);
    } else if constexpr (kIsSame<Input, __half>) {
      out[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
      out[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
    } else {
      static_assert(kIsSame<Input, float>, "bf16, fp16 or fp32 input");
      out[i] = __uint_as_float(w);
    }
  }
}

// Packed maxima of |value| for 2-byte inputs: each half of acc raised to the magnitude of the
// same half of word (bf16x2 / fp16x2 max: NaN ignored as fmaxf ignores it, +0 for zeros). Exact,
// as a maximum returns one of its inputs: the widened halves equal the fp32 running maxima of the
// widened values, for half the instructions.
template <typename Input>
__device__ __forceinline__ unsigned int block_cast_packed_absmax(unsigned int acc,
                                                                 unsigned int word) {
  static_assert(sizeof(Input) == 2, "packed pairs of 2-byte values");
  const unsigned int magnitude = word & 0x7FFF7FFFu;
  unsigned int result;
  if constexpr (kIsSame<Input, __half>) {
    const __half2 m = __hmax2(*reinterpret_cast<const __half2*>(&acc),
                              *reinterpret_cast<const __half2*>(&magnitude));
    result = *reinterpret_cast<const unsigned int*>(&m);
  } else {
    const __nv_bfloat162 m = __hmax2(*reinterpret_cast<const __nv_bfloat162*>(&acc),
                                     *reinterpret_cast<const __nv_bfloat162*>(&magnitude));
    result = *reinterpret_cast<const unsigned int*>(&m);
  }
  return result;
}

// kVec FP8 bytes of one tile row into the staging buffer as 32-bit words (the pitch is 4-byte,
// not 8-byte, aligned).
template <int kVec>
__device__ __forceinline__ void stage_fp8_bytes(unsigned char* dst, const void* bytes) {
  static_assert(kVec % 4 == 0, "whole 32-bit words");
  unsigned int* to = reinterpret_cast<unsigned int*>(dst);
  const unsigned int* from = reinterpret_cast<const unsigned int*>(bytes);
#pragma unroll
  for (int w = 0; w < kVec / 4; ++w) to[w] = from[w];
}

// The rows of a tile left from `row` on (<= 0: none), capped at one tile: the passes' bounds
// checks compare it in 32 bits with their row offset instead of each pass's 64-bit row.
__device__ __forceinline__ int block_cast_rows_left(long long rows, long long row) {
  const long long left = rows - row;
  return static_cast<int>(left < launch::kBlockCastTile ? left : launch::kBlockCastTile);
}

// Rows each thread of a block cast owns in a 128 x 128 tile: 8 for 2-byte inputs, 16 for fp32.
template <typename Input>
__host__ __device__ constexpr int block_cast_passes() {
  return launch::kBlockCastTile / (launch::kBlockCastThreads /
                                   (launch::kBlockCastTile / launch::vector_elems(sizeof(Input))));
}

// Shared memory of block_cast_rows_tile: the column-wise copy's staging tile and its column
// maxima and scales (placeholders without the copy).
template <bool kColumnwise>
struct BlockCastRowsShared {
  static constexpr int kWarps = launch::kBlockCastThreads / 32;
  alignas(16) unsigned char staged[kColumnwise ? launch::kBlockCastTile : 1][kBlockCastStagePitch];
  alignas(16) float column_amax[kColumnwise ? kWarps : 1][launch::kBlockCastTile];
  alignas(16) float column_scale[kColumnwise ? launch::kBlockCastTile : 1];
};

// The 1 x 128 (row-wise) and 128 x 1 (column-wise) block quantization of one 128 x 128 tile whose
// values the thread holds as raw words of dtype Input (raw[b]: its vector in pass b), the tile
// at rows [tile_row0, +128) and columns [tile_col0, +128) of p's [rows, cols] tensor. Shared by
// block_cast_transpose (raw = x as loaded) and the fused activations of block_activation.cuh
// (raw = the activation's values rounded to Input, so a fused kernel writes what the activation
// kernel and the cast would). Each row's amax by shuffles among its kVecsPerRow threads, all
// rows' maxima first (the shuffles of the kPasses rows overlap), then the row-wise copy; the
// column amax (128 x 1 blocks) is gathered on the way. Ends with the transposed write: the caller
// holds a barrier before `shared` is used again. Called by launch::kBlockCastThreads threads at
// once: the whole block, or with kGrouped one group of a larger block (block_cast_sync).
template <typename Input, typename Output, bool kWriteTranspose, bool kGrouped = false>
__device__ __forceinline__ void block_cast_rows_tile(
    BlockCastWords (&raw)[block_cast_passes<Input>()], const BlockCastParams<Input, Output>& p,
    BlockCastRowsShared<kWriteTranspose>& shared, long long tile_row0, int tile_col0) {
  const unsigned int tid = block_cast_tid<kGrouped>();
  constexpr int kTile = launch::kBlockCastTile;
  constexpr int kWarps = launch::kBlockCastThreads / 32;
  constexpr int kVec = launch::vector_elems(sizeof(Input));
  constexpr int kVecsPerRow = kTile / kVec;
  constexpr int kRowsPerPass = launch::kBlockCastThreads / kVecsPerRow;
  constexpr int kPasses = block_cast_passes<Input>();
  constexpr float kFp8Max = DtypeTraits<Output>::kMax;
  constexpr float kValueForInf = BlockScaleValueForInf<Input>::kValue;
  const int vec_in_row = tid % kVecsPerRow;
  const int row_in_pass = tid / kVecsPerRow;
  const int col = tile_col0 + vec_in_row * kVec;
  const bool col_valid = col < p.cols;
  const long long rows = p.rows;
  const int cols = p.cols;
  const long long tile_row_block = tile_row0 / kTile;
  const bool power_of_2 = p.power_of_2_scale != 0;
  const bool write_rowwise = p.y != nullptr;
  const bool write_columnwise = kWriteTranspose && p.y_t != nullptr;

  constexpr bool kPacked = sizeof(Input) == 2;
  if (write_rowwise) {
    // The amax of each of the thread's rows (2-byte inputs: packed maxima, two per instruction).
    float row_amax[kPasses];
#pragma unroll
    for (int b = 0; b < kPasses; ++b) {
      if constexpr (kPacked) {
        unsigned int packed = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          packed = block_cast_packed_absmax<Input>(packed, raw[b].elems[i]);
        }
        float halves[kVec];
        block_cast_widen<Input>(BlockCastWords{{packed, 0u, 0u, 0u}}, halves);
        row_amax[b] = fmaxf(halves[0], halves[1]);
      } else {
        float values[kVec];
        block_cast_widen<Input>(raw[b], values);
        row_amax[b] = 0.0f;
#pragma unroll
        for (int j = 0; j < kVec; ++j) row_amax[b] = accumulate_amax(row_amax[b], values[j]);
      }
    }
    // Each row's amax, one row per lane at the end (common/reduce.cuh, LaneGroupMax: 8 shuffles
    // for 8 rows of 16 lanes, where a butterfly per row takes 32); that lane derives the row's
    // scale, the first of its replicas stores the scale_inv, and the scales go back to the row's
    // lanes by shuffles: one scale and one division per lane instead of one per row.
    using RowMax = LaneGroupMax<kPasses, kVecsPerRow>;
    const int lane = tid & 31;
    const float amax_of_lane = RowMax::reduce(row_amax, lane);
    const int pass_of_lane = RowMax::value_of_lane(lane);
    const float scale_of_lane =
        block_scale(amax_of_lane, kFp8Max, p.epsilon, power_of_2, kValueForInf);
    const long long row_of_lane = tile_row0 + pass_of_lane * kRowsPerPass + row_in_pass;
    const long long row_grid_inner = launch::block_scale_grid_inner(rows, cols, false);
    const unsigned int col_block = static_cast<unsigned int>(tile_col0) / kTile;
    if (lane % RowMax::kReplicas == 0 && row_of_lane < rows) {
      p.y_scale_inv[col_block * row_grid_inner + row_of_lane] = __fdiv_rn(1.0f, scale_of_lane);
    }
    // The values are converted again below, not held as floats since the pass above.
#pragma unroll
    for (int b = 0; b < kPasses; ++b) hide_from_optimizer(raw[b]);
    // One 64-bit address per tile, then a pass stride; the rows left checked in 32 bits.
    const int rows_left = block_cast_rows_left(rows, tile_row0 + row_in_pass);
    Output* const out = p.y + (tile_row0 + row_in_pass) * cols + col;
    const long long pass_stride = static_cast<long long>(kRowsPerPass) * cols;
#pragma unroll
    for (int b = 0; b < kPasses; ++b) {
      const float scale = __shfl_sync(kFullWarpMask, scale_of_lane, RowMax::lane_of_value(lane, b));
      if (b * kRowsPerPass < rows_left && col_valid) {
        float values[kVec];
        block_cast_widen<Input>(raw[b], values);
        store_vec(out + b * pass_stride, float_to_vec<Output, kVec>(values, scale));
      }
    }
  }
  if constexpr (kWriteTranspose) {
    if (write_columnwise) {
      // Column amax: the thread's own over its rows (2-byte inputs: packed maxima; computed
      // here rather than beside the rows' amax, which leaves fewer registers live through the
      // row-wise copy), then the threads of one column vector, lanes vec_in_row + k *
      // kVecsPerRow of every warp, by shuffles within the warp, then the warps through shared
      // memory.
      const int lane = tid & 31;
      const int warp = tid >> 5;
      float col_amax[kVec];
      if constexpr (kPacked) {
        unsigned int packed[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int b = 0; b < kPasses; ++b) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            packed[i] = block_cast_packed_absmax<Input>(packed[i], raw[b].elems[i]);
          }
        }
        block_cast_widen<Input>(BlockCastWords{{packed[0], packed[1], packed[2], packed[3]}},
                                col_amax);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) col_amax[j] = 0.0f;
#pragma unroll
        for (int b = 0; b < kPasses; ++b) {
          float values[kVec];
          block_cast_widen<Input>(raw[b], values);
#pragma unroll
          for (int j = 0; j < kVec; ++j) col_amax[j] = accumulate_amax(col_amax[j], values[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
#pragma unroll
        for (int mask = kVecsPerRow; mask < 32; mask <<= 1) {
          col_amax[j] = fmaxf(col_amax[j], __shfl_xor_sync(kFullWarpMask, col_amax[j], mask));
        }
      }
      if (lane < kVecsPerRow) {
#pragma unroll
        for (int j = 0; j < kVec; j += 4) {
          *reinterpret_cast<float4*>(&shared.column_amax[warp][vec_in_row * kVec + j]) =
              make_float4(col_amax[j], col_amax[j + 1], col_amax[j + 2], col_amax[j + 3]);
        }
      }
      block_cast_sync<kGrouped>();
      if (tid < kTile) {
        const int c = tid;
        float amax = shared.column_amax[0][c];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, shared.column_amax[w][c]);
        const float scale = block_scale(amax, kFp8Max, p.epsilon, power_of_2, kValueForInf);
        shared.column_scale[c] = scale;
        if (tile_col0 + c < cols) {
          // The column-wise copy is stored [cols, rows]: its 1-D grid's entry (c, row block).
          p.y_t_scale_inv[tile_row_block * launch::block_scale_grid_inner(cols, rows, false) +
                          tile_col0 + c] = __fdiv_rn(1.0f, scale);
        }
      }
      block_cast_sync<kGrouped>();
      // The values are converted again below, not held across the barriers as floats.
#pragma unroll
      for (int b = 0; b < kPasses; ++b) hide_from_optimizer(raw[b]);
      float scales[kVec];
#pragma unroll
      for (int j = 0; j < kVec; j += 4) {
        const float4 four =
            *reinterpret_cast<const float4*>(&shared.column_scale[vec_in_row * kVec + j]);
        scales[j] = four.x;
        scales[j + 1] = four.y;
        scales[j + 2] = four.z;
        scales[j + 3] = four.w;
      }
#pragma unroll
      for (int b = 0; b < kPasses; ++b) {
        const int row_in_tile = b * kRowsPerPass + row_in_pass;
        float values[kVec];
        block_cast_widen<Input>(raw[b], values);
        // Each element with its own column's scale; pairs of bytes packed into words.
        unsigned int words[kVec / 4];
#pragma unroll
        for (int j = 0; j < kVec; j += 4) {
          const unsigned int low = float2_to_fp8x2_bits<Output>(
              apply_scale(values[j], scales[j]), apply_scale(values[j + 1], scales[j + 1]));
          const unsigned int high = float2_to_fp8x2_bits<Output>(
              apply_scale(values[j + 2], scales[j + 2]), apply_scale(values[j + 3], scales[j + 3]));
          words[j / 4] = low | (high << 16);
        }
        stage_fp8_bytes<kVec>(&shared.staged[row_in_tile][vec_in_row * kVec], words);
      }
      block_cast_sync<kGrouped>();
      write_block_cast_transposed<kGrouped>(shared.staged, reinterpret_cast<unsigned char*>(p.y_t),
                                            rows, cols, tile_row0, tile_col0);
    }
  }
}

}  // namespace detail

// Block: launch::kBlockCastThreads (256). Grid: (launch::block_cast_grid_x(cols),
// launch::block_cast_grid_y(rows)), or any smaller gridDim.y >= 1 (row tiles are strided). No
// dynamic shared memory. y_scale_inv / y_t_scale_inv: the grids of the [rows, cols] and
// [cols, rows] copies (launch::block_scale_grid_outer/inner); padding entries are not written.
template <typename Input, typename Output, bool kTwoD = false, bool kWriteTranspose = true>
__global__ void __launch_bounds__(
    launch::kBlockCastThreads,
    launch::min_blocks(launch::kBlockCastThreads,
                       launch::block_cast_register_budget(sizeof(Input))))
    block_cast_transpose(BlockCastParams<Input, Output> p) {
  static_assert(DtypeTraits<Output>::kIsFp8, "block scaling casts to an FP8 format");
  constexpr int kTile = launch::kBlockCastTile;
  constexpr int kThreads = launch::kBlockCastThreads;
  constexpr int kWarps = kThreads / 32;
  constexpr int kVec = launch::vector_elems(sizeof(Input));
  constexpr int kVecsPerRow = kTile / kVec;                    // threads per tile row: 16 or 32
  constexpr int kRowsPerPass = kThreads / kVecsPerRow;         // 16 or 8
  constexpr int kPasses = detail::block_cast_passes<Input>();  // rows per thread: 8 or 16
  constexpr float kFp8Max = DtypeTraits<Output>::kMax;
  constexpr float kValueForInf = detail::BlockScaleValueForInf<Input>::kValue;
  static_assert(kVec == 4 || kVec == 8, "16-byte vectors of a 2- or 4-byte input dtype");
  static_assert(kVecsPerRow <= 32 && 32 % kVecsPerRow == 0, "a tile row within one warp");

  const int tile_col0 = blockIdx.x * kTile;
  if (tile_col0 >= p.cols) return;  // the whole block: cols == 0 launches one idle column tile
  const int vec_in_row = threadIdx.x % kVecsPerRow;
  const int row_in_pass = threadIdx.x / kVecsPerRow;
  const int col = tile_col0 + vec_in_row * kVec;
  const bool col_valid = col < p.cols;
  const long long rows = p.rows;
  const int cols = p.cols;

  // The whole tile's loads in flight before any arithmetic; rows and columns past the tensor
  // read as 0, which no amax notices.
  auto load_tile = [&](long long tile_row0, detail::BlockCastWords(&raw)[kPasses]) {
    const int rows_left = detail::block_cast_rows_left(rows, tile_row0 + row_in_pass);
    const Input* const in = p.x + (tile_row0 + row_in_pass) * cols + col;
    const long long pass_stride = static_cast<long long>(kRowsPerPass) * cols;
#pragma unroll
    for (int b = 0; b < kPasses; ++b) {
      raw[b] = col_valid && b * kRowsPerPass < rows_left
                   ? load_vec<unsigned int, 4>(
                         reinterpret_cast<const unsigned int*>(in + b * pass_stride))
                   : zero_vec<unsigned int, 4>();
    }
  };

  if constexpr (!kTwoD) {
    __shared__ detail::BlockCastRowsShared<kWriteTranspose> shared;
#pragma unroll 1
    for (long long tile_row0 = static_cast<long long>(blockIdx.y) * kTile; tile_row0 < rows;
         tile_row0 += static_cast<long long>(gridDim.y) * kTile) {
      detail::BlockCastWords raw[kPasses];
      load_tile(tile_row0, raw);
      detail::block_cast_rows_tile<Input, Output, kWriteTranspose>(raw, p, shared, tile_row0,
                                                                   tile_col0);
      // The next tile (gridDim.y smaller than the row tiles) reuses the shared buffers.
      if (tile_row0 + static_cast<long long>(gridDim.y) * kTile < rows) __syncthreads();
    }
  } else {
    // One 128 x 128 block: its amax over the block, then one scale for both copies.
    __shared__ __align__(
        16) unsigned char staged[kWriteTranspose ? kTile : 1][detail::kBlockCastStagePitch];
    __shared__ float warp_amax[kWarps];
    const bool power_of_2 = p.power_of_2_scale != 0;
    const bool write_rowwise = p.y != nullptr;
    const bool write_columnwise = kWriteTranspose && p.y_t != nullptr;
#pragma unroll 1
    for (long long tile_row0 = static_cast<long long>(blockIdx.y) * kTile; tile_row0 < rows;
         tile_row0 += static_cast<long long>(gridDim.y) * kTile) {
      const long long tile_row_block = tile_row0 / kTile;
      detail::BlockCastWords raw[kPasses];
      load_tile(tile_row0, raw);
      float amax = 0.0f;
#pragma unroll
      for (int b = 0; b < kPasses; ++b) {
        float values[kVec];
        detail::block_cast_widen<Input>(raw[b], values);
#pragma unroll
        for (int j = 0; j < kVec; ++j) amax = accumulate_amax(amax, values[j]);
      }
      publish_warp_amax(amax, warp_amax);
      __syncthreads();
      // The values are converted again below, not held across the barrier as 64 floats.
#pragma unroll
      for (int b = 0; b < kPasses; ++b) hide_from_optimizer(raw[b]);
      float block_amax = warp_amax[0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) block_amax = fmaxf(block_amax, warp_amax[w]);
      const float scale =
          detail::block_scale(block_amax, kFp8Max, p.epsilon, power_of_2, kValueForInf);
      if (threadIdx.x == 0) {
        const float scale_inv = __fdiv_rn(1.0f, scale);
        const long long col_block = blockIdx.x;
        if (write_rowwise) {
          p.y_scale_inv[tile_row_block * launch::block_scale_grid_inner(rows, cols, true) +
                        col_block] = scale_inv;
        }
        if (write_columnwise) {
          p.y_t_scale_inv[col_block * launch::block_scale_grid_inner(cols, rows, true) +
                          tile_row_block] = scale_inv;
        }
      }
#pragma unroll
      for (int b = 0; b < kPasses; ++b) {
        const int row_in_tile = b * kRowsPerPass + row_in_pass;
        const long long row = tile_row0 + row_in_tile;
        float values[kVec];
        detail::block_cast_widen<Input>(raw[b], values);
        const Vec<Output, kVec> converted = float_to_vec<Output, kVec>(values, scale);
        if (write_rowwise && col_valid && row < rows) {
          store_vec(p.y + row * cols + col, converted);
        }
        if constexpr (kWriteTranspose) {
          if (write_columnwise) {
            detail::stage_fp8_bytes<kVec>(&staged[row_in_tile][vec_in_row * kVec], &converted);
          }
        }
      }
      if constexpr (kWriteTranspose) {
        if (write_columnwise) {
          __syncthreads();
          detail::write_block_cast_transposed(staged, reinterpret_cast<unsigned char*>(p.y_t), rows,
                                              cols, tile_row0, tile_col0);
        }
      }
      // The next tile (gridDim.y smaller than the row tiles) reuses the shared buffers; the
      // barrier also orders warp_amax's reads before the next tile's writes.
      if (tile_row0 + static_cast<long long>(gridDim.y) * kTile < rows) __syncthreads();
    }
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_BLOCK_CAST_CUH_
