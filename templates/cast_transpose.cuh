// Cast to FP8 (or bf16/fp16/fp32) with amax, an optional transposed FP8 copy and optional dbias
// partial sums in one pass: TE's cast_transpose / cast_transpose_dbias.
//
// Entry point: cast_transpose<Input, Output, kWriteTranspose, kDbias, kStats>. Launch rules, shapes
// and alignment are in templates/README.md ("Tiled elementwise families").
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

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_CAST_TRANSPOSE_CUH_
