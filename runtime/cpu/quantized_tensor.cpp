#include "quantized_tensor.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "block_quantization.h"
#include "micro_scaling.h"

namespace opfuse::cpu {

const char* scale_layout_name(ScaleLayout layout) {
  switch (layout) {
    case ScaleLayout::Tensor:
      return "tensor";
    case ScaleLayout::Block1D:
      return "block_1x128";
    case ScaleLayout::Block2D:
      return "block_128x128";
    case ScaleLayout::Mxfp8:
      return "mxfp8_1x32";
    case ScaleLayout::Nvfp4:
      return "nvfp4_1x16";
  }
  return "?";
}

bool micro_scaled(ScaleLayout layout) {
  return layout == ScaleLayout::Mxfp8 || layout == ScaleLayout::Nvfp4;
}

int64_t copy_bytes(ScaleLayout layout, int64_t rows, int64_t cols) {
  return layout == ScaleLayout::Nvfp4 ? rows * cols / 2 : rows * cols;
}

int64_t scale_inv_count(ScaleLayout layout, int64_t rows, int64_t cols, bool columnwise) {
  if (layout == ScaleLayout::Tensor) return 1;
  // micro_scaling.h: MXFP8 blocks run along the rows (row-wise) or down the columns (column-wise)
  // of [rows, cols]; NVFP4's along the rows of the stored copy ([cols, rows] column-wise).
  if (layout == ScaleLayout::Mxfp8)
    return columnwise ? rows / kMxfp8BlockSize * cols : rows * (cols / kMxfp8BlockSize);
  if (layout == ScaleLayout::Nvfp4)
    return columnwise ? cols * (rows / kNvfp4BlockSize) : rows * (cols / kNvfp4BlockSize);
  const bool two_d = layout == ScaleLayout::Block2D;
  return columnwise ? scale_grid_shape(cols, rows, two_d).size()
                    : scale_grid_shape(rows, cols, two_d).size();
}

QuantizedTensor quantize_tensor(std::span<const float> x, int64_t rows, int64_t cols,
                                Fp8Format format, ScaleLayout layout, bool rowwise, bool columnwise,
                                float scale, bool power_of_2_scale, float epsilon, bool hadamard) {
  if (static_cast<int64_t>(x.size()) != rows * cols)
    throw std::invalid_argument("quantize_tensor: x does not hold rows * cols values");
  QuantizedTensor q;
  q.format = format;
  q.scales = layout;
  q.rows = rows;
  q.cols = cols;
  if (layout == ScaleLayout::Mxfp8) {
    auto take = [&](bool column, std::vector<uint8_t>& data, std::vector<uint8_t>& scales) {
      Mxfp8Copy copy = mxfp8_quantize(x, rows, cols, format, column);
      data = std::move(copy.data);
      scales = std::move(copy.scales);
    };
    if (rowwise) take(false, q.rowwise, q.block_scales);
    if (columnwise) take(true, q.columnwise, q.columnwise_block_scales);
    return q;
  }
  if (layout == ScaleLayout::Nvfp4) {
    // As a sequence's NVFP4 casts of a linear's input: S_enc from the tensor's amax (fp32 max
    // of |x|, NaN skipped), the transformed copy's from the transformed values'.
    float amax = 0.0f;
    for (const float v : x) amax = std::fmax(amax, std::fabs(v));
    q.hadamard = hadamard && columnwise;
    q.tensor_scale = nvfp4_tensor_scale(amax);
    q.columnwise_tensor_scale =
        q.hadamard ? nvfp4_tensor_scale(rht_amax(x, rows, cols)) : q.tensor_scale;
    auto take = [&](bool column, float tensor_scale, std::vector<uint8_t>& data,
                    std::vector<uint8_t>& scales) {
      Nvfp4Params params;
      params.columnwise = column;
      params.rht = column && q.hadamard;
      Nvfp4Copy copy = nvfp4_quantize(x, rows, cols, tensor_scale, params);
      data = std::move(copy.data);
      scales = std::move(copy.scales);
    };
    if (rowwise) take(false, q.tensor_scale, q.rowwise, q.block_scales);
    if (columnwise) take(true, q.columnwise_tensor_scale, q.columnwise, q.columnwise_block_scales);
    return q;
  }
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
  const size_t elements = size_t(copy_bytes(q.scales, q.rows, q.cols));
  if (q.rows < 1 || q.cols < 1) return "its shape is empty";
  if (micro_scaled(q.scales)) {
    const int64_t block = q.scales == ScaleLayout::Mxfp8 ? kMxfp8BlockSize : kNvfp4BlockSize;
    if (!q.rowwise.empty() && q.cols % block != 0)
      return "its row-wise blocks need cols to be a multiple of " + std::to_string(block);
    if (!q.columnwise.empty() && q.rows % block != 0)
      return "its column-wise blocks need rows to be a multiple of " + std::to_string(block);
  }
  if (!q.rowwise.empty() && q.rowwise.size() != elements)
    return "its row-wise copy does not hold rows * cols values";
  if (!q.columnwise.empty() && q.columnwise.size() != elements)
    return "its column-wise copy does not hold rows * cols values";
  if (q.scales == ScaleLayout::Tensor) {
    if (q.scale_inv.size() != 1) return "a per-tensor scale_inv is one value";
    return {};
  }
  if (micro_scaled(q.scales)) {
    if (!q.rowwise.empty() &&
        int64_t(q.block_scales.size()) != scale_inv_count(q.scales, q.rows, q.cols, false))
      return "its row-wise block scales have the wrong size";
    if (!q.columnwise.empty() && int64_t(q.columnwise_block_scales.size()) !=
                                     scale_inv_count(q.scales, q.rows, q.cols, true))
      return "its column-wise block scales have the wrong size";
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

Mxfp8Copy mxfp8_copy(const QuantizedTensor& q, bool columnwise) {
  Mxfp8Copy copy;
  copy.rows = q.rows;
  copy.cols = q.cols;
  copy.columnwise = columnwise;
  copy.format = q.format;
  copy.data = columnwise ? q.columnwise : q.rowwise;
  copy.scales = columnwise ? q.columnwise_block_scales : q.block_scales;
  return copy;
}

Nvfp4Copy nvfp4_copy(const QuantizedTensor& q, bool columnwise) {
  Nvfp4Copy copy;
  copy.rows = q.rows;
  copy.cols = q.cols;
  copy.params.columnwise = columnwise;
  copy.params.rht = columnwise && q.hadamard;
  copy.tensor_scale = columnwise ? q.columnwise_tensor_scale : q.tensor_scale;
  copy.data = columnwise ? q.columnwise : q.rowwise;
  copy.scales = columnwise ? q.columnwise_block_scales : q.block_scales;
  return copy;
}

std::vector<float> dequantize_tensor(const QuantizedTensor& q, bool columnwise) {
  if (const std::string problem = quantized_tensor_problem(q); !problem.empty())
    throw std::invalid_argument("dequantize_tensor: " + problem);
  const std::vector<uint8_t>& bits = columnwise ? q.columnwise : q.rowwise;
  if (bits.empty())
    throw std::invalid_argument(std::string("dequantize_tensor: the tensor has no ") +
                                (columnwise ? "column-wise" : "row-wise") + " copy");
  if (q.scales == ScaleLayout::Mxfp8) return mxfp8_dequantize(mxfp8_copy(q, columnwise));
  if (q.scales == ScaleLayout::Nvfp4) return nvfp4_dequantize(nvfp4_copy(q, columnwise));
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
