// One tensor capture of an instrumented plan variant (precision-debug features that read whole
// tensors: DumpTensors, the inspect_tensor call of C++ features).
#pragma once

#include <string>
#include <vector>

#include "plan/enums.h"
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
  // (unscaled FP8 numbers, exact) followed by one more float, the scale_inv the GEMM reads.
  // Placed by passes::debug_capture_quantized after plan-quantization; `format` is the copy's.
  bool quantized = false;
  DType format = DType::E4M3;
  friend bool operator==(const CaptureSlot&, const CaptureSlot&) = default;
};

}  // namespace opfuse::plan
