// `opfuse._opfuse.quantize` / `dequantize` / `quantized_tensor_info`: opfuse::quantize,
// opfuse::dequantize and opfuse::quantized_tensor_info (docs/embedding.md, "Quantized tensors")
// over DLPack CUDA arrays the caller allocated (docs/python.md, "Quantized tensors").
#include <fmt/format.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"

namespace opfuse::python {

namespace {

ScaleLayout layout_named(const std::string& name) {
  for (ScaleLayout l : {ScaleLayout::Tensor, ScaleLayout::Block1x128, ScaleLayout::Block128x128})
    if (scale_layout_name(l) == name) return l;
  throw UsageError(
      fmt::format("scales '{}': the layouts are tensor, block_1x128, block_128x128", name));
}

TensorDType format_named(const std::string& name) {
  if (name == "e4m3") return TensorDType::E4M3;
  if (name == "e5m2") return TensorDType::E5M2;
  throw UsageError(fmt::format("format '{}': a quantized tensor is e4m3 or e5m2", name));
}

// A CUDA array's pointer after the checks every quantized array gets: on a CUDA device, dense
// row-major, `bits` wide, and (when given) `elements` long.
void* cuda_pointer(const InputArray& a, std::uint8_t bits, const char* what, const char* call) {
  if (a.device_type() != nb::device::cuda::value)
    throw UsageError(fmt::format("{}: {} is not a CUDA array", call, what));
  if (a.dtype().bits != bits || a.dtype().lanes != 1)
    throw UsageError(fmt::format("{}: {} must hold {}-bit elements", call, what, bits));
  std::int64_t expected = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected)
      throw UsageError(fmt::format("{}: {} is not dense row-major", call, what));
    expected *= static_cast<std::int64_t>(a.shape(i));
  }
  return const_cast<void*>(a.data());
}

}  // namespace

void bind_quantized(nb::module_& m) {
  m.def(
      "quantized_tensor_info",
      [](const std::vector<std::int64_t>& shape, const std::string& scales, bool columnwise) {
        const QuantizedTensorInfo i =
            quantized_tensor_info(shape, layout_named(scales), columnwise);
        nb::dict d;
        d["shape"] = i.shape;
        d["rows"] = i.rows;
        d["cols"] = i.cols;
        d["scales"] = std::string(scale_layout_name(i.scales));
        d["scale_inv_entries"] = i.scale_inv_entries;
        d["columnwise_scale_inv_entries"] = i.columnwise_scale_inv_entries;
        return d;
      },
      nb::arg("shape"), nb::arg("scales") = "tensor", nb::arg("columnwise") = true,
      "What a quantized tensor of `shape` holds under `scales`: rows, cols and each copy's "
      "scale_inv entries (allocate its arrays with these).");
  m.def(
      "quantize",
      [](const InputArray& x, const InputArray& rowwise, const InputArray& scale_inv,
         std::optional<InputArray> columnwise, std::optional<InputArray> columnwise_scale_inv,
         const std::string& scales, std::optional<bool> power_of_2_scale, double amax_epsilon,
         nb::handle stream) {
        const char* call = "quantize()";
        QuantizedTensorBuffers into;
        into.scales = layout_named(scales);
        into.shape = array_shape(x);
        if (x.dtype() != dlpack_dtype(TensorDType::BF16))
          throw UsageError("quantize(): x must be a bfloat16 array");
        if (array_shape(rowwise) != into.shape)
          throw UsageError("quantize(): rowwise must have x's shape");
        into.rowwise = cuda_pointer(rowwise, 8, "rowwise", call);
        into.scale_inv = static_cast<float*>(cuda_pointer(scale_inv, 32, "scale_inv", call));
        into.scale_inv_bytes = scale_inv.size() * 4;
        if (columnwise) {
          if (columnwise->size() != rowwise.size())
            throw UsageError("quantize(): columnwise must hold as many codes as rowwise");
          into.columnwise = cuda_pointer(*columnwise, 8, "columnwise", call);
        }
        if (columnwise_scale_inv) {
          into.columnwise_scale_inv = static_cast<float*>(
              cuda_pointer(*columnwise_scale_inv, 32, "columnwise_scale_inv", call));
          into.columnwise_scale_inv_bytes = columnwise_scale_inv->size() * 4;
        }
        QuantizeOptions options;
        options.power_of_2_scale = power_of_2_scale;
        options.amax_epsilon = amax_epsilon;
        quantize(cuda_pointer(x, 16, "x", call), into, stream_from(stream), options);
      },
      nb::arg("x"), nb::arg("rowwise"), nb::arg("scale_inv"),
      nb::arg("columnwise").none() = nb::none(),
      nb::arg("columnwise_scale_inv").none() = nb::none(), nb::arg("scales") = "tensor",
      nb::arg("power_of_2_scale").none() = nb::none(), nb::arg("amax_epsilon") = 0.0,
      nb::arg("stream").none() = nb::none(),
      "Quantizes x (bfloat16, CUDA) to e4m3 into the given arrays (8-bit codes, float32 "
      "scales, sized as quantized_tensor_info says), as a sequence's final quantize() does: "
      "'tensor' with current scaling, the block layouts with float8_block_scaling's blocks.");
  m.def(
      "dequantize",
      [](const InputArray& codes, const InputArray& scale_inv, const InputArray& out,
         const std::vector<std::int64_t>& shape, const std::string& scales,
         const std::string& format, bool columnwise, nb::handle stream) {
        const char* call = "dequantize()";
        QuantizedTensorView from;
        from.format = format_named(format);
        from.scales = layout_named(scales);
        from.shape = shape;
        void* data = cuda_pointer(codes, 8, "codes", call);
        (columnwise ? from.columnwise : from.rowwise) = data;
        const auto* s = static_cast<const float*>(cuda_pointer(scale_inv, 32, "scale_inv", call));
        if (columnwise && from.scales != ScaleLayout::Tensor) {
          from.columnwise_scale_inv = s;
          from.columnwise_scale_inv_bytes = scale_inv.size() * 4;
        } else {
          from.scale_inv = s;
          from.scale_inv_bytes = scale_inv.size() * 4;
        }
        if (out.dtype() != dlpack_dtype(TensorDType::BF16) || out.size() != codes.size())
          throw UsageError("dequantize(): out must be a bfloat16 array of as many elements");
        dequantize(from, cuda_pointer(out, 16, "out", call), stream_from(stream), columnwise);
      },
      nb::arg("codes"), nb::arg("scale_inv"), nb::arg("out"), nb::arg("shape"),
      nb::arg("scales") = "tensor", nb::arg("format") = "e4m3", nb::arg("columnwise") = false,
      nb::arg("stream").none() = nb::none(),
      "Decodes one copy of a quantized tensor of `shape` (the row-wise one, or with columnwise "
      "the column-wise one, [cols, rows] as stored) into out (bfloat16), each code times its "
      "block's scale_inv.");
}

}  // namespace opfuse::python
