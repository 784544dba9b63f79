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
  for (ScaleLayout l : {ScaleLayout::Tensor, ScaleLayout::Block1x128, ScaleLayout::Block128x128,
                        ScaleLayout::Mxfp8, ScaleLayout::Nvfp4})
    if (scale_layout_name(l) == name) return l;
  throw UsageError(fmt::format(
      "scales '{}': the layouts are tensor, block_1x128, block_128x128, mxfp8_1x32, nvfp4_1x16",
      name));
}

TensorDType format_named(const std::string& name) {
  if (name == "e4m3") return TensorDType::E4M3;
  if (name == "e5m2") return TensorDType::E5M2;
  if (name == "e2m1") return TensorDType::E2M1;
  throw UsageError(
      fmt::format("format '{}': a quantized tensor is e4m3, e5m2 or e2m1 (nvfp4_1x16)", name));
}

// A CUDA array's pointer after the checks every quantized array gets: on a CUDA device, dense
// row-major, `bits` wide.
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

// A copy's codes: x's shape (the FP8 layouts), or for NVFP4, whose codes are packed two per
// byte, any dense 8-bit array of the copy's bytes.
void* codes_pointer(const InputArray& a, const QuantizedTensorInfo& info, const char* what,
                    const char* call) {
  if (info.scales == ScaleLayout::Nvfp4) {
    if (a.size() != info.rowwise_bytes) {
      throw UsageError(fmt::format(
          "{}: {} holds {} elements; a copy of a [{}, {}] tensor under nvfp4_1x16 is {} bytes "
          "(two codes per byte)",
          call, what, a.size(), info.rows, info.cols, info.rowwise_bytes));
    }
  } else if (array_shape(a) != info.shape) {
    throw UsageError(fmt::format("{}: {} must have x's shape", call, what));
  }
  return cuda_pointer(a, 8, what, call);
}

// A scale array's pointer and bytes: FP32 entries (tensor and block layouts) or one byte per
// entry (MXFP8's E8M0 and NVFP4's E4M3 block scales: any 8-bit dtype), as `info` says.
void* scale_pointer(const InputArray& a, const QuantizedTensorInfo& info, const char* what,
                    const char* call, std::size_t* bytes) {
  void* p = cuda_pointer(a, static_cast<std::uint8_t>(info.scale_entry_bytes * 8), what, call);
  *bytes = a.size() * info.scale_entry_bytes;
  return p;
}

