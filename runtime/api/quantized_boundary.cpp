#include "api/quantized_boundary.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>

namespace opfuse::api {

namespace {

TensorDType format_of(plan::DType dtype) {
  return dtype == plan::DType::E5M2   ? TensorDType::E5M2
         : dtype == plan::DType::E2M1 ? TensorDType::E2M1
                                      : TensorDType::E4M3;
}

ScaleLayout layout_of(const plan::QuantSpec& spec) {
  if (spec.per_tensor()) return ScaleLayout::Tensor;
  if (spec.micro_scaled()) return spec.nvfp4() ? ScaleLayout::Nvfp4 : ScaleLayout::Mxfp8;
  return spec.scaling == plan::ScalingKind::Block2D ? ScaleLayout::Block128x128
                                                    : ScaleLayout::Block1x128;
}

const gpu::TensorInfo* find(const std::vector<gpu::TensorInfo>& tensors, const std::string& name,
                            bool caller) {
  for (const gpu::TensorInfo& t : tensors) {
    const bool callers = t.role != plan::BufferRole::Result;
    if (t.name == name && callers == caller && (caller || t.result_kind == "output")) return &t;
  }
  return nullptr;
}

// Fills the sizes of `b` from its row-wise piece's bound shape: opfuse::quantized_tensor_info's,
// the grids as codegen sizes them (note "Block scale grids").
void size_pieces(QuantizedBoundary& b, const std::vector<gpu::TensorInfo>& tensors, bool caller) {
  const gpu::TensorInfo* row = find(tensors, b.rowwise, caller);
  if (row == nullptr) return;
  QuantizedTensorInfo sized = quantized_tensor_info(row->shape, b.info.scales, b.info.columnwise);
  sized.name = std::move(b.info.name);
  sized.kind = b.info.kind;
  sized.format = b.info.format;
  sized.rowwise = b.info.rowwise;
  sized.hadamard = b.info.hadamard;
  b.info = std::move(sized);
}

}  // namespace

std::vector<QuantizedBoundary> quantized_boundaries(const plan::SequencePlan& plan,
                                                    const std::vector<gpu::TensorInfo>& tensors) {
  std::vector<QuantizedBoundary> out;
  // Inputs: a boundary quantizer names the input; its copies are the input buffers it owns.
  for (const plan::QuantizerPlan& q : plan.quantizers) {
    if (!q.boundary) continue;
    QuantizedBoundary b;
    b.quantizer = q.index;
    b.info.name = q.name;
    b.info.kind = TensorKind::Input;
    b.info.format = format_of(q.spec.format);
    b.info.scales = layout_of(q.spec);
    b.info.rowwise = q.usages.rowwise;
    b.info.columnwise = q.usages.columnwise;
    b.info.hadamard = q.spec.nvfp4() && q.spec.rht && q.usages.columnwise;
    b.rowwise = q.name;
    if (q.usages.columnwise) b.columnwise = q.name + ".columnwise";
    b.scale_inv = q.name + ".scale_inv";
    if (q.usages.columnwise && !q.spec.per_tensor())
      b.columnwise_scale_inv = q.name + ".columnwise.scale_inv";
    if (q.spec.nvfp4()) {
      b.tensor_scale = q.name + ".tensor_scale";
      if (q.usages.columnwise) b.columnwise_tensor_scale = q.name + ".columnwise.tensor_scale";
    }
    size_pieces(b, tensors, /*caller=*/true);
    out.push_back(std::move(b));
  }
  // Outputs: an FP8 buffer read back as an output; its column-wise copy and grids are outputs
  // named after it.
  for (const plan::Buffer& buffer : plan.buffers) {
    if (buffer.quantizer < 0 || buffer.role != plan::BufferRole::Result ||
        buffer.usage != plan::CopyUsage::Rowwise)
      continue;
    for (const plan::InterfaceTag& tag : buffer.interface) {
      if (tag.kind != plan::InterfaceKind::Output) continue;
      const plan::QuantizerPlan& q = plan.quantizers.at(static_cast<std::size_t>(buffer.quantizer));
      QuantizedBoundary b;
      b.quantizer = q.index;
      b.info.name = tag.name;
      b.info.kind = TensorKind::Output;
      b.info.format = format_of(q.spec.format);
      b.info.scales = layout_of(q.spec);
      b.info.rowwise = true;
      b.rowwise = tag.name;
      if (find(tensors, tag.name + ".columnwise", false) != nullptr) {
        b.info.columnwise = true;
        b.columnwise = tag.name + ".columnwise";
        for (const plan::Buffer& other : plan.buffers) {
          for (const plan::InterfaceTag& t : other.interface)
            if (t.kind == plan::InterfaceKind::Output && t.name == b.columnwise)
              b.columnwise_quantizer = other.quantizer;
        }
      }
      if (!q.spec.per_tensor()) {
        b.scale_inv = tag.name + ".scale_inv";
        if (b.info.columnwise) b.columnwise_scale_inv = tag.name + ".columnwise.scale_inv";
      }
      size_pieces(b, tensors, /*caller=*/false);
      if (b.columnwise_quantizer >= 0) {
        const plan::QuantSpec& col =
            plan.quantizers.at(static_cast<std::size_t>(b.columnwise_quantizer)).spec;
        b.info.hadamard = col.nvfp4() && col.rht;
      }
      out.push_back(std::move(b));
    }
  }
  return out;
}

void check_quantized_view(const QuantizedBoundary& b, const QuantizedTensorView& view,
                          const std::string& sequence) {
  const QuantizedTensorInfo& info = b.info;
  auto fail = [&](const std::string& what) {
    throw UsageError(
        fmt::format("quantized input '{}' of sequence '{}': {}", info.name, sequence, what));
  };
  if (view.format != info.format) {
    fail(fmt::format("the view is {}, the input {}", tensor_dtype_name(view.format),
                     tensor_dtype_name(info.format)));
  }
  if (view.scales != info.scales) {
    fail(fmt::format("the view's scales are {}, the input's {} (its recipe's)",
                     scale_layout_name(view.scales), scale_layout_name(info.scales)));
  }
  if (view.shape != info.shape) {
    fail(fmt::format("the view is [{}], the input [{}] under the bound sizes",
                     fmt::join(view.shape, ", "), fmt::join(info.shape, ", ")));
  }
  auto aligned = [&](const void* p, const char* what) {
    if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
      fail(fmt::format("its {} pointer is not 16-byte aligned", what));
  };
  if (view.rowwise == nullptr) fail("its row-wise copy is null (the forward GEMM reads it)");
  if (view.scale_inv == nullptr) fail("its scale_inv is null");
  aligned(view.rowwise, "row-wise copy");
  aligned(view.columnwise, "column-wise copy");
  aligned(view.scale_inv, "scale_inv");
  aligned(view.columnwise_scale_inv, "column-wise scale_inv");
  const char* entry = info.scale_entry_bytes == 4 ? "FP32" : "one-byte";
  const std::size_t need =
      static_cast<std::size_t>(info.scale_inv_entries) * info.scale_entry_bytes;
  if (view.scale_inv_bytes < need) {
    fail(fmt::format("its scale_inv buffer holds {} bytes, the {} layout needs {} ({} {} entries)",
                     view.scale_inv_bytes, scale_layout_name(info.scales), need,
                     info.scale_inv_entries, entry));
  }
  if (view.columnwise != nullptr && info.scales != ScaleLayout::Tensor) {
    const std::size_t col_need =
        static_cast<std::size_t>(info.columnwise_scale_inv_entries) * info.scale_entry_bytes;
    if (view.columnwise_scale_inv == nullptr) fail("its column-wise copy has no scale_inv grid");
    if (view.columnwise_scale_inv_bytes < col_need) {
      fail(fmt::format(
          "its column-wise scale_inv buffer holds {} bytes, the {} layout needs {} ({} {} "
          "entries)",
          view.columnwise_scale_inv_bytes, scale_layout_name(info.scales), col_need,
          info.columnwise_scale_inv_entries, entry));
    }
  }
  // NVFP4's tensor scales: one FP32 S_enc per copy given.
  auto scalar = [&](const float* p, const char* what) {
    if (p == nullptr) fail(fmt::format("its {} is null (NVFP4 copies carry their S_enc)", what));
    if (reinterpret_cast<std::uintptr_t>(p) % alignof(float) != 0)
      fail(fmt::format("its {} pointer is not 4-byte aligned", what));
  };
  if (info.tensor_scales) {
    scalar(view.tensor_scale, "tensor_scale");
    if (view.columnwise != nullptr) scalar(view.columnwise_tensor_scale, "columnwise_tensor_scale");
  } else if (view.tensor_scale != nullptr || view.columnwise_tensor_scale != nullptr) {
    fail(fmt::format("the {} layout has no tensor scales: leave tensor_scale null",
                     scale_layout_name(info.scales)));
  }
  if (view.columnwise != nullptr && !info.columnwise)
    fail("the sequence reads no column-wise copy of it: leave columnwise null");
}

}  // namespace opfuse::api
