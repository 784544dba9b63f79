// Norm-like user-defined ops (docs/language.md, "User-defined ops": sum_last, mean_last,
// max_last): the forward and backward row programs of compiler/ir/row_expr.h, one block per row
// (grid-stride over the rows), fp32 throughout.
//
// Entry points: row_expr_fwd<Fn, Input, Output> and row_expr_bwd<Fn, Input, Output>. Fn is the
// functor ir::row_functor_source generates per op (its contract below); a stage k reduces
// Fn::*_stage(k, ...) over the row's elements (a block reduction in a fixed order: deterministic
// run to run) into the row scalar s[k], which later stages and the outputs read. The backward
// recomputes the forward's reductions (nothing is saved), counts the ties of each max, sums the
// reductions' adjoints, then writes dx and adds each learned parameter's shares into this
// block's row of learned_partial[k] ([gridDim.x, cols]), which reduce_column_partials (and, for a
// scalar parameter, learned_scalar_sum) add up as for a norm's dgamma.
//
// Fn's contract (one example, ExampleRowL2, below):
//   static constexpr int kParams, kParamSlots (kParams, at least 1), kForwardStages,
//                        kBackwardStages;
//   static int forward_kind(int k), backward_kind(int k);  // kRowSum / kRowMean / kRowMax
//   static float param(const void* const (&learned)[kMaxLearnedParams], int k, int col);
//   static float forward_stage(int k, float x, const float (&p)[kParamSlots], float n,
//                              const float* s);
//   static float forward_value(float x, const float (&p)[kParamSlots], float n, const float* s);
//   static float backward_stage(int k, float x, float dy, const float (&p)[kParamSlots],
//                               float n, const float* s);
//   static void backward_outputs(float x, float dy, const float (&p)[kParamSlots], float n,
//                                const float* s, float& dx, float (&dparam)[kParamSlots]);
// Launch: launch::kRowExprThreads threads, any grid (the rows are strided over it; the backward's
// learned_partial has gridDim.x rows). Any cols >= 1: elements are read one at a time.
#ifndef OPFUSE_TEMPLATES_ROW_EXPR_CUH_
#define OPFUSE_TEMPLATES_ROW_EXPR_CUH_

#include "common/launch_rules.h"
#include "common/reduce.cuh"
#include "common/scalar_math.cuh"
#include "common/types.cuh"

namespace opfuse {

enum : int { kRowSum = 0, kRowMean = 1, kRowMax = 2 };

template <typename Input, typename Output>
struct RowExprFwdParams {
  const Input* x;                          // [rows, cols]
  Output* y;                               // [rows, cols]
  const void* learned[kMaxLearnedParams];  // Fn's learned parameters (Fn::param reads them)
  int rows;
  int cols;
};

template <typename Input, typename Output>
struct RowExprBwdParams {
  const Input* dy;                         // [rows, cols]
  const Input* x;                          // [rows, cols] the forward's input
  Output* dx;                              // [rows, cols]
  const void* learned[kMaxLearnedParams];  // Fn's learned parameters (Fn::param reads them)
  // Per learned parameter: [gridDim.x, cols] fp32, this block's column sums of its shares.
  float* learned_partial[kMaxLearnedParams];
  int rows;
  int cols;
};

// y = x * rsqrt(sum_last(x * x) + 1e-6) with no parameters: the contract's example (the
// standard library's l2_normalization).
struct ExampleRowL2 {
  static constexpr int kParams = 0;
  static constexpr int kParamSlots = 1;
  static constexpr int kForwardStages = 1;
  static constexpr int kBackwardStages = 2;
  __device__ __forceinline__ static int forward_kind(int) { return kRowSum; }
  __device__ __forceinline__ static int backward_kind(int) { return kRowSum; }
  __device__ __forceinline__ static float param(const void* const (&)[kMaxLearnedParams], int,
                                                int) {
    return 0.0f;
  }
  __device__ __forceinline__ static float forward_stage(int, float x, const float (&)[1], float,
                                                        const float*) {
    return x * x;
  }
  __device__ __forceinline__ static float forward_value(float x, const float (&)[1], float,
                                                        const float* s) {
    return x * rsqrtf(s[0] + 1e-6f);
  }
  // s[1], the adjoint of s[0]: sum of dy * x * d(rsqrt(s0 + eps)) / d s0.
  __device__ __forceinline__ static float backward_stage(int k, float x, float dy,
                                                         const float (&)[1], float,
                                                         const float* s) {
    if (k == 0) return x * x;
    const float r = rsqrtf(s[0] + 1e-6f);
    return dy * x * (-0.5f * r * r * r);
  }
  __device__ __forceinline__ static void backward_outputs(float x, float dy, const float (&)[1],
                                                          float, const float* s, float& dx,
                                                          float (&)[1]) {
    dx = dy * rsqrtf(s[0] + 1e-6f) + s[1] * 2.0f * x;
  }
};

namespace detail {

// max that propagates NaN (the CPU reference's rule; fmaxf would drop it).
__device__ __forceinline__ float row_max(float a, float b) { return (a > b || a != a) ? a : b; }

struct RowMaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return row_max(a, b); }
};

