// Activations, plain and gated, forward and backward, with the output cast fused. The math is a
// functor template argument `Act`, generated per op from its scalar-expression definition
// (compiler/ir/pointwise_ops.h, prepended to each kernel's source by codegen):
//   static constexpr int kInputs;   // 1 (plain) or 2 (gated: gate, linear)
//   static float forward(const float (&in)[kInputs]);
//   static void backward(const float (&in)[kInputs], float dy, float (&grad)[kInputs]);
// Gated ops follow TE's convention: for an input [rows, 2n] the FIRST half is the gate, the
// second half the linear part, in[0] and in[1].
//
// Entry points: activation_fwd, gated_activation_fwd, activation_bwd, gated_activation_bwd, each
// <Act, Input, Output, kWriteTranspose[, kDbias]>. ExampleIdentity and ExampleProduct below are
// the contract's examples (so this header compiles and instantiates on its own).
// Launch rules, shapes and alignment: templates/README.md ("Tiled elementwise families").
#ifndef OPFUSE_TEMPLATES_ACTIVATION_CUH_
#define OPFUSE_TEMPLATES_ACTIVATION_CUH_

#include "common/column_partials.cuh"
#include "common/elementwise_tile.cuh"
#include "common/scalar_math.cuh"

namespace opfuse {

// y = x: the plain contract's example.
struct ExampleIdentity {
  static constexpr int kInputs = 1;
  __device__ __forceinline__ static float forward(const float (&in)[1]) { return in[0]; }
  __device__ __forceinline__ static void backward(const float (&)[1], float dy, float (&grad)[1]) {
    grad[0] = dy;
  }
};

// y = gate * linear: the gated contract's example.
struct ExampleProduct {
  static constexpr int kInputs = 2;
  __device__ __forceinline__ static float forward(const float (&in)[2]) { return in[0] * in[1]; }
  __device__ __forceinline__ static void backward(const float (&in)[2], float dy,
                                                  float (&grad)[2]) {
    grad[0] = in[1] * dy;
    grad[1] = in[0] * dy;
  }
};

// ---------------------------------------------------------------------------------------------
// Params. cols is always the width n of one output plane (for gated ops the input is [rows, 2n]).
// ---------------------------------------------------------------------------------------------
// StatsAs: the dtype whose values the output's statistics see (kStats); the struct names it so a
// kernel's parameter carries every dtype the kernel is built on.
template <typename Input, typename Output, typename StatsAs = float>
struct ActivationFwdParams {
  const Input* x;      // plain: [rows, cols]; gated: [rows, 2 * cols] (gate | linear)
  Output* y;           // [rows, cols]; nullptr: only the transposed copy is written
  Output* y_t;         // [cols, rows] FP8 transposed copy (kWriteTranspose)
  const float* scale;  // FP8 output: y = fp8(value * *scale)
  float* amax;         // max |value| (before scaling; as stored if not FP8); nullptr: not tracked
  const QuantizerRecord* scale_record;  // current scaling measured here (derive_current_scale)
  int rows;
  int cols;               // multiple of 16 / sizeof(Input)
  StatRecord* in_stats;   // kStats & kStatsOfInput: statistics of x, one partial per block
  StatRecord* out_stats;  // kStats & kStatsOfOutput: statistics of y as StatsAs, one per block
};

// StatsAs: the dtype whose values the output's statistics see (kStats); the struct names it so a
// kernel's parameter carries every dtype the kernel is built on.
template <typename Input, typename Output, typename StatsAs = float>
struct ActivationBwdParams {
  const Input* dy;     // [rows, cols]
  const Input* x;      // saved forward input: plain [rows, cols]; gated [rows, 2 * cols]
  Output* dx;          // plain [rows, cols]; gated [rows, 2 * cols]; nullptr: not written
  Output* dx_t;        // plain [cols, rows]; gated [2 * cols, rows] (kWriteTranspose)
  const float* scale;  // FP8 output (E5M2 for gradients): dx = fp8(value * *scale)
  float* amax;         // max |dx| (before scaling; as stored if not FP8); nullptr: not tracked
  const QuantizerRecord* scale_record;  // current scaling measured here (derive_current_scale)
  float* dbias_partial;  // plain [gridDim.y, cols]; gated [gridDim.y, 2 * cols] (kDbias)
  int rows;
  int cols;               // multiple of 16 / sizeof(Input)
  StatRecord* in_stats;   // kStats & kStatsOfInput: statistics of dy, one partial per block
  StatRecord* out_stats;  // kStats & kStatsOfOutput: statistics of dx as StatsAs, one per block
};

namespace detail {

template <typename Act, typename Input>
struct ActivationFwdOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 1;  // input vectors per element
  struct Loaded {
    Vec<Input, kVec> x;
  };
  const Input* x;
  int cols;

