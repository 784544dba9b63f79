// Activations, plain and gated, forward and backward, with the output cast fused: gelu (tanh
// approximation), qgelu, relu, silu, and the gated swiglu/geglu/reglu/qgeglu (TE convention: for an
// input [rows, 2n] the FIRST half is the gate that goes through the activation, the second half is
// the linear part: out = act(x[:, :n]) * x[:, n:]).
//
// Entry points: activation_fwd, gated_activation_fwd, activation_bwd, gated_activation_bwd, each
// <Act, Input, Output, kWriteTranspose[, kDbias]> with Act one of Gelu, QGelu, Relu, Silu.
// Launch rules, shapes and alignment: templates/README.md ("Tiled elementwise families").
#ifndef OPFUSE_TEMPLATES_ACTIVATION_CUH_
#define OPFUSE_TEMPLATES_ACTIVATION_CUH_

#include "common/column_partials.cuh"
#include "common/elementwise_tile.cuh"

namespace opfuse {

// ---------------------------------------------------------------------------------------------
// Activation functions: value(x) and both value and derivative from one exponential.
// sigmoid(z) = __fdividef(1, 1 + __expf(-z)): the hardware ex2/rcp approximations (relative error
// ~1e-7, far below bf16/FP8 resolution). With IEEE expf and division the activation kernels were
// compute-bound (SwiGLU forward 2.6 TB/s vs 3.8 TB/s on H200, measured).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }

// GELU, tanh approximation (TE's gelu): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// computed as x * sigmoid(2u) (the same function: 0.5 (1 + tanh(u)) = sigmoid(2u)).
// d/dx = s + 2 x s (1 - s) (sqrt(2/pi) + 3 * 0.044715 * sqrt(2/pi) x^2), s = sigmoid(2u).
struct Gelu {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f;
  static constexpr float kCubicCoefficient = 0.044715f;
  __device__ __forceinline__ static float value(float x) {
    const float u = kSqrt2OverPi * x * (1.0f + kCubicCoefficient * x * x);
    return x * sigmoid(2.0f * u);
  }
  __device__ __forceinline__ static void value_and_derivative(float x, float& value,
                                                              float& derivative) {
    const float x2 = x * x;
    const float u = kSqrt2OverPi * x * (1.0f + kCubicCoefficient * x2);
    const float s = sigmoid(2.0f * u);
    value = x * s;
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubicCoefficient * x2);
    derivative = s + 2.0f * x * s * (1.0f - s) * du;
  }
};

// Quick GELU: x * sigmoid(1.702 x); d/dx = s + 1.702 x s (1 - s).
struct QGelu {
  static constexpr float kAlpha = 1.702f;
  __device__ __forceinline__ static float value(float x) { return x * sigmoid(kAlpha * x); }
  __device__ __forceinline__ static void value_and_derivative(float x, float& value,
                                                              float& derivative) {
    const float s = sigmoid(kAlpha * x);
    value = x * s;
    derivative = s + kAlpha * x * s * (1.0f - s);
  }
};

// ReLU: x > 0 ? x : 0 (NaN -> 0, as TE); d/dx = x > 0 ? 1 : 0.
struct Relu {
  __device__ __forceinline__ static float value(float x) { return x > 0.0f ? x : 0.0f; }
  __device__ __forceinline__ static void value_and_derivative(float x, float& value,
                                                              float& derivative) {
    value = x > 0.0f ? x : 0.0f;
    derivative = x > 0.0f ? 1.0f : 0.0f;
  }
};

// SiLU (swish): x * sigmoid(x); d/dx = s + x s (1 - s).
struct Silu {
  __device__ __forceinline__ static float value(float x) { return x * sigmoid(x); }
  __device__ __forceinline__ static void value_and_derivative(float x, float& value,
                                                              float& derivative) {
    const float s = sigmoid(x);
    value = x * s;
    derivative = s + x * s * (1.0f - s);
  }
};

// ---------------------------------------------------------------------------------------------
// Params. cols is always the width n of one output plane (for gated ops the input is [rows, 2n]).
// ---------------------------------------------------------------------------------------------
template <typename Input, typename Output>
struct ActivationFwdParams {
  const Input* x;      // plain: [rows, cols]; gated: [rows, 2 * cols] (gate | linear)
  Output* y;           // [rows, cols]; nullptr: only the transposed copy is written
  Output* y_t;         // [cols, rows] FP8 transposed copy (kWriteTranspose)
  const float* scale;  // FP8 output: y = fp8(value * *scale)
  float* amax;         // max |value| (before scaling; as stored if not FP8); nullptr: not tracked
  const QuantizerRecord* scale_record;  // current scaling measured here (derive_current_scale)
  int rows;
  int cols;  // multiple of 16 / sizeof(Input)
};

