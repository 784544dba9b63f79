// The tiled elementwise engine behind cast_transpose.cuh, activation.cuh and bias.cuh.
//
// One pass over memory does everything a fused elementwise group needs at its output: an Op loads
// its inputs for 16 bytes of one row and computes fp32 values for one or two output planes; the
// engine tracks amax, stores the row-wise output (cast to bf16/fp16/fp32, or scaled and cast to
// FP8), stages FP8 bytes in shared memory for the transposed copy, sums columns for dbias, and
// (kMicroFormat) writes the output's MXFP8 row-wise copy, decoded.
//
// Geometry (launch_rules.h): a block of 256 threads owns a 128 x 64 tile of a plane. A thread owns
// one 16-byte input vector per "pass" (kVec columns of one row); the block covers the tile in 4
// passes (2-byte inputs, 8 threads per tile row) or 8 passes (fp32 inputs, 16 threads per tile
// row), loaded in batches of launch::tile_passes_per_batch. blockIdx.x picks the column tile;
// blockIdx.y walks row tiles with a stride of gridDim.y, so a thread's columns never change and its
// dbias sums stay in registers until the end. With statistics and no dbias the schedule is flat
// instead: gridDim.x blocks (the GPU's resident blocks, one wave) each run an equal contiguous run
// of the column-major tiles, so no partial last wave idles the GPU and few partial records need
// merging (run_elementwise_tiles).
//
// The Op concept:
//   static constexpr int kVec;     // elements per input vector: 16 / sizeof(input dtype)
//   static constexpr int kPlanes;  // 1, or 2 when one input column yields two output columns
//   struct Loaded;                 // raw vectors, loaded for all passes before any is used
//   Loaded load(long long row, int col) const;
//   void compute(const Loaded&, float (&values)[kPlanes][kVec]) const;
//   static constexpr bool kSumsColumns;  // optional: no flat schedule (a thread's columns fixed)
//   void add_input_stats(const Loaded&, StatAccumulator&) const;  // kStats &
//   launch::kStatsOfInput:
//                                  // the values of the op's first input this vector read
// Plane p of output column c is column p * cols + c of the [rows, kPlanes * cols] output and row
// p * cols + c of the [kPlanes * cols, rows] transposed copy.
#ifndef OPFUSE_TEMPLATES_COMMON_ELEMENTWISE_TILE_CUH_
#define OPFUSE_TEMPLATES_COMMON_ELEMENTWISE_TILE_CUH_

#include "fp8.cuh"
#include "launch_rules.h"
#include "micro_scale_math.cuh"
#include "quantizer_record.cuh"
#include "stat_record.cuh"
#include "transpose.cuh"
#include "types.cuh"
#include "vec.cuh"

namespace opfuse {

// Where a tiled kernel writes. Families embed these fields in their own params structs.
template <typename Output>
struct TileOutputs {
  Output* out;         // [rows, kPlanes * cols] row-wise output; nullptr: not written
  Output* out_t;       // [kPlanes * cols, rows] FP8 transposed copy (kTranspose only)
  const float* scale;  // FP8 output only: values are cast as apply_scale(value, *scale)
  float* amax;  // max |value| (before scaling; as stored for a non-FP8 output), one atomicMax per
                // block; nullptr: not tracked
  const QuantizerRecord* scale_record;  // current scaling measured here: the last block derives
                                        // the scale (derive_current_scale); nullptr: none
  float* dbias_partial;  // kDbias only: [gridDim.y, kPlanes * cols] fp32 column sums of the values
  int rows;
  int cols;  // width of one plane; multiple of kVec
  // kStats only: one partial record per block (blockIdx.y * gridDim.x + blockIdx.x), merged by
  // tensor_stats_final; nullptr where the bit is not set.
  StatRecord* in_stats = nullptr;
  StatRecord* out_stats = nullptr;
  // kMicroFormat >= 0 only: [rows, kPlanes * cols] the output's 1 x 32 MXFP8 row-wise copy,
  // decoded to Output (quantized from the values as Output stores them); nullptr: not written.
  Output* out_micro = nullptr;
};

namespace detail {

// Staging pitch in bytes of one tile row: +4 puts the two row halves read by one warp in the
// transposed pass (rows r and r + 16) on different banks.
constexpr int kTileStagePitch = launch::kTileCols + 4;

// Writes the transposed copy of one staged tile: item = (plane, 16-row block, 4-column group);
// a warp covers 2 row blocks x 16 column groups, so lanes (block 0, g) and (block 1, g) fill one
// 32-byte sector of the same output row.
template <int kPlanes, typename Output>
__device__ __forceinline__ void write_transposed_tile(
    const unsigned char (*staged)[launch::kTileRows][kTileStagePitch],
    const TileOutputs<Output>& args, long long tile_row0, int tile_col0) {
  constexpr int kColumnGroups = launch::kTileCols / 4;
  constexpr int kRowBlocks = launch::kTileRows / 16;
  constexpr int kItemsPerPlane = kColumnGroups * kRowBlocks;
  static_assert(kPlanes * kItemsPerPlane <= launch::kTileThreads, "one item per thread");
  if (threadIdx.x >= kPlanes * kItemsPerPlane) return;
  const int plane = threadIdx.x / kItemsPerPlane;
  const int row_block = (threadIdx.x % kItemsPerPlane) / kColumnGroups;
  const int column_group = threadIdx.x % kColumnGroups;
  const int col = tile_col0 + 4 * column_group;
  const long long row0 = tile_row0 + 16 * row_block;
  if (col >= args.cols || row0 >= args.rows) return;

  unsigned char* out_t = reinterpret_cast<unsigned char*>(args.out_t);
  const unsigned char* block = &staged[plane][16 * row_block][4 * column_group];
  if (args.rows % 16 != 0) {
#pragma unroll 1
    for (int k = 0; k < 4; ++k) {
      const long long out_row = static_cast<long long>(plane) * args.cols + col + k;
      store_column_bytes(out_t + out_row * args.rows + row0, block + k, kTileStagePitch,
                         args.rows - row0);
    }
    return;
  }
  unsigned int words[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    words[i] = *reinterpret_cast<const unsigned int*>(block + i * kTileStagePitch);
  }
  uint4 columns[4];
  transpose_16x4_bytes(words, columns);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const long long out_row = static_cast<long long>(plane) * args.cols + col + k;
    *reinterpret_cast<uint4*>(out_t + out_row * args.rows + row0) = columns[k];
  }
}

}  // namespace detail