  // Where input vector `load` of element (row, col) is; Loaded from the vectors in that order.
  __device__ __forceinline__ const Input* source(int /*load*/, long long row, int col) const {
    return x + row * cols + col;
  }
  static __device__ __forceinline__ Loaded from_vectors(const Vec<Input, kVec> (&v)[kLoads]) {
    return Loaded{v[0]};
  }
  __device__ __forceinline__ Loaded load(long long row, int col) const {
    return from_vectors({load_vec<Input, kVec>(source(0, row, col))});
  }
  __device__ __forceinline__ void add_input_stats(const Loaded& loaded,
                                                  StatAccumulator& acc) const {
    acc.add_vec(loaded.x);
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    float in[kVec];
    vec_to_float(loaded.x, in);
    static_assert(Act::kInputs == 1, "activation_fwd takes a plain (one-input) functor");
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float args[1] = {in[j]};
      values[0][j] = Act::forward(args);
    }
  }
};

template <typename Act, typename Input>
struct GatedActivationFwdOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 2;  // input vectors per element
  struct Loaded {
    Vec<Input, kVec> gate;
    Vec<Input, kVec> linear;
  };
  const Input* x;
  int cols;

  // gate (0) and linear (1) of element (row, col).
  __device__ __forceinline__ const Input* source(int load, long long row, int col) const {
    return x + row * (2LL * cols) + col + (load == 1 ? cols : 0);
  }
  static __device__ __forceinline__ Loaded from_vectors(const Vec<Input, kVec> (&v)[kLoads]) {
    return Loaded{v[0], v[1]};
  }
  __device__ __forceinline__ Loaded load(long long row, int col) const {
    return from_vectors(
        {load_vec<Input, kVec>(source(0, row, col)), load_vec<Input, kVec>(source(1, row, col))});
  }
  __device__ __forceinline__ void add_input_stats(const Loaded& loaded,
                                                  StatAccumulator& acc) const {
    acc.add_vec(loaded.gate);
    acc.add_vec(loaded.linear);
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    float gate[kVec], linear[kVec];
    vec_to_float(loaded.gate, gate);
    vec_to_float(loaded.linear, linear);
    static_assert(Act::kInputs == 2, "gated_activation_fwd takes a gated (two-input) functor");
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float args[2] = {gate[j], linear[j]};
      values[0][j] = Act::forward(args);
    }
  }
};

template <typename Act, typename Input>
struct ActivationBwdOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 2;  // input vectors per element
  struct Loaded {
    Vec<Input, kVec> dy;
    Vec<Input, kVec> x;
  };
  const Input* dy;
  const Input* x;
  int cols;

  // dy (0) and x (1) of element (row, col).
  __device__ __forceinline__ const Input* source(int load, long long row, int col) const {
    return (load == 0 ? dy : x) + row * cols + col;
  }
  static __device__ __forceinline__ Loaded from_vectors(const Vec<Input, kVec> (&v)[kLoads]) {
    return Loaded{v[0], v[1]};
  }
  __device__ __forceinline__ Loaded load(long long row, int col) const {
    return from_vectors(
        {load_vec<Input, kVec>(source(0, row, col)), load_vec<Input, kVec>(source(1, row, col))});
  }
  __device__ __forceinline__ void add_input_stats(const Loaded& loaded,
                                                  StatAccumulator& acc) const {
    acc.add_vec(loaded.dy);
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    float grad[kVec], in[kVec];
    vec_to_float(loaded.dy, grad);
    vec_to_float(loaded.x, in);
    static_assert(Act::kInputs == 1, "activation_bwd takes a plain (one-input) functor");
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float args[1] = {in[j]};
      float dx[1];
      Act::backward(args, grad[j], dx);
      values[0][j] = dx[0];
    }
  }
};

