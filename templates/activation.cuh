// Activations, plain and gated, forward and backward, with the output cast fused. The math is a
// functor template argument `Act`, generated per op from its scalar-expression definition
// (compiler/ir/pointwise_ops.h, prepended to each kernel's source by codegen):
//   static constexpr int kInputs;   // 1 (plain) or 2 (gated: gate, linear)
//   static float forward(const float (&in)[kInputs]);
//   static void backward(const float (&in)[kInputs], float dy, float (&grad)[kInputs]);
// Gated ops follow TE's convention: for an input [rows, 2n] the FIRST half is the gate, the
// second half the linear part, in[0] and in[1].
//
// A user-defined op with learned parameters (docs/language.md, "User-defined ops", params(...))
// has a functor that also declares them (ExampleLearnedScale below):
//   static constexpr int kParams;  // 1 to kMaxLearnedParams
//   static float param(const void* const (&learned)[kMaxLearnedParams], int k, int col);
//                                  // parameter k at output column col (a scalar's one element)
//   static float forward(const float (&in)[kInputs], const float (&p)[kParams]);
//   static void backward(const float (&in)[kInputs], const float (&p)[kParams], float dy,
//                        float (&grad)[kInputs], float (&dparam)[kParams]);
// The forward kernels read the parameters at each element's column; the backward kernels also sum
// dparam (one element's share of a parameter's gradient) per column over their rows, one fp32 row
// per row block into learned_partial[k] ([gridDim.y, cols], the output's columns), which
// reduce_column_partials (and, for a scalar, learned_scalar_sum) add up as for dbias.
//
// Entry points: activation_fwd, gated_activation_fwd, activation_bwd, gated_activation_bwd, each
// <Act, Input, Output, kWriteTranspose[, kDbias]>; activation_micro_fwd,
// gated_activation_micro_fwd, activation_micro_bwd, gated_activation_micro_bwd <Act, Input,
// kFormat, kWriteColumnwiseSource> (MXFP8's decoded row-wise copy); and learned_scalar_sum<Output>.
// ExampleIdentity, ExampleProduct and ExampleLearnedScale below are the contract's examples (so
// this header compiles and instantiates on its own).
// Launch rules, shapes and alignment: templates/README.md ("Tiled elementwise families").
#ifndef OPFUSE_TEMPLATES_ACTIVATION_CUH_
#define OPFUSE_TEMPLATES_ACTIVATION_CUH_

#include "common/column_partials.cuh"
#include "common/elementwise_tile.cuh"
#include "common/reduce.cuh"
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

// y = scale * x with a learned scalar scale (fp32): the learned contract's example.
struct ExampleLearnedScale {
  static constexpr int kInputs = 1;
  static constexpr int kParams = 1;
  __device__ __forceinline__ static float param(const void* const (&learned)[kMaxLearnedParams],
                                                int /*k*/, int /*col*/) {
    return static_cast<const float*>(learned[0])[0];
  }
  __device__ __forceinline__ static float forward(const float (&in)[1], const float (&p)[1]) {
    return p[0] * in[0];
  }
  __device__ __forceinline__ static void backward(const float (&in)[1], const float (&p)[1],
                                                  float dy, float (&grad)[1],
                                                  float (&dparam)[1]) {
    grad[0] = p[0] * dy;
    dparam[0] = in[0] * dy;
  }
};

namespace detail {

// Act::kParams, or 0 for a functor without learned parameters (the built-in activations).
template <typename Act, typename = void>
struct LearnedCount {
  static constexpr int value = 0;
};
template <typename Act>
struct LearnedCount<Act, decltype(void(Act::kParams))> {
  static constexpr int value = Act::kParams;
};

// The learned parameters' values at kVec consecutive columns (one unused row when there are none).
template <typename Act, int kVec>
struct LearnedValues {
  static constexpr int kCount = LearnedCount<Act>::value;
  float v[kCount > 0 ? kCount : 1][kVec];

  __device__ __forceinline__ void load(const void* const (&learned)[kMaxLearnedParams], int col) {
    if constexpr (kCount > 0) {
#pragma unroll
      for (int k = 0; k < kCount; ++k) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[k][j] = Act::param(learned, k, col + j);
      }
    }
  }
};