// The block's reduction of one value per thread, every thread receiving it: warps by butterfly,
// then the warps' values in warp order (a fixed order).
__device__ __forceinline__ float row_block_reduce(float value, int kind, float* scratch) {
  value = kind == kRowMax ? warp_allreduce(value, RowMaxOp{}) : warp_allreduce(value, SumOp{});
  const int warps = static_cast<int>(blockDim.x >> 5);
  __syncthreads();  // every thread has read the previous reduction's scratch
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = value;
  __syncthreads();
  float out = scratch[0];
  for (int w = 1; w < warps; ++w)
    out = kind == kRowMax ? row_max(out, scratch[w]) : out + scratch[w];
  return out;
}

template <typename Fn>
__device__ __forceinline__ void load_params(const void* const (&learned)[kMaxLearnedParams],
                                            int col, float (&p)[Fn::kParamSlots]) {
#pragma unroll
  for (int k = 0; k < Fn::kParamSlots; ++k)
    p[k] = k < Fn::kParams ? Fn::param(learned, k, col) : 0.0f;
}

__device__ __forceinline__ float row_identity(int kind) {
  return kind == kRowMax ? -__int_as_float(0x7f800000) : 0.0f;  // -inf for a max
}

}  // namespace detail

template <typename Fn, typename Input, typename Output>
__global__ void __launch_bounds__(launch::kRowExprThreads)
    row_expr_fwd(const RowExprFwdParams<Input, Output> params) {
  __shared__ float scratch[launch::kRowExprThreads / 32];
  const int cols = params.cols;
  const float n = static_cast<float>(cols);
  float s[Fn::kForwardStages];
  for (long long row = blockIdx.x; row < params.rows; row += gridDim.x) {
    const Input* x = params.x + row * cols;
#pragma unroll
    for (int k = 0; k < Fn::kForwardStages; ++k) {
      const int kind = Fn::forward_kind(k);
      float acc = detail::row_identity(kind);
      for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float p[Fn::kParamSlots];
        detail::load_params<Fn>(params.learned, c, p);
        const float e = Fn::forward_stage(k, to_float(x[c]), p, n, s);
        acc = kind == kRowMax ? detail::row_max(acc, e) : acc + e;
      }
      const float r = detail::row_block_reduce(acc, kind, scratch);
      s[k] = kind == kRowMean ? r / n : r;
    }
    Output* y = params.y + row * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      float p[Fn::kParamSlots];
      detail::load_params<Fn>(params.learned, c, p);
      y[c] = from_float<Output>(Fn::forward_value(to_float(x[c]), p, n, s));
    }
  }
}

template <typename Fn, typename Input, typename Output>
__global__ void __launch_bounds__(launch::kRowExprThreads)
    row_expr_bwd(const RowExprBwdParams<Input, Output> params) {
  __shared__ float scratch[launch::kRowExprThreads / 32];
  const int cols = params.cols;
  const float n = static_cast<float>(cols);
  // This block's partial row: a thread owns its columns' entries, so it adds to them row after
  // row without atomics.
  const long long partial_row = static_cast<long long>(blockIdx.x) * cols;
#pragma unroll
  for (int k = 0; k < Fn::kParams; ++k)
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
      params.learned_partial[k][partial_row + c] = 0.0f;
  float s[Fn::kBackwardStages];
  for (long long row = blockIdx.x; row < params.rows; row += gridDim.x) {
    const Input* x = params.x + row * cols;
    const Input* dy = params.dy + row * cols;
#pragma unroll
    for (int k = 0; k < Fn::kBackwardStages; ++k) {
      const int kind = Fn::backward_kind(k);
      float acc = detail::row_identity(kind);
      for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float p[Fn::kParamSlots];
        detail::load_params<Fn>(params.learned, c, p);
        const float e = Fn::backward_stage(k, to_float(x[c]), to_float(dy[c]), p, n, s);
        acc = kind == kRowMax ? detail::row_max(acc, e) : acc + e;
      }
      const float r = detail::row_block_reduce(acc, kind, scratch);
      s[k] = kind == kRowMean ? r / n : r;
    }
    Output* dx = params.dx + row * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      float p[Fn::kParamSlots];
      detail::load_params<Fn>(params.learned, c, p);
      float g = 0.0f;
      float dparam[Fn::kParamSlots];
      Fn::backward_outputs(to_float(x[c]), to_float(dy[c]), p, n, s, g, dparam);
      dx[c] = from_float<Output>(g);
#pragma unroll
      for (int k = 0; k < Fn::kParams; ++k) params.learned_partial[k][partial_row + c] += dparam[k];
    }
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_ROW_EXPR_CUH_
