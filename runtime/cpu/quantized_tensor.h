// A quantized tensor as it crosses a sequence boundary (docs/language.md, "Quantized inputs and
// outputs"; note "Quantized boundaries" in docs/architecture.md): TE's QuantizedTensor without the
// quantizer. FP8 bits of the copies its usages ask for, and their scale-inverses: one FP32 value
// both copies share (per-tensor scaling), or each copy's grid (Float8 block scaling, laid out as
// note "Block scale grids" in block_quantization.h says). The CPU reference's quantized inputs
// and outputs, the reference of the runtime's quantize/dequantize helpers, and what tests compare
// the GPU's bytes with.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "numerics.h"  // same directory: works with or without runtime/ on the include path

namespace opfuse::cpu {

// How a quantized tensor's scale-inverses are laid out.
enum class ScaleLayout {
  Tensor,   // one FP32 scale_inv for the tensor, shared by both copies
  Block1D,  // 1 x 128 blocks along each stored copy's rows (row-wise: x's rows; column-wise: x's
            // columns), a grid per copy
  Block2D,  // 128 x 128 blocks, a grid per copy (the column-wise one the row-wise one transposed)
};
const char* scale_layout_name(ScaleLayout layout);  // "tensor", "block_1x128", "block_128x128"

struct QuantizedTensor {
  Fp8Format format = Fp8Format::E4M3;
  ScaleLayout scales = ScaleLayout::Tensor;
  int64_t rows = 0;  // the logical matrix [rows, cols]: leading dims flattened
  int64_t cols = 0;
  std::vector<uint8_t> rowwise;             // [rows, cols] FP8 bits; empty without a row-wise copy
  std::vector<uint8_t> columnwise;          // [cols, rows] (x transposed); empty without one
  std::vector<float> scale_inv;             // Tensor: one value; block: the row-wise copy's grid
  std::vector<float> columnwise_scale_inv;  // block: the column-wise copy's grid; Tensor: empty
};

// The number of FP32 entries of a copy's scale_inv: 1 for Tensor, else the grid of the stored
// copy (rows x cols for the row-wise one, cols x rows for the column-wise one), padding included.
int64_t scale_inv_count(ScaleLayout layout, int64_t rows, int64_t cols, bool columnwise);

// Quantizes x ([rows, cols], values already rounded to their source dtype) into the copies asked
// for. Tensor: every element fp8(x * scale) with scale_inv = 1 / scale, the scale given (a delayed
// or current scale the caller derived); block: cpu::block_quantize_* with the blocks' own scales
// (`power_of_2_scale`, `epsilon` as the recipe gives them; `scale` unused).
QuantizedTensor quantize_tensor(std::span<const float> x, int64_t rows, int64_t cols,
                                Fp8Format format, ScaleLayout layout, bool rowwise, bool columnwise,
                                float scale, bool power_of_2_scale = true, float epsilon = 0.0f);

// The decoded values [rows, cols]: of the row-wise copy, or (`columnwise`) of the column-wise one
// transposed back. Throws std::invalid_argument for a copy the tensor lacks or sizes that
// disagree with rows, cols and the layout.
std::vector<float> dequantize_tensor(const QuantizedTensor& q, bool columnwise = false);

// Empty when q is well formed (copy and grid sizes agree with rows, cols and the layout; a
// per-tensor scale_inv of one value); otherwise what is wrong, for errors.
std::string quantized_tensor_problem(const QuantizedTensor& q);

}  // namespace opfuse::cpu