// Act's forward at element j of a vector, with its parameters where it has them.
template <typename Act, int kIn, int kVec>
__device__ __forceinline__ float learned_forward(const float (&in)[kIn],
                                                 const LearnedValues<Act, kVec>& p, int j) {
  if constexpr (LearnedValues<Act, kVec>::kCount == 0) {
    return Act::forward(in);
  } else {
    float pj[LearnedValues<Act, kVec>::kCount];
#pragma unroll
    for (int k = 0; k < LearnedValues<Act, kVec>::kCount; ++k) pj[k] = p.v[k][j];
    return Act::forward(in, pj);
  }
}

// Act's backward at element j; a learned parameter's share is added to sums[k][j] (the thread's
// running column sums: in a tiled kernel without the flat schedule a thread's columns are fixed).
template <typename Act, int kIn, int kVec>
__device__ __forceinline__ void learned_backward(const float (&in)[kIn],
                                                 const LearnedValues<Act, kVec>& p, float dy,
                                                 float (&grad)[kIn], LearnedValues<Act, kVec>& sums,
                                                 int j) {
  if constexpr (LearnedValues<Act, kVec>::kCount == 0) {
    Act::backward(in, dy, grad);
  } else {
    constexpr int kCount = LearnedValues<Act, kVec>::kCount;
    float pj[kCount], dparam[kCount];
#pragma unroll
    for (int k = 0; k < kCount; ++k) pj[k] = p.v[k][j];
    Act::backward(in, pj, dy, grad, dparam);
#pragma unroll
    for (int k = 0; k < kCount; ++k) sums.v[k][j] += dparam[k];
  }
}

// After run_elementwise_tiles (its row-walking schedule: blockIdx.x the column tile): the block's
// column sums of each learned parameter's shares into row blockIdx.y of learned_partial[k], added
// in a fixed order (lanes by shuffles, then the warps in order), as the engine's dbias sums.
template <typename Act, int kVec>
__device__ __forceinline__ void write_learned_partials(
    const LearnedValues<Act, kVec>& sums, float* const (&learned_partial)[kMaxLearnedParams],
    int cols) {
  constexpr int kCount = LearnedValues<Act, kVec>::kCount;
  if constexpr (kCount > 0) {
    constexpr int kThreads = launch::kTileThreads;
    constexpr int kWarps = kThreads / 32;
    constexpr int kTileCols = launch::kTileCols;
    constexpr int kVecsPerTileRow = kTileCols / kVec;
    __shared__ float scratch[kWarps][kTileCols];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int tile_col0 = blockIdx.x * kTileCols;
#pragma unroll
    for (int k = 0; k < kCount; ++k) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float v = sums.v[k][j];
#pragma unroll
        for (int mask = kVecsPerTileRow; mask < 32; mask <<= 1) {
          v += __shfl_xor_sync(kFullWarpMask, v, mask);
        }
        if (lane < kVecsPerTileRow) scratch[warp][lane * kVec + j] = v;
      }
      __syncthreads();
      for (int c = threadIdx.x; c < kTileCols; c += kThreads) {
        float sum = scratch[0][c];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) sum += scratch[w][c];
        if (tile_col0 + c < cols) {
          learned_partial[k][static_cast<long long>(blockIdx.y) * cols + tile_col0 + c] = sum;
        }
      }
      __syncthreads();  // scratch is reused by the next parameter
    }
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Params. cols is always the width n of one output plane (for gated ops the input is [rows, 2n]).
// ---------------------------------------------------------------------------------------------
// The MXFP8 forward's params (activation_micro_fwd, gated_activation_micro_fwd).
template <typename Input>
struct ActivationMicroFwdParams {
  const Input* x;  // plain: [rows, cols]; gated: [rows, 2 * cols] (gate | linear)
  Input* y;        // [rows, cols] the 1 x 32 MXFP8 row-wise copy, decoded; nullptr: not written
  Input* y_hp;     // [rows, cols] the output itself (kWriteColumnwiseSource)
  int rows;
  int cols;  // multiple of 32
  const void* learned[kMaxLearnedParams];  // Act's learned parameters (Act::param reads them)
};

