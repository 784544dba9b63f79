// Note "Quantized boundaries" (docs/architecture.md) as the embedding API sees them: a plan's
// quantized inputs and outputs, each a set of caller or result buffers ("h", "h.columnwise",
// "h.scale_inv", "h.columnwise.scale_inv", NVFP4's "h.tensor_scale"), described as
// QuantizedTensorInfo under the bound sizes, and the checks a QuantizedTensorView passes before its
// pointers reach the executor.
#pragma once

#include <string>
#include <vector>

#include "gpu/plan_executor.h"
#include "opfuse/program.h"
#include "plan/plan.h"

namespace opfuse::api {

// One quantized input or output: what the caller sees, and the plan's pieces behind it.
struct QuantizedBoundary {
  QuantizedTensorInfo info;
  int quantizer = -1;  // the producer's quantizer (outputs) or the boundary one (inputs)
  // An output's column-wise copy's quantizer (NVFP4's Hadamard-transformed copy has its own).
  int columnwise_quantizer = -1;
  std::string rowwise, columnwise, scale_inv, columnwise_scale_inv;  // piece names; "" if none
  std::string tensor_scale, columnwise_tensor_scale;                 // NVFP4 inputs' S_enc pieces
};

// Every quantized input and output of `plan`, sized as `tensors` (the executor's, bound) says.
std::vector<QuantizedBoundary> quantized_boundaries(const plan::SequencePlan& plan,
                                                    const std::vector<gpu::TensorInfo>& tensors);

// Throws UsageError, naming the sequence, the tensor and what is wrong, when `view` is not a
// tensor `b` (an input) can read: format, scale layout, shape, a missing copy or scale, pointers
// not 16-byte aligned, or scale buffers smaller than the layout needs.
void check_quantized_view(const QuantizedBoundary& b, const QuantizedTensorView& view,
                          const std::string& sequence);

}  // namespace opfuse::api