// Runs every tile of the grid through op. Must be called by all threads of a block of
// launch::kTileThreads threads (it holds barriers).
// Op::kSumsColumns, or false for an Op without it: an Op that sums its own per-column values
// over the rows (a learned parameter's gradient, activation.cuh) needs a thread's columns fixed.
template <typename Op, typename = void>
struct OpSumsColumns {
  static constexpr bool value = false;
};
template <typename Op>
struct OpSumsColumns<Op, decltype(void(Op::kSumsColumns))> {
  static constexpr bool value = Op::kSumsColumns;
};

// kMicroFormat (launch::kMicroScaleE4M3 / E5M2; -1: none): also the output's MXFP8 row-wise copy,
// decoded (TileOutputs::out_micro): a 1 x 32 block is the vectors of 32 / kVec consecutive lanes
// (tile columns start at multiples of 64), whose amax is one butterfly among them.
template <typename Output, bool kTranspose, bool kDbias, int kStats = 0, typename StatsAs = float,
          int kMicroFormat = -1, typename Op>
__device__ __forceinline__ void run_elementwise_tiles(const TileOutputs<Output>& args,
                                                      const Op& op) {
  constexpr int kVec = Op::kVec;
  constexpr int kPlanes = Op::kPlanes;
  constexpr int kThreads = launch::kTileThreads;
  constexpr int kWarps = kThreads / 32;
  constexpr int kTileRows = launch::kTileRows;
  constexpr int kTileCols = launch::kTileCols;
  constexpr int kVecsPerTileRow = kTileCols / kVec;
  constexpr int kRowsPerPass = kThreads / kVecsPerTileRow;
  constexpr int kPasses = kTileRows / kRowsPerPass;
  constexpr int kPassesPerBatch = launch::tile_passes_per_batch(kPasses, Op::kLoads);
  constexpr bool kIsFp8 = DtypeTraits<Output>::kIsFp8;
  // With statistics and no dbias (whose column sums need a block's columns fixed): a flat
  // schedule of equal runs of tiles, one per block (below).
  constexpr bool kFlatSchedule = kStats != 0 && !kDbias && !OpSumsColumns<Op>::value;
  static_assert(kVec == 4 || kVec == 8, "16-byte vectors of a 2- or 4-byte input dtype");
  static_assert(kPlanes == 1 || kPlanes == 2, "one or two output planes");
  static_assert(!kTranspose || kIsFp8, "the transposed copy is an FP8 output");
  constexpr bool kMicro = kMicroFormat >= 0;
  static_assert(!kMicro || (!kIsFp8 && !kTranspose && (kMicroFormat == launch::kMicroScaleE4M3 ||
                                                       kMicroFormat == launch::kMicroScaleE5M2)),
                "the MXFP8 copy is decoded to a 16- or 32-bit output; NVFP4 needs its amax first");
  constexpr int kMicroLanes = 32 / kVec;  // lanes of one 1 x 32 block

  __shared__ __align__(
      16) unsigned char staged[kTranspose ? kPlanes : 1][kTileRows][detail::kTileStagePitch];
  __shared__ float amax_scratch[kWarps];
  __shared__ float dbias_scratch[kDbias ? kPlanes : 1][kWarps][kTileCols];
  __shared__ StatSums stats_scratch[kStats != 0 ? kWarps : 1];
  StatAccumulator in_acc, out_acc;

  const int vec_in_row = threadIdx.x % kVecsPerTileRow;
  const int row_in_pass = threadIdx.x / kVecsPerTileRow;
  // The column tile of a block walking rows (below); a flat schedule sets it per tile.
  int tile_col0 = blockIdx.x * kTileCols;
  const long long out_stride = static_cast<long long>(kPlanes) * args.cols;
  float scale = 1.0f;
  if constexpr (kIsFp8) scale = *args.scale;

  float amax = 0.0f;
  float dbias[kPlanes][kVec];
#pragma unroll
  for (int plane = 0; plane < kPlanes; ++plane) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) dbias[plane][j] = 0.0f;
  }

  // One tile: rows [tile_row0, tile_row0 + kTileRows) of the columns of tile_col0. last_tile: the
  // block's last (its amax is published with the transposed copy's barrier).
  auto run_tile = [&](long long tile_row0, bool last_tile) {
    const int col = tile_col0 + vec_in_row * kVec;
    const bool col_valid = col < args.cols;
    // Issue the loads of kPassesPerBatch passes before any arithmetic (launch_rules.h: 64 bytes
    // or 2 passes per thread). Batches stay a loop: unrolled, ptxas hoists the next batch's loads
    // over this one's arithmetic and spills (the bf16 SwiGLU backward with its transposed copy).
#pragma unroll 1
    for (int batch = 0; batch < kPasses; batch += kPassesPerBatch) {
      typename Op::Loaded loaded[kPassesPerBatch];
#pragma unroll
      for (int b = 0; b < kPassesPerBatch; ++b) {
        const long long row = tile_row0 + (batch + b) * kRowsPerPass + row_in_pass;
        if (col_valid && row < args.rows) loaded[b] = op.load(row, col);
      }
#pragma unroll
      for (int b = 0; b < kPassesPerBatch; ++b) {
        const int row_in_tile = (batch + b) * kRowsPerPass + row_in_pass;
        const long long row = tile_row0 + row_in_tile;
        const bool valid = col_valid && row < args.rows;
        float values[kPlanes][kVec];
        if (valid) {
          op.compute(loaded[b], values);
          // After every load of the batch is issued (here, not at the load: a use there waits
          // for each load before the next is issued).
          if constexpr ((kStats & launch::kStatsOfInput) != 0)
            op.add_input_stats(loaded[b], in_acc);
        } else {
#pragma unroll
          for (int plane = 0; plane < kPlanes; ++plane) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) values[plane][j] = 0.0f;
          }
        }
#pragma unroll
        for (int plane = 0; plane < kPlanes; ++plane) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            amax = accumulate_amax(amax, values[plane][j]);
            if constexpr (kDbias) dbias[plane][j] += values[plane][j];
          }
          if constexpr ((kStats & launch::kStatsOfOutput) != 0) {
            // The values as a StatsAs tensor would hold them (rounded; bf16 pairs packed).
            if (valid) out_acc.add_vec(float_to_vec<StatsAs, kVec>(values[plane], 1.0f));
          }
          const Vec<Output, kVec> converted = float_to_vec<Output, kVec>(values[plane], scale);
          const long long at = row * out_stride + static_cast<long long>(plane) * args.cols + col;
          if (valid && args.out != nullptr) store_vec(args.out + at, converted);
          if constexpr (kMicro) {
            // Every lane runs the butterfly (an invalid vector holds zeros and stores nothing; a
            // 1 x 32 block is wholly valid or not, cols being a multiple of 32).
            float stored[kVec];
            vec_to_float(converted, stored);
            float block_amax = 0.0f;
#pragma unroll
            for (int j = 0; j < kVec; ++j) block_amax = accumulate_amax(block_amax, stored[j]);
#pragma unroll
            for (int mask = 1; mask < kMicroLanes; mask <<= 1)
              block_amax = fmaxf(block_amax, __shfl_xor_sync(kFullWarpMask, block_amax, mask));
            const detail::MicroBlockScale s =
                detail::micro_block_scale<kMicroFormat>(block_amax, 1.0f, 1.0f);
            detail::micro_fake_quantize<kMicroFormat>(stored, s);
            if (valid && args.out_micro != nullptr)
              store_vec(args.out_micro + at, float_to_vec<Output, kVec>(stored, 1.0f));
          }
          if constexpr (kTranspose) {
            // kVec FP8 bytes at a 4-byte aligned offset (the pitch is not a multiple of 8).
            unsigned int* dst =
                reinterpret_cast<unsigned int*>(&staged[plane][row_in_tile][vec_in_row * kVec]);
            const unsigned int* src = reinterpret_cast<const unsigned int*>(&converted);
#pragma unroll
            for (int w = 0; w < kVec / 4; ++w) dst[w] = src[w];
          }
        }
      }
    }
    if constexpr (kTranspose) {
      // On the block's last tile the barrier before the write phase also publishes the warps'
      // amax, and no barrier follows the write phase: the block ends without the three barriers
      // of a separate amax reduction and the staging buffer's release.
      if (last_tile && args.amax != nullptr) {
        publish_warp_amax(published_amax<Output>(amax), amax_scratch);
      }
      __syncthreads();
      detail::write_transposed_tile<kPlanes>(staged, args, tile_row0, tile_col0);
      if (last_tile) {
        if (args.amax != nullptr) commit_published_amax<kWarps>(args.amax, amax_scratch);
      } else {
        __syncthreads();
      }
    }
  };

  if constexpr (kFlatSchedule) {
    // Flat: the column-major tiles (a column's row tiles in order, then the next column's) split
    // into gridDim.x equal contiguous runs, one per block: one wave of blocks when the grid is
    // the resident blocks of the GPU, with no partial last wave (launch_rules.h,
    // kStatsTileBlocksPerSm). A block's runs are fixed by its index: deterministic statistics.
    // Counts fit an int: a tile holds kTileRows * kTileCols elements.
    const int row_tiles = (args.rows + kTileRows - 1) / kTileRows;
    const int tiles = row_tiles * ((args.cols + kTileCols - 1) / kTileCols);
    const int first = static_cast<int>(static_cast<long long>(tiles) * blockIdx.x / gridDim.x);
    int count =
        static_cast<int>(static_cast<long long>(tiles) * (blockIdx.x + 1) / gridDim.x) - first;
    int row_tile = row_tiles > 0 ? first % row_tiles : 0;
    tile_col0 = row_tiles > 0 ? first / row_tiles * kTileCols : 0;
    for (; count > 0; --count) {
      run_tile(static_cast<long long>(row_tile) * kTileRows, count == 1);
      if (++row_tile == row_tiles) {
        row_tile = 0;
        tile_col0 += kTileCols;
      }
    }
  } else {
    for (long long tile_row0 = static_cast<long long>(blockIdx.y) * kTileRows;
         tile_row0 < args.rows; tile_row0 += static_cast<long long>(gridDim.y) * kTileRows) {
      run_tile(tile_row0, tile_row0 + static_cast<long long>(gridDim.y) * kTileRows >= args.rows);
    }
  }

  if constexpr (!kTranspose) {
    commit_block_amax<kThreads>(published_amax<Output>(amax), args.amax, amax_scratch);
  }
  derive_current_scale(args.scale_record);  // thread 0, after its block's amax atomic

  if constexpr (kStats != 0) {
    const long long block = static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x;
    if constexpr ((kStats & launch::kStatsOfInput) != 0) {
      const StatRecord r = block_stat_record<kThreads>(in_acc.record(), stats_scratch);
      if (threadIdx.x == 0) args.in_stats[block] = r;
      __syncthreads();  // stats_scratch is reused below
    }
    if constexpr ((kStats & launch::kStatsOfOutput) != 0) {
      const StatRecord r = block_stat_record<kThreads>(out_acc.record(), stats_scratch);
      if (threadIdx.x == 0) args.out_stats[block] = r;
    }
  }

  if constexpr (kDbias) {
    // Threads of one column vector: lanes vec_in_row + k * kVecsPerTileRow of every warp. Add them
    // by shuffles, then the warps in order through shared memory: a fixed order, deterministic.
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int plane = 0; plane < kPlanes; ++plane) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float v = dbias[plane][j];
#pragma unroll
        for (int mask = kVecsPerTileRow; mask < 32; mask <<= 1) {
          v += __shfl_xor_sync(kFullWarpMask, v, mask);
        }
        if (lane < kVecsPerTileRow) dbias_scratch[plane][warp][lane * kVec + j] = v;
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < kPlanes * kTileCols; idx += kThreads) {
      const int plane = idx / kTileCols;
      const int c = idx % kTileCols;
      float sum = dbias_scratch[plane][0][c];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) sum += dbias_scratch[plane][w][c];
      if (tile_col0 + c < args.cols) {
        args.dbias_partial[static_cast<long long>(blockIdx.y) * out_stride +
                           static_cast<long long>(plane) * args.cols + tile_col0 + c] = sum;
      }
    }
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_ELEMENTWISE_TILE_CUH_