// The MXFP8 backward's params (activation_micro_bwd, gated_activation_micro_bwd).
template <typename Input>
struct ActivationMicroBwdParams {
  const Input* dy;  // [rows, cols]
  const Input* x;   // saved forward input: plain [rows, cols]; gated [rows, 2 * cols]
  Input* dx;        // plain [rows, cols]; gated [rows, 2 * cols]: the MXFP8 row-wise copy, decoded
  Input* dx_hp;     // the gradient itself, same shape (kWriteColumnwiseSource)
  int rows;
  int cols;  // multiple of 32
  const void* learned[kMaxLearnedParams];  // unused: Act has no learned parameters
};

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
  const void* learned[kMaxLearnedParams];  // Act's learned parameters (Act::param reads them)
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
  const void* learned[kMaxLearnedParams];  // Act's learned parameters (Act::param reads them)
  // Per learned parameter: [gridDim.y, cols] fp32 column sums of its shares (dparam)
  float* learned_partial[kMaxLearnedParams];
};

// The sum of `count` fp32 values (a scalar learned parameter's column sums) into out[0], added in a
// fixed order: each thread a strided run, then the block's tree. Grid: 1 block of 256 threads.
template <typename Output>
struct LearnedScalarSumParams {
  const float* values;  // [count]
  Output* out;          // [1]
  int count;
};

namespace detail {

template <typename Act, typename Input>
struct ActivationFwdOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 1;  // input vectors per element
  struct Loaded {
    Vec<Input, kVec> x;
    LearnedValues<Act, kVec> p;  // set by load(); the block kernels take no learned parameters
  };
  const Input* x;
  int cols;
  const void* learned[kMaxLearnedParams];

  // Where input vector `load` of element (row, col) is; Loaded from the vectors in that order.
  __device__ __forceinline__ const Input* source(int /*load*/, long long row, int col) const {
    return x + row * cols + col;
  }
  static __device__ __forceinline__ Loaded from_vectors(const Vec<Input, kVec> (&v)[kLoads]) {
    Loaded out;
    out.x = v[0];
    return out;
  }
  __device__ __forceinline__ Loaded load(long long row, int col) const {
    Loaded out = from_vectors({load_vec<Input, kVec>(source(0, row, col))});
    out.p.load(learned, col);
    return out;
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
      values[0][j] = learned_forward<Act>(args, loaded.p, j);
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
    LearnedValues<Act, kVec> p;  // set by load(); the block kernels take no learned parameters
  };
  const Input* x;
  int cols;
  const void* learned[kMaxLearnedParams];

  // gate (0) and linear (1) of element (row, col).
  __device__ __forceinline__ const Input* source(int load, long long row, int col) const {
    return x + row * (2LL * cols) + col + (load == 1 ? cols : 0);
  }
  static __device__ __forceinline__ Loaded from_vectors(const Vec<Input, kVec> (&v)[kLoads]) {
    Loaded out;
    out.gate = v[0];
    out.linear = v[1];
    return out;
  }
  __device__ __forceinline__ Loaded load(long long row, int col) const {
    Loaded out = from_vectors(
        {load_vec<Input, kVec>(source(0, row, col)), load_vec<Input, kVec>(source(1, row, col))});
    out.p.load(learned, col);
    return out;
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
      values[0][j] = learned_forward<Act>(args, loaded.p, j);
    }
  }
};

