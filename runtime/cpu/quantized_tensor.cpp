#include "quantized_tensor.h"

#include <stdexcept>
#include <string>

#include "block_quantization.h"

namespace opfuse::cpu {

const char* scale_layout_name(ScaleLayout layout) {
  switch (layout) {
    case ScaleLayout::Tensor:
      return "tensor";
    case ScaleLayout::Block1D:
      return "block_1x128";
    case ScaleLayout::Block2D:
      return "block_128x128";
  }
  return "?";
}

int64_t scale_inv_count(ScaleLayout layout, int64_t rows, int64_t cols, bool columnwise) {
  if (layout == ScaleLayout::Tensor) return 1;
  const bool two_d = layout == ScaleLayout::Block2D;
  return columnwise ? scale_grid_shape(cols, rows, two_d).size()
                    : scale_grid_shape(rows, cols, two_d).size();
}

QuantizedTensor quantize_tensor(std::span<const float> x, int64_t rows, int64_t cols,
                                Fp8Format format, ScaleLayout layout, bool rowwise, bool columnwise,
                                float scale, bool power_of_2_scale, float epsilon) {
  if (static_cast<int64_t>(x.size()) != rows * cols)
    throw std::invalid_argument("quantize_tensor: x does not hold rows * cols values");
  QuantizedTensor q;
  q.format = format;
  q.scales = layout;
  q.rows = rows;
  q.cols = cols;
  if (layout == ScaleLayout::Tensor) {
    std::vector<uint8_t> bits(x.size());
    quantize_fp8(x, scale, format, bits, nullptr);  // as the cast kernels: fp8(x * scale)
    q.scale_inv = {1.0f / scale};
    if (columnwise) {
      q.columnwise.resize(bits.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          q.columnwise[size_t(c * rows + r)] = bits[size_t(r * cols + c)];
    }
    if (rowwise) q.rowwise = std::move(bits);
    return q;
  }
  BlockQuantParams params;
  params.format = format;
  params.two_d = layout == ScaleLayout::Block2D;
  params.power_of_2_scale = power_of_2_scale;
  params.epsilon = epsilon;
  if (rowwise) {
    BlockQuantizedCopy copy = block_quantize_rowwise(x, rows, cols, params);
    q.rowwise = std::move(copy.data);
    q.scale_inv = std::move(copy.scale_inv);
  }
  if (columnwise) {
    BlockQuantizedCopy copy = block_quantize_columnwise(x, rows, cols, params);
    q.columnwise = std::move(copy.data);
    q.columnwise_scale_inv = std::move(copy.scale_inv);
  }
  return q;
}

std::string quantized_tensor_problem(const QuantizedTensor& q) {
  const size_t elements = size_t(q.rows * q.cols);
  if (q.rows < 1 || q.cols < 1) return "its shape is empty";
  if (!q.rowwise.empty() && q.rowwise.size() != elements)
    return "its row-wise copy does not hold rows * cols values";
  if (!q.columnwise.empty() && q.columnwise.size() != elements)
    return "its column-wise copy does not hold rows * cols values";
  if (q.scales == ScaleLayout::Tensor) {
    if (q.scale_inv.size() != 1) return "a per-tensor scale_inv is one value";
    return {};
  }
  if (!q.rowwise.empty() &&
      int64_t(q.scale_inv.size()) != scale_inv_count(q.scales, q.rows, q.cols, false))
    return "its row-wise scale grid has the wrong size";
  if (!q.columnwise.empty() &&
      int64_t(q.columnwise_scale_inv.size()) != scale_inv_count(q.scales, q.rows, q.cols, true))
    return "its column-wise scale grid has the wrong size";
  return {};
}

std::vector<float> dequantize_tensor(const QuantizedTensor& q, bool columnwise) {
  if (const std::string problem = quantized_tensor_problem(q); !problem.empty())
    throw std::invalid_argument("dequantize_tensor: " + problem);
  const std::vector<uint8_t>& bits = columnwise ? q.columnwise : q.rowwise;
  if (bits.empty())
    throw std::invalid_argument(std::string("dequantize_tensor: the tensor has no ") +
                                (columnwise ? "column-wise" : "row-wise") + " copy");
  const int64_t stored_rows = columnwise ? q.cols : q.rows;
  const int64_t stored_cols = columnwise ? q.rows : q.cols;
  std::vector<float> stored;
  if (q.scales == ScaleLayout::Tensor) {
    stored.resize(bits.size());
    for (size_t i = 0; i < bits.size(); ++i)
      stored[i] = fp8_to_float(bits[i], q.format) * q.scale_inv[0];
  } else {
    BlockQuantizedCopy copy;
    copy.rows = stored_rows;
    copy.cols = stored_cols;
    copy.data = bits;
    copy.scale_inv = columnwise ? q.columnwise_scale_inv : q.scale_inv;
    stored = block_dequantize(copy, q.format, q.scales == ScaleLayout::Block2D);
  }
  if (!columnwise) return stored;
  std::vector<float> out(stored.size());
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c)
      out[size_t(r * q.cols + c)] = stored[size_t(c * q.rows + r)];
  return out;
}

}  // namespace opfuse::cpu
