// A quantized tensor as it crosses a sequence boundary (docs/language.md, "Quantized inputs and
// outputs"; note "Quantized boundaries" in docs/architecture.md): TE's QuantizedTensor without the
// quantizer. The codes of the copies its usages ask for, and their scale-inverses: one FP32 value
// both copies share (per-tensor scaling), each copy's grid (Float8 block scaling, laid out as
// note "Block scale grids" in block_quantization.h says), or each copy's compact block scales
// (MXFP8's E8M0, NVFP4's E4M3 and tensor scale, laid out as micro_scaling.h says). The CPU
// reference's quantized inputs and outputs, the reference of the runtime's quantize/dequantize
// helpers, and what tests compare the GPU's bytes with.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "micro_scaling.h"  // same directory: works with or without runtime/ on the include path
#include "numerics.h"

namespace opfuse::cpu {

// How a quantized tensor's scale-inverses are laid out.
enum class ScaleLayout {
  Tensor,   // one FP32 scale_inv for the tensor, shared by both copies
  Block1D,  // 1 x 128 blocks along each stored copy's rows (row-wise: x's rows; column-wise: x's
            // columns), a grid per copy
  Block2D,  // 128 x 128 blocks, a grid per copy (the column-wise one the row-wise one transposed)
  Mxfp8,    // E8M0 per 32 elements: row-wise 1 x 32, column-wise 32 x 1, both copies [rows, cols]
  Nvfp4,    // E2M1 codes, E4M3 per 16 along the stored rows, an FP32 tensor scale per copy
};
// "tensor", "block_1x128", "block_128x128", "mxfp8_1x32", "nvfp4_1x16"
const char* scale_layout_name(ScaleLayout layout);

struct QuantizedTensor {
  Fp8Format format = Fp8Format::E4M3;  // the FP8 codes' (unused for Nvfp4: E2M1)
  ScaleLayout scales = ScaleLayout::Tensor;
  int64_t rows = 0;  // the logical matrix [rows, cols]: leading dims flattened
  int64_t cols = 0;
  // The stored copies; empty without. Row-wise [rows, cols]; column-wise [cols, rows] (x
  // transposed), except MXFP8's [rows, cols]. NVFP4: two codes per byte (rows * cols / 2 bytes).
  std::vector<uint8_t> rowwise;
  std::vector<uint8_t> columnwise;
  std::vector<float> scale_inv;             // Tensor: one value; block: the row-wise copy's grid
  std::vector<float> columnwise_scale_inv;  // block: the column-wise copy's grid; Tensor: empty
  // Mxfp8 / Nvfp4: each copy's compact block scales (E8M0 / E4M3 bits; micro_scaling.h's
  // layouts) and, Nvfp4, its tensor scale S_enc (the column-wise one of the transformed values
  // when `hadamard`).
  std::vector<uint8_t> block_scales;
  std::vector<uint8_t> columnwise_block_scales;
  float tensor_scale = 1.0f;
  float columnwise_tensor_scale = 1.0f;
  bool hadamard = false;  // Nvfp4: the column-wise copy is Hadamard-transformed
};

bool micro_scaled(ScaleLayout layout);  // Mxfp8 or Nvfp4

// The number of entries of a copy's scales: 1 for Tensor, else the grid of the stored copy (rows
// x cols for the row-wise one, cols x rows for the column-wise one), padding included, or the
// compact block scales (one byte each).
int64_t scale_inv_count(ScaleLayout layout, int64_t rows, int64_t cols, bool columnwise);
// Bytes of a copy's data: rows * cols, half that for Nvfp4.
int64_t copy_bytes(ScaleLayout layout, int64_t rows, int64_t cols);

// Quantizes x ([rows, cols], values already rounded to their source dtype) into the copies asked
// for. Tensor: every element fp8(x * scale) with scale_inv = 1 / scale, the scale given (a delayed
// or current scale the caller derived); block: cpu::block_quantize_* with the blocks' own scales
// (`power_of_2_scale`, `epsilon` as the recipe gives them; `scale` unused); Mxfp8:
// cpu::mxfp8_quantize; Nvfp4: cpu::nvfp4_quantize with S_enc from the amax of x (of its
// Hadamard-transformed columns for the column-wise copy when `hadamard`), no stochastic rounding.
QuantizedTensor quantize_tensor(std::span<const float> x, int64_t rows, int64_t cols,
                                Fp8Format format, ScaleLayout layout, bool rowwise, bool columnwise,
                                float scale, bool power_of_2_scale = true, float epsilon = 0.0f,
                                bool hadamard = false);

// One copy of an Mxfp8 / Nvfp4 tensor as micro_scaling.h's type (its codes, block scales and,
// NVFP4, tensor scale and transform), for micro_scaling's decode.
Mxfp8Copy mxfp8_copy(const QuantizedTensor& q, bool columnwise);
Nvfp4Copy nvfp4_copy(const QuantizedTensor& q, bool columnwise);

// The decoded values [rows, cols]: of the row-wise copy, or (`columnwise`) of the column-wise one
// in x's orientation (NVFP4's Hadamard-transformed values are not transformed back). Throws
// std::invalid_argument for a copy the tensor lacks or sizes that disagree with rows, cols and the
// layout.
std::vector<float> dequantize_tensor(const QuantizedTensor& q, bool columnwise = false);

// Empty when q is well formed (copy and grid sizes agree with rows, cols and the layout; a
// per-tensor scale_inv of one value); otherwise what is wrong, for errors.
std::string quantized_tensor_problem(const QuantizedTensor& q);

}  // namespace opfuse::cpu
