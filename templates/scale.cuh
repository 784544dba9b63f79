// Multiplication by a constant (constant_scale, forward and backward) and fake quantization (the
// user `quantize` op: cast to FP8 and straight back), each one pass over memory on the tiled
// elementwise engine.
//
// Entry points: constant_scale<Input, Output, kWriteTranspose> and fake_quantize<Input, Fp8>.
// Launch rules, shapes and alignment: templates/README.md ("Tiled elementwise families").
#ifndef OPFUSE_TEMPLATES_SCALE_CUH_
#define OPFUSE_TEMPLATES_SCALE_CUH_

#include "common/elementwise_tile.cuh"

namespace opfuse {

template <typename Input, typename Output>
struct ConstantScaleParams {
  const Input* x;      // [rows, cols]
  Output* y;           // [rows, cols] = factor * x; nullptr: only y_t is written
  Output* y_t;         // [cols, rows] FP8 transposed copy (kWriteTranspose)
  const float* scale;  // FP8 output: y = fp8((factor * x) * *scale)
  float* amax;         // max |factor * x| before scaling; nullptr: not tracked
  float factor;        // the constant
  int rows;
  int cols;  // multiple of 16 / sizeof(Input)
};

template <typename Input, typename Fp8>
struct FakeQuantizeParams {
  const Input* x;          // [rows, cols]
  Input* y;                // [rows, cols] = float(fp8(x * *scale)) * *scale_inv, rounded to Input
  const float* scale;      // the quantizer's scale
  const float* scale_inv;  // the quantizer's scale_inv (1 / scale)
  float* amax;             // max |x|; nullptr: not tracked (current scaling measured it before)
  int rows;
  int cols;  // multiple of 16 / sizeof(Input)
};

namespace detail {

// value = factor * x, one fp32 rounding (the CPU reference's x * scale).
template <typename Input>
struct ConstantScaleOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 1;
  struct Loaded {
    Vec<Input, kVec> x;
  };
  const Input* x;
  float factor;
  int cols;

  __device__ __forceinline__ Loaded load(long long row, int col) const {
    return Loaded{load_vec<Input, kVec>(x + row * cols + col)};
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    vec_to_float(loaded.x, values[0]);
#pragma unroll
    for (int j = 0; j < kVec; ++j) values[0][j] = __fmul_rn(values[0][j], factor);
  }
};

// value = float(fp8(x * scale)) * scale_inv. The engine sees the dequantized values, but the
// quantizer's amax is max |x|: the op keeps it in the running max its caller passes (a register
// once everything is inlined) and the kernel publishes it after the tiles.
template <typename Input, typename Fp8>
struct FakeQuantizeOp {
  static constexpr int kVec = launch::vector_elems(sizeof(Input));
  static constexpr int kPlanes = 1;
  static constexpr int kLoads = 1;
  struct Loaded {
    Vec<Input, kVec> x;
  };
  const Input* x;
  float scale;
  float scale_inv;
  float* thread_amax;
  int cols;

  __device__ __forceinline__ Loaded load(long long row, int col) const {
    return Loaded{load_vec<Input, kVec>(x + row * cols + col)};
  }
  __device__ __forceinline__ void compute(const Loaded& loaded,
                                          float (&values)[kPlanes][kVec]) const {
    float in[kVec];
    vec_to_float(loaded.x, in);
    float amax = *thread_amax;
#pragma unroll
    for (int j = 0; j < kVec; ++j) amax = accumulate_amax(amax, in[j]);
    *thread_amax = amax;
    // The same conversion the FP8 outputs of every family use (apply_scale, RN, SATFINITE).
    const Vec<Fp8, kVec> codes = float_to_vec<Fp8, kVec>(in, scale);
#pragma unroll
    for (int j = 0; j < kVec; ++j) values[0][j] = __fmul_rn(to_float(codes.elems[j]), scale_inv);
  }
};

}  // namespace detail

// y = factor * x, cast to Output (FP8 with amax and an optional transposed copy, as bias_add).
// Block: launch::kTileThreads (256). Grid: (launch::tile_grid_x(cols), launch::tile_grid_y(rows))
// or any smaller gridDim.y >= 1 (row tiles are strided).
template <typename Input, typename Output, bool kWriteTranspose = false>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input),
                                                    detail::ConstantScaleOp<Input>::kLoads,
                                                    kWriteTranspose, false)))
    constant_scale(ConstantScaleParams<Input, Output> params) {
  const TileOutputs<Output> outputs{params.y, params.y_t, params.scale, params.amax,
                                    nullptr,  nullptr,    params.rows,  params.cols};
  run_elementwise_tiles<Output, kWriteTranspose, false>(
      outputs, detail::ConstantScaleOp<Input>{params.x, params.factor, params.cols});
}

// y = dequantize(fp8(x * scale)) in Input precision; amax = max |x| (TE's Quantize op followed by
// its dequantization). Same launch rules as constant_scale.
template <typename Input, typename Fp8>
__global__ void __launch_bounds__(
    launch::kTileThreads,
    launch::min_blocks(launch::kTileThreads,
                       launch::tile_register_budget(sizeof(Input),
                                                    detail::FakeQuantizeOp<Input, Fp8>::kLoads,
                                                    false, false)))
    fake_quantize(FakeQuantizeParams<Input, Fp8> params) {
  static_assert(DtypeTraits<Fp8>::kIsFp8, "fake_quantize casts through an FP8 type");
  static_assert(!DtypeTraits<Input>::kIsFp8, "fake_quantize reads and writes high precision");
  __shared__ float amax_scratch[launch::kTileThreads / 32];
  float thread_amax = 0.0f;
  // The engine tracks no amax (nullptr): its values are already dequantized.
  const TileOutputs<Input> outputs{params.y, nullptr, nullptr,     nullptr,
                                   nullptr,  nullptr, params.rows, params.cols};
  run_elementwise_tiles<Input, false, false>(
      outputs, detail::FakeQuantizeOp<Input, Fp8>{params.x, *params.scale, *params.scale_inv,
                                                  &thread_amax, params.cols});
  commit_block_amax<launch::kTileThreads>(thread_amax, params.amax, amax_scratch);
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_SCALE_CUH_