// d gate (plane 0) and d linear (plane 1), as the functor's backward gives them.
template <typename Act, typename Input>
struct GatedActivationBwdOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 2;
  static constexpr int kLoads = 3;  // input vectors per element
  struct Loaded {
    Vec<Input, kVec> dy;
    Vec<Input, kVec> gate;
    Vec<Input, kVec> linear;
  };
  const Input* dy;
  const Input* x;
  int cols;

  // dy (0), gate (1) and linear (2) of element (row, col).
  __device__ __forceinline__ const Input* source(int load, long long row, int col) const {
    return load == 0 ? dy + row * cols + col
                     : x + row * (2LL * cols) + col + (load == 2 ? cols : 0);
  }
  static __device__ __forceinline__ Loaded from_vectors(const Vec<Input, kVec> (&v)[kLoads]) {
    return Loaded{v[0], v[1], v[2]};
  }
  __device__ __forceinline__ Loaded load(long long row, int col) const {
    return from_vectors({load_vec<Input, kVec>(source(0, row, col)),
                         load_vec<Input, kVec>(source(1, row, col)),
                         load_vec<Input, kVec>(source(2, row, col))});
  }
  __device__ __forceinline__ void add_input_stats(const Loaded& loaded,
                                                  StatAccumulator& acc) const {
    acc.add_vec(loaded.dy);
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    float grad[kVec], gate[kVec], linear[kVec];
    vec_to_float(loaded.dy, grad);
    vec_to_float(loaded.gate, gate);
    vec_to_float(loaded.linear, linear);
    static_assert(Act::kInputs == 2, "gated_activation_bwd takes a gated (two-input) functor");
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float args[2] = {gate[j], linear[j]};
      float d[2];
      Act::backward(args, grad[j], d);
      values[0][j] = d[0];
      values[1][j] = d[1];
    }
  }
};

}  // namespace detail

// Block: launch::kTileThreads (256). Grid: (launch::tile_grid_x(cols), launch::tile_grid_y(rows))
// or any smaller gridDim.y >= 1 (row tiles are strided). kStats (common/elementwise_tile.cuh):
// statistics of the first input (x, or dy backward) and/or of the output as StatsAs (the dtype of
// the tensor a folded FP8 cast replaces), one partial record per block.
template <typename Act, typename Input, typename Output, bool kWriteTranspose = false,
          int kStats = 0, typename StatsAs = float>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input),
                                                    detail::ActivationFwdOp<Act, Input>::kLoads,
                                                    kWriteTranspose, false, kStats != 0)))
    activation_fwd(ActivationFwdParams<Input, Output, StatsAs> params) {
  const TileOutputs<Output> outputs{
      params.y, params.y_t,  params.scale, params.amax,     params.scale_record,
      nullptr,  params.rows, params.cols,  params.in_stats, params.out_stats};
  run_elementwise_tiles<Output, kWriteTranspose, false, kStats, StatsAs>(
      outputs, detail::ActivationFwdOp<Act, Input>{params.x, params.cols});
}

template <typename Act, typename Input, typename Output, bool kWriteTranspose = false,
          int kStats = 0, typename StatsAs = float>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(
                           sizeof(Input), detail::GatedActivationFwdOp<Act, Input>::kLoads,
                           kWriteTranspose, false, kStats != 0)))
    gated_activation_fwd(ActivationFwdParams<Input, Output, StatsAs> params) {
  const TileOutputs<Output> outputs{
      params.y, params.y_t,  params.scale, params.amax,     params.scale_record,
      nullptr,  params.rows, params.cols,  params.in_stats, params.out_stats};
  run_elementwise_tiles<Output, kWriteTranspose, false, kStats, StatsAs>(
      outputs, detail::GatedActivationFwdOp<Act, Input>{params.x, params.cols});
}

template <typename Act, typename Input, typename Output, bool kWriteTranspose = false,
          bool kDbias = false, int kStats = 0, typename StatsAs = float>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input),
                                                    detail::ActivationBwdOp<Act, Input>::kLoads,
                                                    kWriteTranspose, kDbias, kStats != 0)))
    activation_bwd(ActivationBwdParams<Input, Output, StatsAs> params) {
  const TileOutputs<Output> outputs{params.dx,       params.dx_t,         params.scale,
                                    params.amax,     params.scale_record, params.dbias_partial,
                                    params.rows,     params.cols,         params.in_stats,
                                    params.out_stats};
  run_elementwise_tiles<Output, kWriteTranspose, kDbias, kStats, StatsAs>(
      outputs, detail::ActivationBwdOp<Act, Input>{params.dy, params.x, params.cols});
}

template <typename Act, typename Input, typename Output, bool kWriteTranspose = false,
          bool kDbias = false, int kStats = 0, typename StatsAs = float>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(
                           sizeof(Input), detail::GatedActivationBwdOp<Act, Input>::kLoads,
                           kWriteTranspose, kDbias, kStats != 0)))
    gated_activation_bwd(ActivationBwdParams<Input, Output, StatsAs> params) {
  const TileOutputs<Output> outputs{params.dx,       params.dx_t,         params.scale,
                                    params.amax,     params.scale_record, params.dbias_partial,
                                    params.rows,     params.cols,         params.in_stats,
                                    params.out_stats};
  run_elementwise_tiles<Output, kWriteTranspose, kDbias, kStats, StatsAs>(
      outputs, detail::GatedActivationBwdOp<Act, Input>{params.dy, params.x, params.cols});
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_ACTIVATION_CUH_
