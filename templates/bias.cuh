// Bias add and residual add (AddExtraInput), after an optional constant scale of x (TE's
// ForwardAxpy: constant_scale then add_extra_input), optionally fused with a cast to FP8 (+amax,
// +an optional transposed copy), and the dbias column reduction.
//
// Entry points: bias_add<Input, Output, kHasBias, kHasResidual, kWriteTranspose> and
// dbias_partial<Input> (first stage; the second stage is reduce_column_partials<Output> from
// common/column_partials.cuh). Launch rules, shapes and alignment: templates/README.md.
#ifndef OPFUSE_TEMPLATES_BIAS_CUH_
#define OPFUSE_TEMPLATES_BIAS_CUH_

#include "common/column_partials.cuh"
#include "common/elementwise_tile.cuh"

namespace opfuse {

template <typename Input, typename Output>
struct BiasAddParams {
  const Input* x;         // [rows, cols]
  const Input* bias;      // [cols] (kHasBias)
  const Input* residual;  // [rows, cols] (kHasResidual)
  Output* y;              // [rows, cols] = x' + bias + residual; nullptr: only y_t is written
  Output* y_t;            // [cols, rows] FP8 transposed copy (kWriteTranspose)
  const float* scale;     // FP8 output: y = fp8(value * *scale)
  float* amax;            // max |value| (before scaling; as stored if not FP8); nullptr: none
  const QuantizerRecord* scale_record;  // current scaling measured here (derive_current_scale)
  // x' = factor * x in fp32 (1: x itself), not rounded before the adds: a constant_scale fused
  // in front (a declared axpy fusion), computed as the CPU reference computes a fused op.
  float factor;
  int rows;
  int cols;  // multiple of 16 / sizeof(Input)
};

template <typename Input>
struct DbiasParams {
  const Input* dy;       // [rows, cols]
  float* dbias_partial;  // [gridDim.y, cols] fp32 column sums of dy
  int rows;
  int cols;  // multiple of 16 / sizeof(Input)
};

namespace detail {

// value = (x' + bias) + residual, added in that order in fp32 (x' as BiasAddParams says).
template <typename Input, bool kHasBias, bool kHasResidual>
struct BiasAddOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 1 + (kHasBias ? 1 : 0) + (kHasResidual ? 1 : 0);
  struct Loaded {
    Vec<Input, kVec> x;
    Vec<Input, kVec> bias;
    Vec<Input, kVec> residual;
  };
  const Input* x;
  const Input* bias;
  const Input* residual;
  float factor;
  int cols;

  __device__ __forceinline__ Loaded load(long long row, int col) const {
    Loaded loaded;
    const long long offset = row * cols + col;
    loaded.x = load_vec<Input, kVec>(x + offset);
    // The bias vector is the same for every row of this thread: after the first row it is an L1
    // hit, never extra DRAM traffic.
    if constexpr (kHasBias) loaded.bias = load_vec<Input, kVec>(bias + col);
    if constexpr (kHasResidual) loaded.residual = load_vec<Input, kVec>(residual + offset);
    return loaded;
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    vec_to_float(loaded.x, values[0]);
#pragma unroll
    for (int j = 0; j < kVec; ++j) values[0][j] *= factor;  // exact when factor is 1
    if constexpr (kHasBias) {
      float b[kVec];
      vec_to_float(loaded.bias, b);
#pragma unroll
      for (int j = 0; j < kVec; ++j) values[0][j] += b[j];
    }
    if constexpr (kHasResidual) {
      float r[kVec];
      vec_to_float(loaded.residual, r);
#pragma unroll
      for (int j = 0; j < kVec; ++j) values[0][j] += r[j];
    }
  }
};

template <typename Input>
struct ColumnSumOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 1;
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
};

}  // namespace detail

// Block: launch::kTileThreads (256). Grid: (launch::tile_grid_x(cols), launch::tile_grid_y(rows))
// or any smaller gridDim.y >= 1 (row tiles are strided).
template <typename Input, typename Output, bool kHasBias = true, bool kHasResidual = false,
          bool kWriteTranspose = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(
                           sizeof(Input), detail::BiasAddOp<Input, kHasBias, kHasResidual>::kLoads,
                           kWriteTranspose, false))) bias_add(BiasAddParams<Input, Output> params) {
  static_assert(kHasBias || kHasResidual, "bias_add needs a bias, a residual or both");
  const TileOutputs<Output> outputs{params.y,    params.y_t,          params.scale,
                                    params.amax, params.scale_record, nullptr,
                                    params.rows, params.cols};
  run_elementwise_tiles<Output, kWriteTranspose, false>(
      outputs, detail::BiasAddOp<Input, kHasBias, kHasResidual>{
                   params.x, params.bias, params.residual, params.factor, params.cols});
}

// Column sums of dy into dbias_partial (one row per blockIdx.y); finish with
// reduce_column_partials over gridDim.y partial rows. Same launch rules as bias_add; a smaller
// gridDim.y (e.g. 2 * SMs / gridDim.x) means fewer partial rows for the second stage.
template <typename Input>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input),
                                                    detail::ColumnSumOp<Input>::kLoads, false,
                                                    true)))
    dbias_partial(DbiasParams<Input> params) {
  const TileOutputs<float> outputs{
      nullptr, nullptr, nullptr, nullptr, nullptr, params.dbias_partial, params.rows, params.cols};
  run_elementwise_tiles<float, false, true>(outputs,
                                            detail::ColumnSumOp<Input>{params.dy, params.cols});
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_BIAS_CUH_
