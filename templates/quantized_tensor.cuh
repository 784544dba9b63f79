// Decoding a quantized tensor (docs/embedding.md, "Quantized tensors"). The CPU twin is
// cpu::dequantize_tensor (runtime/cpu/quantized_tensor.h), whose float result rounded to Output
// is these kernels' bit for bit.
//
// dequantize<Fp8, Output, kBlocks>: one stored FP8 copy and its scale_inv, y = Output(fp8(code) *
// scale_inv of the code's block), the product in fp32 rounded once to Output. kBlocks 0: one
// scale_inv for the tensor, 1: 1 x 128 blocks along the stored rows, 2: 128 x 128 blocks (the
// grids of note "Block scale grids" in runtime/cpu/block_quantization.h). Launched by
// opfuse::dequantize (runtime/api/quantized_helpers.cpp), never by a plan.
//
// micro_dequantize<Output, kFormat, kColumnwise>: one MXFP8 (kFormat launch::kMicroScaleE4M3 /
// E5M2) or NVFP4 (kMicroScaleE2M1) copy with its compact block scales (runtime/cpu/
// micro_scaling.h's layouts), decoded in x's orientation [rows, cols]: MXFP8 fp8(code) *
// 2^(e - 127) (NaN for e = 0xFF), NVFP4 (e2m1(code) * s_b) * (1 / S_enc), each product rounded
// once (micro_decode). kColumnwise: MXFP8's 32 x 1 blocks; NVFP4's copy stored transposed [cols,
// rows] (its Hadamard transform, if any, stays). The consumer of an MXFP8 / NVFP4 quantized
// input decodes its copies with it for Hopper's GEMMs (note "Quantized boundaries" in
// docs/architecture.md), and opfuse::dequantize the API's.
//
// Launch (both): launch::kDequantizeThreads threads, grid x = launch::dequantize_grid_x(rows *
// cols), a grid-stride loop; any rows, cols >= 0 (micro: the blocked extent a multiple of the
// block).
#ifndef OPFUSE_TEMPLATES_QUANTIZED_TENSOR_CUH_
#define OPFUSE_TEMPLATES_QUANTIZED_TENSOR_CUH_

#include "common/fp8.cuh"
#include "common/launch_rules.h"
#include "common/micro_scale_math.cuh"
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

namespace detail {
template <int kFormat>
struct MicroCodeType {
  using Type = __nv_fp8_e4m3;
};
template <>
struct MicroCodeType<launch::kMicroScaleE5M2> {
  using Type = __nv_fp8_e5m2;
};
}  // namespace detail

template <typename Output>
struct MicroDequantizeParams {
  const unsigned char* codes;   // MXFP8 [rows, cols] bytes; NVFP4 two codes per byte
  const unsigned char* scales;  // E8M0 (MXFP8) or E4M3 (NVFP4) bits, one per block
  const float* tensor_scale;    // NVFP4: S_enc; unused for MXFP8
  Output* y;                    // [rows, cols] in x's orientation
  int rows;
  int cols;
};

template <typename Output, int kFormat, bool kColumnwise>
__global__ void __launch_bounds__(launch::kDequantizeThreads)
    micro_dequantize(MicroDequantizeParams<Output> p) {
  static_assert(kFormat == launch::kMicroScaleE4M3 || kFormat == launch::kMicroScaleE5M2 ||
                    kFormat == launch::kMicroScaleE2M1,
                "kFormat: 0 (MXFP8 E4M3), 1 (MXFP8 E5M2) or 2 (NVFP4)");
  constexpr int kBlock = launch::micro_scale_block_size(kFormat);
  const long long rows = p.rows, cols = p.cols, n = rows * cols;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  float tensor_decode = 1.0f;
  if constexpr (kFormat == launch::kMicroScaleE2M1)
    tensor_decode = __fdiv_rn(1.0f, *p.tensor_scale);
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const long long r = i / cols, c = i % cols;
    float value;
    if constexpr (kFormat == launch::kMicroScaleE2M1) {
      // The stored matrix: x's [rows, cols], or its transpose; blocks along its rows.
      const long long stored_cols = kColumnwise ? rows : cols;
      const long long sr = kColumnwise ? c : r, sc = kColumnwise ? r : c;
      const long long at = sr * stored_cols + sc;
      const unsigned int code = (p.codes[at / 2] >> (4 * (sc & 1))) & 0xFu;
      const unsigned int bits = p.scales[sr * (stored_cols / kBlock) + sc / kBlock];
      __nv_fp8_e4m3 block;
      block.__x = static_cast<__nv_fp8_storage_t>(bits);
      value = __fmul_rn(__fmul_rn(e2m1_to_float(code), static_cast<float>(block)), tensor_decode);
    } else {
      const int e =
          p.scales[kColumnwise ? (r / kBlock) * cols + c : r * (cols / kBlock) + c / kBlock];
      typename detail::MicroCodeType<kFormat>::Type code;
      code.__x = static_cast<__nv_fp8_storage_t>(p.codes[i]);
      value = e == 0xFF ? __uint_as_float(0x7FC00000u)
                        : __fmul_rn(static_cast<float>(code), pow2_float(e - 127));
    }
    p.y[i] = from_float<Output>(value);
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_QUANTIZED_TENSOR_CUH_