// NVFP4's tensor scale S_enc: a float32 array of one element. The other layouts have none, so
// one given there is refused rather than ignored.
float* tensor_scale_pointer(const std::optional<InputArray>& a, const QuantizedTensorInfo& info,
                            const char* what, const char* call) {
  if (!a) return nullptr;
  if (!info.tensor_scales) {
    throw UsageError(fmt::format("{}: the {} layout has no tensor scales: leave {} None", call,
                                 scale_layout_name(info.scales), what));
  }
  if (a->dtype() != nb::dtype<float>() || a->size() != 1)
    throw UsageError(fmt::format("{}: {} must be a float32 array of one element", call, what));
  return static_cast<float*>(cuda_pointer(*a, 32, what, call));
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
        d["format"] = std::string(tensor_dtype_name(i.format));
        d["scales"] = std::string(scale_layout_name(i.scales));
        d["rowwise_bytes"] = i.rowwise_bytes;
        d["columnwise_bytes"] = i.columnwise_bytes;
        d["scale_inv_entries"] = i.scale_inv_entries;
        d["columnwise_scale_inv_entries"] = i.columnwise_scale_inv_entries;
        d["scale_grid"] = std::vector<std::int64_t>{i.scale_grid[0], i.scale_grid[1]};
        d["columnwise_scale_grid"] =
            std::vector<std::int64_t>{i.columnwise_scale_grid[0], i.columnwise_scale_grid[1]};
        d["scale_entry_bytes"] = i.scale_entry_bytes;
        d["tensor_scales"] = i.tensor_scales;
        return d;
      },
      nb::arg("shape"), nb::arg("scales") = "tensor", nb::arg("columnwise") = true,
      "What a quantized tensor of `shape` holds under `scales`: its format, rows, cols, each "
      "copy's bytes of codes and scale_inv entries (scale_entry_bytes each) and whether it "
      "carries tensor scales (allocate its arrays with these).");
  m.def(
      "quantize",
      [](const InputArray& x, const InputArray& rowwise, const InputArray& scale_inv,
         std::optional<InputArray> columnwise, std::optional<InputArray> columnwise_scale_inv,
         const std::string& scales, std::optional<bool> power_of_2_scale, double amax_epsilon,
         nb::handle stream, std::optional<InputArray> tensor_scale,
         std::optional<InputArray> columnwise_tensor_scale, bool hadamard) {
        const char* call = "quantize()";
        QuantizedTensorBuffers into;
        into.scales = layout_named(scales);
        into.shape = array_shape(x);
        if (x.dtype() != dlpack_dtype(TensorDType::BF16))
          throw UsageError("quantize(): x must be a bfloat16 array");
        const QuantizedTensorInfo info =
            quantized_tensor_info(into.shape, into.scales, columnwise.has_value());
        into.format = info.format;  // e2m1 under nvfp4_1x16, else e4m3
        into.rowwise = codes_pointer(rowwise, info, "rowwise", call);
        into.scale_inv = scale_pointer(scale_inv, info, "scale_inv", call, &into.scale_inv_bytes);
        if (columnwise) {
          if (columnwise->size() != rowwise.size())
            throw UsageError("quantize(): columnwise must hold as many codes as rowwise");
          into.columnwise = cuda_pointer(*columnwise, 8, "columnwise", call);
        }
        if (columnwise_scale_inv) {
          into.columnwise_scale_inv =
              scale_pointer(*columnwise_scale_inv, info, "columnwise_scale_inv", call,
                            &into.columnwise_scale_inv_bytes);
        }
        into.tensor_scale = tensor_scale_pointer(tensor_scale, info, "tensor_scale", call);
        into.columnwise_tensor_scale =
            tensor_scale_pointer(columnwise_tensor_scale, info, "columnwise_tensor_scale", call);
        QuantizeOptions options;
        options.power_of_2_scale = power_of_2_scale;
        options.amax_epsilon = amax_epsilon;
        options.hadamard = hadamard;
        quantize(cuda_pointer(x, 16, "x", call), into, stream_from(stream), options);
      },
      nb::arg("x"), nb::arg("rowwise"), nb::arg("scale_inv"),
      nb::arg("columnwise").none() = nb::none(),
      nb::arg("columnwise_scale_inv").none() = nb::none(), nb::arg("scales") = "tensor",
      nb::arg("power_of_2_scale").none() = nb::none(), nb::arg("amax_epsilon") = 0.0,
      nb::arg("stream").none() = nb::none(), nb::arg("tensor_scale").none() = nb::none(),
      nb::arg("columnwise_tensor_scale").none() = nb::none(), nb::arg("hadamard") = true,
      "Quantizes x (bfloat16, CUDA) into the given arrays, sized as quantized_tensor_info says, "
      "as a sequence's final quantize() does: 'tensor' with current scaling, the block layouts "
      "with float8_block_scaling's blocks (e4m3 codes of x's shape, float32 scales), "
      "'mxfp8_1x32' as mxfp8_block_scaling (e4m3 codes of x's shape, both copies; 8-bit E8M0 "
      "scales), 'nvfp4_1x16' as nvfp4_block_scaling (e2m1 codes two per byte, rowwise_bytes "
      "8-bit elements; 8-bit E4M3 scales; tensor_scale and, with a column-wise copy, "
      "columnwise_tensor_scale: float32 arrays of one element; the column-wise copy "
      "Hadamard-transformed unless hadamard=False).");
  m.def(
      "dequantize",
      [](const InputArray& codes, const InputArray& scale_inv, const InputArray& out,
         const std::vector<std::int64_t>& shape, const std::string& scales,
         const std::string& format, bool columnwise, nb::handle stream,
         std::optional<InputArray> tensor_scale) {
        const char* call = "dequantize()";
        QuantizedTensorView from;
        from.format = format_named(format);
        from.scales = layout_named(scales);
        from.shape = shape;
        const QuantizedTensorInfo info = quantized_tensor_info(shape, from.scales, columnwise);
        if (codes.size() != info.rowwise_bytes) {
          throw UsageError(fmt::format(
              "dequantize(): codes holds {} elements; a copy of a [{}, {}] tensor under {} is {} "
              "bytes",
              codes.size(), info.rows, info.cols, scales, info.rowwise_bytes));
        }
        const void* data = cuda_pointer(codes, 8, "codes", call);
        (columnwise ? from.columnwise : from.rowwise) = data;
        std::size_t bytes = 0;
        const void* s = scale_pointer(scale_inv, info, "scale_inv", call, &bytes);
        if (columnwise && from.scales != ScaleLayout::Tensor) {
          from.columnwise_scale_inv = s;
          from.columnwise_scale_inv_bytes = bytes;
        } else {
          from.scale_inv = s;
          from.scale_inv_bytes = bytes;
        }
        (columnwise ? from.columnwise_tensor_scale : from.tensor_scale) =
            tensor_scale_pointer(tensor_scale, info, "tensor_scale", call);
        // The logical tensor's elements: NVFP4's codes are half as many bytes.
        const auto elements = static_cast<std::size_t>(info.rows * info.cols);
        if (out.dtype() != dlpack_dtype(TensorDType::BF16) || out.size() != elements) {
          throw UsageError(fmt::format(
              "dequantize(): out must be a bfloat16 array of rows * cols = {} elements", elements));
        }
        dequantize(from, cuda_pointer(out, 16, "out", call), stream_from(stream), columnwise);
      },
      nb::arg("codes"), nb::arg("scale_inv"), nb::arg("out"), nb::arg("shape"),
      nb::arg("scales") = "tensor", nb::arg("format") = "e4m3", nb::arg("columnwise") = false,
      nb::arg("stream").none() = nb::none(), nb::arg("tensor_scale").none() = nb::none(),
      "Decodes one copy of a quantized tensor of `shape` (the row-wise one, or with columnwise "
      "the column-wise one as stored: [cols, rows], under mxfp8_1x32 [rows, cols]) into out "
      "(bfloat16, rows * cols elements), each code times its block's scale_inv (nvfp4_1x16: "
      "format='e2m1', and that copy's tensor_scale, a float32 array of one element: "
      "(code * block scale) * (1 / tensor_scale)).");
}

}  // namespace opfuse::python
