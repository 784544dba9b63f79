#include "dropout.h"

#include <fmt/format.h>

#include "../templates/common/philox.cuh"
#include "cpu_tensor.h"
#include "support/assert.h"

namespace opfuse::cpu {

DropoutDraw dropout_draw(const ir::Operation& op) {
  DropoutDraw d;
  const double p = ir::attr_float(op.attrs, "p");
  d.seed = uint64_t(ir::attr_int(op.attrs, "seed"));
  d.stream = opfuse::dropout_stream(op.instance.data(), op.instance.size());
  d.threshold = opfuse::dropout_threshold(p);
  OPFUSE_ASSERT(d.threshold <= 0xFFFFFFFFull, "dropout '{}': p = {} passed the front end",
                op.instance, p);
  d.scale = 1.0 / (1.0 - p);
  return d;
}

std::vector<uint32_t> dropout_mask_bits(const DropoutDraw& draw, uint32_t step, int64_t rows,
                                        int64_t cols) {
  const int64_t words = (cols + 31) / 32;
  std::vector<uint32_t> mask(size_t(rows * words), 0u);
  Philox4x32 random{};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      // Element i = r * cols + c draws word i % 4 of the call for group i / 4.
      const auto i = uint64_t(r * cols + c);
      if (i % 4 == 0 || c == 0) random = dropout_random_words(i / 4, draw.seed, step, draw.stream);
      if (random.v[i % 4] >= draw.threshold) mask[size_t(r * words + c / 32)] |= 1u << (c % 32);
    }
  }
  return mask;
}

template <typename T>
void dropout_forward(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& x = ctx.in(op, 0);
  Tensor<T>& y = ctx.out(op, 0);
  if (!ctx.training) {
    y.data = x.data;
    return;
  }
  const DropoutDraw draw = dropout_draw(op);
  const int64_t rows = x.rows(), cols = x.cols(), words = (cols + 31) / 32;
  std::vector<uint32_t> mask = dropout_mask_bits(draw, ctx.step, rows, cols);
  const T scale = T(draw.scale);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = size_t(r * cols + c);
      y.data[i] = dropout_kept(mask, words, r, c) ? x.data[i] * scale : T(0);
    }
  }
  // The saved mask (a result build-backward added) exists only where backward needs it.
  if (op.results.size() > 1) {
    Tensor<T>& shown = ctx.out(op, 1);
    for (size_t k = 0; k < mask.size(); ++k) shown.data[k] = T(mask[k]);
    ctx.dropout_masks[op.results[1]] = std::move(mask);
  } else {
    ctx.dropout_masks[op.results[0]] = std::move(mask);  // dropout_mask() finds it by the op
  }
}

template <typename T>
void dropout_backward(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& dy = ctx.in(op, 0);
  const auto saved = ctx.dropout_masks.find(op.operands[1]);
  if (saved == ctx.dropout_masks.end())
    throw ReferenceError(fmt::format(
        "dropout '{}': backward needs the mask of a training forward (forward_inference() "
        "saves none)",
        op.instance));
  const DropoutDraw draw = dropout_draw(op);
  Tensor<T>& dx = ctx.out(op, 0);
  const int64_t rows = dy.rows(), cols = dy.cols(), words = (cols + 31) / 32;
  const T scale = T(draw.scale);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = size_t(r * cols + c);
      dx.data[i] = dropout_kept(saved->second, words, r, c) ? dy.data[i] * scale : T(0);
    }
  }
}

template void dropout_forward<float>(ReferenceContext<float>&, const ir::Operation&);
template void dropout_forward<double>(ReferenceContext<double>&, const ir::Operation&);
template void dropout_backward<float>(ReferenceContext<float>&, const ir::Operation&);
template void dropout_backward<double>(ReferenceContext<double>&, const ir::Operation&);

}  // namespace opfuse::cpu
