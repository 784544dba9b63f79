// Quantized inputs in the tools (`fusec run`, `fusec train`, `fusec bench` of a consumer
// sequence; docs/language.md, "Quantized inputs and outputs"): the input's seeded values
// quantized as a producer's final quantize() would (opfuse::quantize) and given as a
// QuantizedTensorView, as the CPU reference driver does with cpu::quantize_tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpu/device_memory.h"
#include "opfuse/program.h"

namespace opfuse::api {

// Whether `name` is a quantized input of `session` or one of its pieces ("h", "h.columnwise",
// "h.scale_inv", "h.tensor_scale", ...), which a view gives and set_tensor() refuses.
bool quantized_input_piece(const Session& session, const std::string& name);

// A quantized output of `session` named `name` (a producer's main output); and whether `name` is
// one of a quantized output's other pieces ("h.columnwise", "h.scale_inv", ...).
std::optional<QuantizedTensorInfo> quantized_output_info(const Session& session,
                                                         const std::string& name);
bool quantized_output_piece(const Session& session, const std::string& name);

// Gives each quantized input of `session` its copies: normal(0, 1) values of the stream the run
// drivers use for input 0 (`seed`), rounded to bf16, quantized under the input's layout into
// memory appended to `memory` (which must outlive the runs).
void give_quantized_inputs(Session& session, std::uint64_t seed, cudaStream_t stream,
                           std::vector<gpu::DeviceBuffer>& memory);

}  // namespace opfuse::api