template <typename Act, typename Input>
struct ActivationBwdOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 2;  // input vectors per element
  // The learned parameters' column sums need a thread's columns fixed (no flat schedule).
  static constexpr bool kSumsColumns = LearnedCount<Act>::value > 0;
  struct Loaded {
    Vec<Input, kVec> dy;
    Vec<Input, kVec> x;
    LearnedValues<Act, kVec> p;  // set by load(); the block kernels take no learned parameters
  };
  const Input* dy;
  const Input* x;
  int cols;
  const void* learned[kMaxLearnedParams];
  mutable LearnedValues<Act, kVec> sums;  // this thread's column sums of the parameters' shares

  // dy (0) and x (1) of element (row, col).
  __device__ __forceinline__ const Input* source(int load, long long row, int col) const {
    return (load == 0 ? dy : x) + row * cols + col;
  }
  static __device__ __forceinline__ Loaded from_vectors(const Vec<Input, kVec> (&v)[kLoads]) {
    Loaded out;
    out.dy = v[0];
    out.x = v[1];
    return out;
  }
  __device__ __forceinline__ Loaded load(long long row, int col) const {
    Loaded out = from_vectors(
        {load_vec<Input, kVec>(source(0, row, col)), load_vec<Input, kVec>(source(1, row, col))});
    out.p.load(learned, col);
    return out;
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
      learned_backward<Act>(args, loaded.p, grad[j], dx, sums, j);
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
  static constexpr bool kSumsColumns = LearnedCount<Act>::value > 0;  // as ActivationBwdOp's
  struct Loaded {
    Vec<Input, kVec> dy;
    Vec<Input, kVec> gate;
    Vec<Input, kVec> linear;
    LearnedValues<Act, kVec> p;  // set by load(); the block kernels take no learned parameters
  };
  const Input* dy;
  const Input* x;
  int cols;
  const void* learned[kMaxLearnedParams];
  mutable LearnedValues<Act, kVec> sums;  // this thread's column sums of the parameters' shares

  // dy (0), gate (1) and linear (2) of element (row, col).
  __device__ __forceinline__ const Input* source(int load, long long row, int col) const {
    return load == 0 ? dy + row * cols + col
                     : x + row * (2LL * cols) + col + (load == 2 ? cols : 0);
  }
  static __device__ __forceinline__ Loaded from_vectors(const Vec<Input, kVec> (&v)[kLoads]) {
    Loaded out;
    out.dy = v[0];
    out.gate = v[1];
    out.linear = v[2];
    return out;
  }
  __device__ __forceinline__ Loaded load(long long row, int col) const {
    Loaded out = from_vectors({load_vec<Input, kVec>(source(0, row, col)),
                               load_vec<Input, kVec>(source(1, row, col)),
                               load_vec<Input, kVec>(source(2, row, col))});
    out.p.load(learned, col);
    return out;
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
      learned_backward<Act>(args, loaded.p, grad[j], d, sums, j);
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
  detail::ActivationFwdOp<Act, Input> op{params.x, params.cols, {}};
#pragma unroll
  for (int k = 0; k < kMaxLearnedParams; ++k) op.learned[k] = params.learned[k];
  run_elementwise_tiles<Output, kWriteTranspose, false, kStats, StatsAs>(outputs, op);
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
  detail::GatedActivationFwdOp<Act, Input> op{params.x, params.cols, {}};
#pragma unroll
  for (int k = 0; k < kMaxLearnedParams; ++k) op.learned[k] = params.learned[k];
  run_elementwise_tiles<Output, kWriteTranspose, false, kStats, StatsAs>(outputs, op);
}

namespace detail {
// The MXFP8 kernels' outputs: the decoded row-wise copy, and with kWriteSource the output itself.
template <bool kWriteSource, typename Input>
__device__ __forceinline__ TileOutputs<Input> micro_outputs(Input* decoded, Input* source, int rows,
                                                            int cols) {
  TileOutputs<Input> outputs{kWriteSource ? source : nullptr, nullptr, nullptr, nullptr, nullptr,
                             nullptr,                         rows,    cols};
  outputs.out_micro = decoded;
  return outputs;
}
}  // namespace detail

// Forward under mxfp8_block_scaling (emulated on Hopper): the output's 1 x 32 row-wise MXFP8 copy
// decoded to Input, the bytes micro_scale_cast<Input, Input, kFormat> writes from the output
// (and, with kWriteColumnwiseSource, the output, which the column-wise cast reads). kFormat:
// launch::kMicroScaleE4M3 or kMicroScaleE5M2. Block and grid as activation_fwd's; cols a multiple
// of 32.
template <typename Act, typename Input, int kFormat, bool kWriteColumnwiseSource = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input),
                                                    detail::ActivationFwdOp<Act, Input>::kLoads,
                                                    false, false, false)))
    activation_micro_fwd(ActivationMicroFwdParams<Input> params) {
  const TileOutputs<Input> outputs = detail::micro_outputs<kWriteColumnwiseSource>(
      params.y, params.y_hp, params.rows, params.cols);
  detail::ActivationFwdOp<Act, Input> op{params.x, params.cols, {}};
#pragma unroll
  for (int k = 0; k < kMaxLearnedParams; ++k) op.learned[k] = params.learned[k];
  run_elementwise_tiles<Input, false, false, 0, float, kFormat>(outputs, op);
}

