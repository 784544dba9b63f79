// Session's quantized inputs and outputs (docs/embedding.md, "Quantized tensors"; note
// "Quantized boundaries" in docs/architecture.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

#include "api/quantized_boundary.h"
#include "api/session_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/pointer_check.h"

namespace opfuse {

std::vector<QuantizedTensorInfo> Session::quantized_tensors() const {
  impl_->require_bound("quantized_tensors()");
  std::vector<QuantizedTensorInfo> out;
  for (api::QuantizedBoundary& b : api::quantized_boundaries(*impl_->plan, impl_->exec().tensors()))
    out.push_back(std::move(b.info));
  return out;
}

// Note "Quantized boundaries" (docs/architecture.md): the view's pointers go to the input's
// pieces, each checked as set_tensor() checks a tensor (device memory with room for it).
void Session::set_tensor(std::string_view name, const QuantizedTensorView& view) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_bound("set_tensor()");
  s.require_no_graph("set_tensor()");
  const std::vector<api::QuantizedBoundary> all =
      api::quantized_boundaries(*s.plan, s.exec().tensors());
  const api::QuantizedBoundary* b = nullptr;
  std::vector<std::string> names;
  for (const api::QuantizedBoundary& candidate : all) {
    if (candidate.info.kind != TensorKind::Input) continue;
    names.push_back(candidate.info.name);
    if (candidate.info.name == name) b = &candidate;
  }
  if (b == nullptr) {
    throw UsageError(fmt::format(
        "sequence '{}' has no quantized input '{}'{}", s.plan->name, name,
        names.empty() ? std::string() : fmt::format(": it has [{}]", fmt::join(names, ", "))));
  }
  api::check_quantized_view(*b, view, s.plan->name);
  // Every piece is checked before any is set, as set_tensor() checks a tensor (device memory of
  // this GPU with room for it): a refused view changes nothing.
  int device = 0;
  OPFUSE_CUDA_CHECK(cudaGetDevice(&device), "reading the current device");
  const std::vector<gpu::TensorInfo> pieces = s.exec().tensors();
  auto check = [&](const std::string& piece, const void* pointer) {
    if (piece.empty() || pointer == nullptr) return;
    std::optional<std::size_t> bytes;
    for (const gpu::TensorInfo& t : pieces)
      if (t.name == piece && t.role == plan::BufferRole::Input) bytes = t.bytes;
    const std::string problem = gpu::pointer_problem(gpu::pointer_facts(pointer), device, bytes);
    if (!problem.empty()) {
      throw UsageError(fmt::format("quantized input '{}' of sequence '{}': its {} ({}) is {}", name,
                                   s.plan->name, piece, pointer, problem));
    }
  };
  check(b->rowwise, view.rowwise);
  check(b->scale_inv, view.scale_inv);
  check(b->columnwise, view.columnwise);
  check(b->columnwise_scale_inv, view.columnwise_scale_inv);
  check(b->tensor_scale, view.tensor_scale);
  check(b->columnwise_tensor_scale, view.columnwise_tensor_scale);
  s.set_everywhere(b->rowwise, view.rowwise);
  s.set_everywhere(b->scale_inv, view.scale_inv);
  if (!b->tensor_scale.empty()) s.set_everywhere(b->tensor_scale, view.tensor_scale);
  if (!b->columnwise.empty() && view.columnwise != nullptr) {
    s.set_everywhere(b->columnwise, view.columnwise);
    if (!b->columnwise_scale_inv.empty())
      s.set_everywhere(b->columnwise_scale_inv, view.columnwise_scale_inv);
    if (!b->columnwise_tensor_scale.empty())
      s.set_everywhere(b->columnwise_tensor_scale, view.columnwise_tensor_scale);
    s.without_columnwise.erase(std::string(name));
  } else if (!b->columnwise.empty()) {
    s.without_columnwise.insert(std::string(name));
  }
}

QuantizedTensorView Session::quantized_output(std::string_view name) const {
  const Impl& s = *impl_;
  s.require_bound("quantized_output()");
  for (const api::QuantizedBoundary& b : api::quantized_boundaries(*s.plan, s.exec().tensors())) {
    if (b.info.kind != TensorKind::Output || b.info.name != name) continue;
    const gpu::SequenceExecutor& exec = s.exec();
    QuantizedTensorView view;
    view.format = b.info.format;
    view.scales = b.info.scales;
    view.shape = b.info.shape;
    view.rowwise = exec.output(b.rowwise);
    const bool columnwise = !b.columnwise.empty() && exec.outputs_from_training();
    if (columnwise) view.columnwise = exec.output(b.columnwise);
    const auto bytes = [&](std::int64_t entries) {
      return static_cast<std::size_t>(entries) * b.info.scale_entry_bytes;
    };
    if (b.info.scales == ScaleLayout::Tensor) {
      view.scale_inv = exec.quantizer_scale_inv(b.quantizer);
      view.scale_inv_bytes = sizeof(float);
      if (columnwise) {
        view.columnwise_scale_inv = view.scale_inv;
        view.columnwise_scale_inv_bytes = sizeof(float);
      }
    } else {
      view.scale_inv = exec.output(b.scale_inv);
      view.scale_inv_bytes = bytes(b.info.scale_inv_entries);
      if (columnwise) {
        view.columnwise_scale_inv = exec.output(b.columnwise_scale_inv);
        view.columnwise_scale_inv_bytes = bytes(b.info.columnwise_scale_inv_entries);
      }
      // NVFP4: each copy's S_enc is its quantizer's scale (the column-wise copy's own quantizer
      // when it is Hadamard-transformed).
      if (b.info.tensor_scales) {
        view.tensor_scale = exec.quantizer_scale(b.quantizer);
        if (columnwise) {
          view.columnwise_tensor_scale = exec.quantizer_scale(
              b.columnwise_quantizer >= 0 ? b.columnwise_quantizer : b.quantizer);
        }
      }
    }
    return view;
  }
  throw UsageError(fmt::format("sequence '{}' has no quantized output '{}'", s.plan->name, name));
}

}  // namespace opfuse
