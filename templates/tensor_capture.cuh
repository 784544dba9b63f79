// A copy of one tensor for the precision-debug features that read whole tensors (DumpTensors, the
// inspect_tensor call of C++ features; docs/debugging.md, "Tensor captures"): the tensor, wherever
// the plan keeps it in reused memory, converted to float32 into the executor's capture of its
// slot, which outlives the run. Every element is converted exactly (bf16, fp16, fp32 and the FP8
// formats are all float32 values), so the host reads the very values the run held.
//
// Entry point: tensor_capture<Input>.
#ifndef OPFUSE_TEMPLATES_TENSOR_CAPTURE_CUH_
#define OPFUSE_TEMPLATES_TENSOR_CAPTURE_CUH_

#include "common/launch_rules.h"
#include "common/types.cuh"

namespace opfuse {

template <typename Input>
struct TensorCaptureParams {
  const Input* x;  // count elements, row-major
  long long count;
  float* capture;  // count floats: the executor's capture of the slot (count + 1 with scale_inv)
  // The FP8 copy a GEMM reads (plan::CaptureSlot::quantized): its quantizer's scale_inv, stored
  // after the values; nullptr otherwise.
  const float* scale_inv;
  // A block-scaled copy instead: its scale grid, grid_rows x grid_stride with padding; the first
  // grid_used entries of each grid row are stored after the values, row after row.
  const float* scale_grid;
  long long grid_rows;
  long long grid_stride;
  long long grid_used;
};

// Block: launch::kTensorCaptureThreads. Grid: at most launch::kTensorCaptureMaxBlocks blocks, a
// grid-stride loop over the elements.
template <typename Input>
__global__ void __launch_bounds__(launch::kTensorCaptureThreads)
    tensor_capture(TensorCaptureParams<Input> params) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < params.count; i += stride) {
    params.capture[i] = to_float(params.x[i]);
  }
  if (params.scale_inv != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    params.capture[params.count] = *params.scale_inv;
  if (params.scale_grid != nullptr) {
    const long long entries = params.grid_rows * params.grid_used;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < entries;
         i += stride) {
      const long long row = i / params.grid_used;
      params.capture[params.count + i] =
          params.scale_grid[row * params.grid_stride + (i - row * params.grid_used)];
    }
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_TENSOR_CAPTURE_CUH_
