// A captured tensor as the host reads it after a run (plan::CaptureSlot): what DumpTensors writes
// and C++ features' inspect_tensor reads. The CPU reference and the GPU executor both give these.
#pragma once

#include <cstdint>
#include <vector>

namespace opfuse::debug {

struct CapturedTensor {
  std::vector<int64_t> shape;  // row-major
  std::vector<float> values;   // the tensor as the run held it (rounded to its dtype), as float32
  // A quantized capture (plan::CaptureSlot::quantized): `values` are the FP8 numbers (unscaled),
  // and this their scale_inv (one: a per-tensor scale). Empty otherwise.
  std::vector<float> scale_inv;
  friend bool operator==(const CapturedTensor&, const CapturedTensor&) = default;
};

}  // namespace opfuse::debug