template <typename Input, typename Output>
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
  int cols;  // multiple of 16 / sizeof(Input)
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

  __device__ __forceinline__ Loaded load(long long row, int col) const {
    return Loaded{load_vec<Input, kVec>(x + row * cols + col)};
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    float in[kVec];
    vec_to_float(loaded.x, in);
#pragma unroll
    for (int j = 0; j < kVec; ++j) values[0][j] = Act::value(in[j]);
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

  __device__ __forceinline__ Loaded load(long long row, int col) const {
    const Input* gate = x + row * (2LL * cols) + col;
    return Loaded{load_vec<Input, kVec>(gate), load_vec<Input, kVec>(gate + cols)};
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    float gate[kVec], linear[kVec];
    vec_to_float(loaded.gate, gate);
    vec_to_float(loaded.linear, linear);
#pragma unroll
    for (int j = 0; j < kVec; ++j) values[0][j] = Act::value(gate[j]) * linear[j];
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

  __device__ __forceinline__ Loaded load(long long row, int col) const {
    const long long offset = row * cols + col;
    return Loaded{load_vec<Input, kVec>(dy + offset), load_vec<Input, kVec>(x + offset)};
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    float grad[kVec], in[kVec];
    vec_to_float(loaded.dy, grad);
    vec_to_float(loaded.x, in);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float value, derivative;
      Act::value_and_derivative(in[j], value, derivative);
      values[0][j] = grad[j] * derivative;
    }
  }
};

// d gate = dy * linear * act'(gate) (plane 0), d linear = dy * act(gate) (plane 1).
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

  __device__ __forceinline__ Loaded load(long long row, int col) const {
    const Input* gate = x + row * (2LL * cols) + col;
    return Loaded{load_vec<Input, kVec>(dy + row * cols + col), load_vec<Input, kVec>(gate),
                  load_vec<Input, kVec>(gate + cols)};
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    float grad[kVec], gate[kVec], linear[kVec];
    vec_to_float(loaded.dy, grad);
    vec_to_float(loaded.gate, gate);
    vec_to_float(loaded.linear, linear);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float value, derivative;
      Act::value_and_derivative(gate[j], value, derivative);
      values[0][j] = grad[j] * linear[j] * derivative;
      values[1][j] = grad[j] * value;
    }
  }
};

}  // namespace detail

// Block: launch::kTileThreads (256). Grid: (launch::tile_grid_x(cols), launch::tile_grid_y(rows))
// or any smaller gridDim.y >= 1 (row tiles are strided).
template <typename Act, typename Input, typename Output, bool kWriteTranspose = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input),
                                                    detail::ActivationFwdOp<Act, Input>::kLoads,
                                                    kWriteTranspose, false)))
    activation_fwd(ActivationFwdParams<Input, Output> params) {
  const TileOutputs<Output> outputs{params.y,    params.y_t,          params.scale,
                                    params.amax, params.scale_record, nullptr,
                                    params.rows, params.cols};
  run_elementwise_tiles<Output, kWriteTranspose, false>(
      outputs, detail::ActivationFwdOp<Act, Input>{params.x, params.cols});
}

template <typename Act, typename Input, typename Output, bool kWriteTranspose = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(
                           sizeof(Input), detail::GatedActivationFwdOp<Act, Input>::kLoads,
                           kWriteTranspose, false)))
    gated_activation_fwd(ActivationFwdParams<Input, Output> params) {
  const TileOutputs<Output> outputs{params.y,    params.y_t,          params.scale,
                                    params.amax, params.scale_record, nullptr,
                                    params.rows, params.cols};
  run_elementwise_tiles<Output, kWriteTranspose, false>(
      outputs, detail::GatedActivationFwdOp<Act, Input>{params.x, params.cols});
}

template <typename Act, typename Input, typename Output, bool kWriteTranspose = false,
          bool kDbias = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input),
                                                    detail::ActivationBwdOp<Act, Input>::kLoads,
                                                    kWriteTranspose, kDbias)))
    activation_bwd(ActivationBwdParams<Input, Output> params) {
  const TileOutputs<Output> outputs{params.dx,   params.dx_t,         params.scale,
                                    params.amax, params.scale_record, params.dbias_partial,
                                    params.rows, params.cols};
  run_elementwise_tiles<Output, kWriteTranspose, kDbias>(
      outputs, detail::ActivationBwdOp<Act, Input>{params.dy, params.x, params.cols});
}

template <typename Act, typename Input, typename Output, bool kWriteTranspose = false,
          bool kDbias = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(
                           sizeof(Input), detail::GatedActivationBwdOp<Act, Input>::kLoads,
                           kWriteTranspose, kDbias)))
    gated_activation_bwd(ActivationBwdParams<Input, Output> params) {
  const TileOutputs<Output> outputs{params.dx,   params.dx_t,         params.scale,
                                    params.amax, params.scale_record, params.dbias_partial,
                                    params.rows, params.cols};
  run_elementwise_tiles<Output, kWriteTranspose, kDbias>(
      outputs, detail::GatedActivationBwdOp<Act, Input>{params.dy, params.x, params.cols});
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_ACTIVATION_CUH_