template <typename Act, typename Input, int kFormat, bool kWriteColumnwiseSource = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(
                           sizeof(Input), detail::GatedActivationFwdOp<Act, Input>::kLoads, false,
                           false, false)))
    gated_activation_micro_fwd(ActivationMicroFwdParams<Input> params) {
  const TileOutputs<Input> outputs = detail::micro_outputs<kWriteColumnwiseSource>(
      params.y, params.y_hp, params.rows, params.cols);
  detail::GatedActivationFwdOp<Act, Input> op{params.x, params.cols, {}};
#pragma unroll
  for (int k = 0; k < kMaxLearnedParams; ++k) op.learned[k] = params.learned[k];
  run_elementwise_tiles<Input, false, false, 0, float, kFormat>(outputs, op);
}

// Backward under mxfp8_block_scaling (emulated on Hopper): the gradient's 1 x 32 row-wise MXFP8
// copy decoded to Input (gated: both planes, cols a multiple of 32 so no block straddles them),
// the bytes micro_scale_cast<Input, Input, kFormat> writes from the unfused gradient (and, with
// kWriteColumnwiseSource, the gradient). Act has no learned parameters (their column sums are
// activation_bwd's). Block and grid as activation_bwd's without kDbias.
template <typename Act, typename Input, int kFormat, bool kWriteColumnwiseSource = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input),
                                                    detail::ActivationBwdOp<Act, Input>::kLoads,
                                                    false, false, false)))
    activation_micro_bwd(ActivationMicroBwdParams<Input> params) {
  static_assert(detail::LearnedCount<Act>::value == 0, "learned parameters: activation_bwd");
  const TileOutputs<Input> outputs = detail::micro_outputs<kWriteColumnwiseSource>(
      params.dx, params.dx_hp, params.rows, params.cols);
  detail::ActivationBwdOp<Act, Input> op{params.dy, params.x, params.cols, {}, {}};
  run_elementwise_tiles<Input, false, false, 0, float, kFormat>(outputs, op);
}

template <typename Act, typename Input, int kFormat, bool kWriteColumnwiseSource = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(
                           sizeof(Input), detail::GatedActivationBwdOp<Act, Input>::kLoads, false,
                           false, false)))
    gated_activation_micro_bwd(ActivationMicroBwdParams<Input> params) {
  static_assert(detail::LearnedCount<Act>::value == 0, "learned parameters: activation_bwd");
  const TileOutputs<Input> outputs = detail::micro_outputs<kWriteColumnwiseSource>(
      params.dx, params.dx_hp, params.rows, params.cols);
  detail::GatedActivationBwdOp<Act, Input> op{params.dy, params.x, params.cols, {}, {}};
  run_elementwise_tiles<Input, false, false, 0, float, kFormat>(outputs, op);
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
  detail::ActivationBwdOp<Act, Input> op{params.dy, params.x, params.cols, {}, {}};
#pragma unroll
  for (int k = 0; k < kMaxLearnedParams; ++k) op.learned[k] = params.learned[k];
  run_elementwise_tiles<Output, kWriteTranspose, kDbias, kStats, StatsAs>(outputs, op);
  detail::write_learned_partials(op.sums, params.learned_partial, params.cols);
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
  detail::GatedActivationBwdOp<Act, Input> op{params.dy, params.x, params.cols, {}, {}};
#pragma unroll
  for (int k = 0; k < kMaxLearnedParams; ++k) op.learned[k] = params.learned[k];
  run_elementwise_tiles<Output, kWriteTranspose, kDbias, kStats, StatsAs>(outputs, op);
  detail::write_learned_partials(op.sums, params.learned_partial, params.cols);
}

template <typename Output>
__global__ void __launch_bounds__(launch::kTileThreads)
    learned_scalar_sum(LearnedScalarSumParams<Output> params) {
  constexpr int kThreads = launch::kTileThreads;
  __shared__ float partial[kThreads];
  float sum = 0.0f;
  for (int i = threadIdx.x; i < params.count; i += kThreads) sum += params.values[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
#pragma unroll
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) params.out[0] = from_float<Output>(partial[0]);
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_ACTIVATION_CUH_
