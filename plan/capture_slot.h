// One tensor capture of an instrumented plan variant (precision-debug features that read whole
// tensors: DumpTensors, the inspect_tensor call of C++ features).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/enums.h"
#include "plan/quant_spec.h"
#include "plan/sym_expr.h"

namespace opfuse::plan {

// What one capture holds (docs/debugging.md, "Tensor captures"): the high-precision tensor of a
// layer, copied out of the plan's reused memory at the place it is live (the tensor_capture op
// that the debug-instrument pass places like a statistics op) into memory the executor owns, and
// read after the run as float32 values.
struct CaptureSlot {
  std::string layer;   // the layer's name (`as fc1`)
  std::string tensor;  // activation, weight, gradient, output, dgrad, wgrad
  // The tensor's shape (float32 elements the capture holds): set by codegen in
  // SequencePlan::capture_slots, empty in ir::Sequence::captures.
  std::vector<SymExpr> shape;
  // The FP8 copy the layer's first GEMM of the tensor reads (fprop's for the activation and the
  // weight, dgrad's for the gradient) instead of the high-precision tensor: its values as float32
  // (unscaled FP8 numbers, exact) followed by the scale_inv the GEMM reads: one float for a
  // per-tensor scale; for block scales (`block` 1 x 128 or 128 x 128) the grid without the
  // padding of its layout, [ceil(cols / 128)][rows] for 1 x 128 blocks (block-column major, as
  // stored) and [ceil(rows / 128)][ceil(cols / 128)] for 128 x 128 ones. Placed by
  // passes::debug_capture_quantized after plan-quantization; `format` and `block` are the copy's.
  bool quantized = false;
  DType format = DType::E4M3;
  BlockShape block{};
  // Of a 1 x 128 block-scaled tensor, also its column-wise copy (quantized again down the
  // columns, stored transposed: the shape is [cols, rows]) as the GEMM reading it has it: wgrad
  // for the activation and the gradient, dgrad for the weight.
  bool columnwise = false;
  // How many scale_inv floats follow the values of a quantized capture of a tensor of `shape`
  // (the tensor's, evaluated; the last extent is the columns): 1, or the grid's real entries.
  int64_t scale_count(const std::vector<int64_t>& shape) const {
    if (!quantized) return 0;
    if (block.rows == 0 || shape.empty()) return 1;
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    const int64_t col_blocks = (shape.back() + block.cols - 1) / block.cols;
    return (block.rows > 1 ? (rows + block.rows - 1) / block.rows : rows) * col_blocks;
  }
  friend bool operator==(const CaptureSlot&, const CaptureSlot&) = default;
};

}  // namespace opfuse::plan
