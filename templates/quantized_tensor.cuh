// Decoding a quantized tensor (docs/embedding.md, "Quantized tensors"): one stored FP8 copy and its
// scale_inv, y = Output(fp8(code) * scale_inv of the code's block), the product in fp32 rounded
// once to Output. The CPU twin is cpu::dequantize_tensor (runtime/cpu/quantized_tensor.h), whose
// float result rounded to Output is this kernel's bit for bit. Launched by opfuse::dequantize
// (runtime/api/quantized_helpers.cpp), never by a plan.
//
// Entry point: dequantize<Fp8, Output, kBlocks>, kBlocks 0: one scale_inv for the tensor,
// 1: 1 x 128 blocks along the stored rows, 2: 128 x 128 blocks (the grids of note "Block scale
// grids" in runtime/cpu/block_quantization.h). Launch: launch::kDequantizeThreads threads, grid x
// = launch::dequantize_grid_x(rows * cols), a grid-stride loop; any rows, cols >= 0.
#ifndef OPFUSE_TEMPLATES_QUANTIZED_TENSOR_CUH_
#define OPFUSE_TEMPLATES_QUANTIZED_TENSOR_CUH_

#include "common/fp8.cuh"
#include "common/launch_rules.h"
#include "common/types.cuh"

namespace opfuse {

template <typename Fp8, typename Output>
struct DequantizeParams {
  const unsigned char* codes;  // the stored copy, [rows, cols] FP8 bits
  const float* scale_inv;      // one value, or the grid
  Output* y;                   // [rows, cols]
  long long rows;
  long long cols;
  long long grid_stride;  // the grid's inner extent (padding included); unused for kBlocks 0
};

template <typename Fp8, typename Output, int kBlocks>
__global__ void __launch_bounds__(launch::kDequantizeThreads)
    dequantize(DequantizeParams<Fp8, Output> p) {
  const long long n = p.rows * p.cols;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const long long r = i / p.cols, c = i % p.cols;
    float scale_inv;
    if constexpr (kBlocks == 0) {
      scale_inv = p.scale_inv[0];
    } else if constexpr (kBlocks == 1) {
      scale_inv = p.scale_inv[(c / launch::kBlockScaleLength) * p.grid_stride + r];
    } else {
      scale_inv = p.scale_inv[(r / launch::kBlockScaleLength) * p.grid_stride +
                              c / launch::kBlockScaleLength];
    }
    Fp8 code;
    code.__x = p.codes[i];
    p.y[i] = from_float<Output>(__fmul_rn(static_cast<float>(code), scale_inv));
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_QUANTIZED_TENSOR_CUH_
