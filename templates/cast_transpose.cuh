// Cast to FP8 (or bf16/fp16/fp32) with amax, an optional transposed FP8 copy and optional dbias
// partial sums in one pass: TE's cast_transpose / cast_transpose_dbias.
//
// Entry points: cast_transpose<Input, Output, kWriteTranspose, kDbias, kStats>, and
// fp8_transpose<Fp8, kWriteTranspose> (the transposed copy of codes already cast, gathered from the
// ranks of a tensor-parallel sequence). Launch rules, shapes and alignment are in
// templates/README.md
// ("Tiled elementwise families").
#ifndef OPFUSE_TEMPLATES_CAST_TRANSPOSE_CUH_
#define OPFUSE_TEMPLATES_CAST_TRANSPOSE_CUH_

#include "common/column_partials.cuh"
#include "common/elementwise_tile.cuh"

namespace opfuse {

template <typename Input, typename Output>
struct CastParams {
  const Input* x;        // [rows, cols]
  Output* y;             // [rows, cols]; nullptr: only the transposed copy is written
  Output* y_t;           // [cols, rows] (kWriteTranspose)
  const float* scale;    // FP8 output: y = fp8(x * *scale)
  float* amax;           // max |x|; nullptr: not tracked
  float* dbias_partial;  // [gridDim.y, cols] column sums of x (kDbias)
  int rows;
  int cols;              // multiple of 16 / sizeof(Input)
  StatRecord* in_stats;  // kStats (kStatsOfInput only): statistics of x, one partial per block
};

namespace detail {

template <typename Input>
struct CastOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 1;  // input vectors per element
  struct Loaded {
    Vec<Input, kVec> x;
  };
  const Input* x;
  int cols;

  __device__ __forceinline__ Loaded load(long long row, int col) const {
    return Loaded{load_vec<Input, kVec>(x + row * cols + col)};
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    vec_to_float(loaded.x, values[0]);
  }
  __device__ __forceinline__ void add_input_stats(const Loaded& loaded,
                                                  StatAccumulator& acc) const {
    acc.add_vec(loaded.x);
  }
};

}  // namespace detail

// Block: launch::kTileThreads (256). Grid: (launch::tile_grid_x(cols), launch::tile_grid_y(rows))
// or any smaller gridDim.y >= 1 (row tiles are strided). kStats: 0, or launch::kStatsOfInput for
// the statistics of x (common/elementwise_tile.cuh), one partial record per block.
template <typename Input, typename Output, bool kWriteTranspose = true, bool kDbias = false,
          int kStats = 0>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input), detail::CastOp<Input>::kLoads,
                                                    kWriteTranspose, kDbias, kStats != 0)))
    cast_transpose(CastParams<Input, Output> params) {
  static_assert((kStats & ~launch::kStatsOfInput) == 0,
                "a cast measures the statistics of its input");
  const TileOutputs<Output> outputs{params.y,    params.y_t,  params.scale,
                                    params.amax, nullptr,     params.dbias_partial,
                                    params.rows, params.cols, params.in_stats};
  run_elementwise_tiles<Output, kWriteTranspose, kDbias, kStats>(
      outputs, detail::CastOp<Input>{params.x, params.cols});
}

template <typename Fp8>
struct Fp8TransposeParams {
  const Fp8* x;  // [rows, cols] FP8 codes
  Fp8* y_t;      // [cols, rows]: the same codes, transposed (no rescaling, no amax)
  int rows;
  int cols;  // multiple of 16
};

// The transposed copy of FP8 codes: a 128 x 64 tile staged as in cast_transpose and written by
// the same transposed write phase. Block: launch::kTileThreads (256). Grid: as cast_transpose
// (launch::tile_grid_x(cols), launch::tile_grid_y(rows), or any smaller gridDim.y >= 1).
// kWriteTranspose = false writes nothing: the inference forward's variant of a copy only backward
// reads (codegen launches it with an empty grid, so it never runs).
template <typename Fp8, bool kWriteTranspose = true>
__global__ void __launch_bounds__(launch::kTileThreads,
                                  launch::min_blocks(launch::kTileThreads,
                                                     launch::kTileRegisterBudget))
    fp8_transpose(Fp8TransposeParams<Fp8> params) {
  static_assert(DtypeTraits<Fp8>::kIsFp8, "fp8_transpose moves FP8 codes");
  if constexpr (!kWriteTranspose) return;
  constexpr int kVecsPerTileRow = launch::kTileCols / 16;
  constexpr int kRowsPerPass = launch::kTileThreads / kVecsPerTileRow;
  constexpr int kPasses = launch::kTileRows / kRowsPerPass;
  __shared__ __align__(16) unsigned char staged[1][launch::kTileRows][detail::kTileStagePitch];
  TileOutputs<Fp8> outputs{};
  outputs.out_t = params.y_t;
  outputs.rows = params.rows;
  outputs.cols = params.cols;
  const unsigned char* x = reinterpret_cast<const unsigned char*>(params.x);
  const int tile_col0 = static_cast<int>(blockIdx.x) * launch::kTileCols;
  const int vec_in_row = threadIdx.x % kVecsPerTileRow;
  const int col = tile_col0 + vec_in_row * 16;
  const int row_in_pass = threadIdx.x / kVecsPerTileRow;
  for (long long tile_row0 = static_cast<long long>(blockIdx.y) * launch::kTileRows;
       tile_row0 < params.rows;
       tile_row0 += static_cast<long long>(gridDim.y) * launch::kTileRows) {
    uint4 loaded[kPasses];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const long long row = tile_row0 + p * kRowsPerPass + row_in_pass;
      loaded[p] = col < params.cols && row < params.rows
                      ? *reinterpret_cast<const uint4*>(x + row * params.cols + col)
                      : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      // 16 bytes at a 4-byte aligned offset (the pitch is not a multiple of 8).
      unsigned int* dst = reinterpret_cast<unsigned int*>(
          &staged[0][p * kRowsPerPass + row_in_pass][vec_in_row * 16]);
      dst[0] = loaded[p].x;
      dst[1] = loaded[p].y;
      dst[2] = loaded[p].z;
      dst[3] = loaded[p].w;
    }
    __syncthreads();
    detail::write_transposed_tile<1>(staged, outputs, tile_row0, tile_col0);
    __syncthreads();
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_CAST_TRANSPOSE_CUH_
