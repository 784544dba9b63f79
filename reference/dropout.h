// The CPU reference of dropout (note "Dropout" in docs/language.md): the same Philox4x32-10 draws
// as templates/dropout.cuh (templates/common/philox.cuh, one source for both), the same integer
// keep test, the mask packed into the same 32-bit words, so the GPU's mask and output are
// bit-identical to these (tests/gpu/test_gpu_dropout.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "reference_kernels.h"

namespace opfuse::cpu {

// What a dropout op draws with: its seed, the stream word of its instance name, the keep
// threshold of its p, and the factor 1 / (1 - p) applied to kept elements (rounded to T).
struct DropoutDraw {
  uint64_t seed = 0;
  uint32_t stream = 0;
  uint64_t threshold = 0;  // keep when the Philox word >= threshold (0: keep all)
  double scale = 1;        // 1 / (1 - p); float computes with float(scale), as the GPU does
};
DropoutDraw dropout_draw(const ir::Operation& op);

// The packed mask of an n-element tensor of `cols` columns at training step `step`: ceil(cols /
// 32) words per row, bit c % 32 of word [r, c / 32] set when element [r, c] is kept; the unused
// bits of a row's last word are 0.
std::vector<uint32_t> dropout_mask_bits(const DropoutDraw& draw, uint32_t step, int64_t rows,
                                        int64_t cols);
inline bool dropout_kept(std::span<const uint32_t> mask, int64_t words_per_row, int64_t r,
                         int64_t c) {
  return ((mask[size_t(r * words_per_row + c / 32)] >> (c % 32)) & 1u) != 0;
}

// The kernels (ReferenceKernel<T>): training forward draws and saves the mask (inference: y = x);
// backward reads the saved mask.
template <typename T>
void dropout_forward(ReferenceContext<T>& ctx, const ir::Operation& op);
template <typename T>
void dropout_backward(ReferenceContext<T>& ctx, const ir::Operation& op);

}  // namespace opfuse::cpu
