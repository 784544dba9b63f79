// opfuse::quantize, opfuse::dequantize and opfuse::quantized_tensor_info (opfuse/program.h,
// docs/embedding.md "Quantized tensors"). quantize runs what a sequence's final quantize() runs:
// a one-op program `quantize()` under the recipe that gives the asked layout, compiled once per
// width, layout and options (through the kernel cache) and kept for the process, run by a session
// made for the call; its copies are copied into the caller's memory. dequantize launches
// templates/quantized_tensor.cuh's kernel, compiled once per format and layout.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "../../templates/common/launch_rules.h"
#include "cpu/block_quantization.h"
#include "cpu/micro_scaling.h"
#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/module.h"
#include "jit/nvrtc_compiler.h"
#include "opfuse/program.h"

namespace opfuse {

namespace {

// Host mirrors of templates/quantized_tensor.cuh's DequantizeParams and MicroDequantizeParams
// (their layouts do not depend on the type arguments).
struct DequantizeParams {
  const void* codes;
  const void* scale_inv;
  void* y;
  long long rows;
  long long cols;
  long long grid_stride;
};
struct MicroDequantizeParams {
  const void* codes;
  const void* scales;
  const float* tensor_scale;
  void* y;
  int rows;
  int cols;
};

// The kernel of `expression` from quantized_tensor.cuh: one module per device and entry,
// compiled at first use, for the process (never unloaded: at exit the CUDA context may be gone
// before static destructors run).
gpu::Kernel dequantize_kernel(const std::string& expression, const char* kernel_name) {
  static std::mutex mutex;
  static auto& modules = *new std::map<std::pair<int, std::string>, std::unique_ptr<gpu::Module>>;
  const gpu::DeviceInfo device = gpu::current_device();
  const std::lock_guard lock(mutex);
  std::unique_ptr<gpu::Module>& module = modules[{device.ordinal, expression}];
  if (!module) {
    jit::CompileRequest request;
    request.kernel_name = kernel_name;
    request.source = "#include \"quantized_tensor.cuh\"\n";
    request.name_expressions = {expression};
    request.arch = device.arch;
    module = std::make_unique<gpu::Module>(jit::compile_kernel(request));
  }
  return module->kernel(expression);
}

bool micro(ScaleLayout layout) {
  return layout == ScaleLayout::Mxfp8 || layout == ScaleLayout::Nvfp4;
}

std::pair<std::int64_t, std::int64_t> matrix_of(const std::vector<std::int64_t>& shape,
                                                const char* what) {
  if (shape.empty()) throw UsageError(fmt::format("{}: the tensor has no shape", what));
  std::int64_t rows = 1;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i) {
    if (shape[i] < 1) throw UsageError(fmt::format("{}: shape [{}]", what, fmt::join(shape, ", ")));
    rows *= shape[i];
  }
  if (shape.back() < 1)
    throw UsageError(fmt::format("{}: shape [{}]", what, fmt::join(shape, ", ")));
  return {rows, shape.back()};
}

void require_aligned(const void* p, const char* what, const char* call) {
  if (p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
    throw UsageError(
        fmt::format("{}: {} is {}", call, what, p == nullptr ? "null" : "not 16-byte aligned"));
}

}  // namespace

QuantizedTensorInfo quantized_tensor_info(const std::vector<std::int64_t>& shape,
                                          ScaleLayout scales, bool columnwise) {
  const auto [rows, cols] = matrix_of(shape, "quantized_tensor_info");
  QuantizedTensorInfo info;
  info.shape = shape;
  info.rows = rows;
  info.cols = cols;
  info.scales = scales;
  info.columnwise = columnwise;
  const bool nvfp4 = scales == ScaleLayout::Nvfp4;
  info.format = nvfp4 ? TensorDType::E2M1 : TensorDType::E4M3;
  info.rowwise_bytes = static_cast<std::size_t>(nvfp4 ? rows * cols / 2 : rows * cols);
  info.columnwise_bytes = columnwise ? info.rowwise_bytes : 0;
  if (scales == ScaleLayout::Mxfp8 || nvfp4) {
    // runtime/cpu/micro_scaling.h's compact layouts, one byte per block.
    const std::int64_t block = nvfp4 ? cpu::kNvfp4BlockSize : cpu::kMxfp8BlockSize;
    if (cols % block != 0 || (columnwise && rows % block != 0)) {
      throw UsageError(fmt::format(
          "quantized_tensor_info: a [{}, {}] matrix has no {} blocks of {} along {}", rows, cols,
          scale_layout_name(scales), block,
          cols % block != 0 ? "its rows (cols must be a multiple)"
                            : "its columns (rows must be a multiple, for the column-wise copy)"));
    }
    info.scale_entry_bytes = 1;
    info.tensor_scales = nvfp4;
    info.scale_grid[0] = rows;
    info.scale_grid[1] = cols / block;
    info.scale_inv_entries = rows * (cols / block);
    if (columnwise) {
      info.columnwise_scale_grid[0] = nvfp4 ? cols : rows / block;
      info.columnwise_scale_grid[1] = nvfp4 ? rows / block : cols;
      info.columnwise_scale_inv_entries =
          info.columnwise_scale_grid[0] * info.columnwise_scale_grid[1];
    }
    return info;
  }
  if (scales == ScaleLayout::Tensor) {
    info.scale_inv_entries = 1;
    if (columnwise) {
      info.columnwise_scale_inv_entries = 1;
      info.columnwise_scale_grid[0] = info.columnwise_scale_grid[1] = 1;
    }
    return info;
  }
  const bool two_d = scales == ScaleLayout::Block128x128;
  const cpu::ScaleGridShape row = cpu::scale_grid_shape(rows, cols, two_d);
  info.scale_grid[0] = row.outer;
  info.scale_grid[1] = row.inner;
  info.scale_inv_entries = row.size();
  if (columnwise) {
    const cpu::ScaleGridShape col = cpu::scale_grid_shape(cols, rows, two_d);
    info.columnwise_scale_grid[0] = col.outer;
    info.columnwise_scale_grid[1] = col.inner;
    info.columnwise_scale_inv_entries = col.size();
  }
  return info;
}

QuantizedTensorView QuantizedTensorBuffers::view() const {
  QuantizedTensorView v;
  v.format = format;
  v.scales = scales;
  v.shape = shape;
  v.rowwise = rowwise;
  v.columnwise = columnwise;
  v.scale_inv = scale_inv;
  v.columnwise_scale_inv = columnwise_scale_inv;
  v.scale_inv_bytes = scale_inv_bytes;
  v.columnwise_scale_inv_bytes = columnwise_scale_inv_bytes;
  v.tensor_scale = tensor_scale;
  v.columnwise_tensor_scale = columnwise_tensor_scale;
  return v;
}

void dequantize(const QuantizedTensorView& from, void* output, cudaStream_t stream,
                bool columnwise) {
  const char* call = "dequantize()";
  gpu::throw_if_faulted();
  const auto [rows, cols] = matrix_of(from.shape, call);
  const bool nvfp4 = from.scales == ScaleLayout::Nvfp4;
  if (nvfp4 ? from.format != TensorDType::E2M1
            : from.format != TensorDType::E4M3 && from.format != TensorDType::E5M2) {
    throw UsageError(fmt::format("{}: a quantized tensor of layout {} is {}, not {}", call,
                                 scale_layout_name(from.scales), nvfp4 ? "e2m1" : "e4m3 or e5m2",
                                 tensor_dtype_name(from.format)));
  }
  const void* codes = columnwise ? from.columnwise : from.rowwise;
  const void* scale_inv =
      columnwise && from.scales != ScaleLayout::Tensor ? from.columnwise_scale_inv : from.scale_inv;
  const std::size_t have = columnwise && from.scales != ScaleLayout::Tensor
                               ? from.columnwise_scale_inv_bytes
                               : from.scale_inv_bytes;
  require_aligned(codes, columnwise ? "the column-wise copy" : "the row-wise copy", call);
  require_aligned(scale_inv, "its scale_inv", call);
  require_aligned(output, "the output", call);
  const QuantizedTensorInfo info = quantized_tensor_info(from.shape, from.scales, true);
  const std::int64_t entries =
      columnwise ? info.columnwise_scale_inv_entries : info.scale_inv_entries;
  const std::size_t need = static_cast<std::size_t>(entries) * info.scale_entry_bytes;
  if (have < need) {
    throw UsageError(fmt::format("{}: the scale_inv buffer holds {} bytes, the {} layout needs {}",
                                 call, have, scale_layout_name(from.scales), need));
  }
  if (micro(from.scales)) {
    const float* tensor_scale = columnwise ? from.columnwise_tensor_scale : from.tensor_scale;
    if (nvfp4 && (tensor_scale == nullptr ||
                  reinterpret_cast<std::uintptr_t>(tensor_scale) % alignof(float) != 0)) {
      throw UsageError(fmt::format("{}: an NVFP4 copy needs its tensor scale (S_enc), {}", call,
                                   tensor_scale == nullptr ? "null" : "not 4-byte aligned"));
    }
    // NVFP4's column-wise copy is the row-wise layout of x transposed: decoded as stored.
    const bool down_columns = columnwise && !nvfp4;
    const std::int64_t out_rows = columnwise && nvfp4 ? cols : rows;
    const std::int64_t out_cols = columnwise && nvfp4 ? rows : cols;
    const int format = launch::micro_scale_format(nvfp4, from.format == TensorDType::E5M2);
    const std::string expression = fmt::format("opfuse::micro_dequantize<__nv_bfloat16, {}, {}>",
                                               format, down_columns ? "true" : "false");
    const gpu::Kernel kernel = dequantize_kernel(expression, "micro_dequantize");
    const MicroDequantizeParams params{codes,
                                       scale_inv,
                                       tensor_scale,
                                       output,
                                       static_cast<int>(out_rows),
                                       static_cast<int>(out_cols)};
    gpu::launch(kernel, dim3(static_cast<unsigned>(launch::dequantize_grid_x(rows * cols))),
                dim3(launch::kDequantizeThreads), 0, stream, params);
    return;
  }
  const int blocks = from.scales == ScaleLayout::Tensor       ? 0
                     : from.scales == ScaleLayout::Block1x128 ? 1
                                                              : 2;
  const std::string expression =
      fmt::format("opfuse::dequantize<{}, __nv_bfloat16, {}>",
                  from.format == TensorDType::E5M2 ? "__nv_fp8_e5m2" : "__nv_fp8_e4m3", blocks);
  const gpu::Kernel kernel = dequantize_kernel(expression, "dequantize");
  const std::int64_t stored_rows = columnwise ? cols : rows, stored_cols = columnwise ? rows : cols;
  const std::int64_t grid_stride = columnwise ? info.columnwise_scale_grid[1] : info.scale_grid[1];
  const DequantizeParams params{codes, scale_inv, output, stored_rows, stored_cols, grid_stride};
  gpu::launch(kernel, dim3(static_cast<unsigned>(launch::dequantize_grid_x(rows * cols))),
              dim3(launch::kDequantizeThreads), 0, stream, params);
}

void quantize(const void* input, const QuantizedTensorBuffers& into, cudaStream_t stream,
              const QuantizeOptions& options) {
  const char* call = "quantize()";
  gpu::throw_if_faulted();
  const auto [rows, cols] = matrix_of(into.shape, call);
  const bool nvfp4 = into.scales == ScaleLayout::Nvfp4;
  if (into.format != (nvfp4 ? TensorDType::E2M1 : TensorDType::E4M3)) {
    throw UsageError(
        fmt::format("{}: opfuse quantizes to {} under the {} layout (the format recipes give the "
                    "tensors linears read), not {}",
                    call, nvfp4 ? "e2m1" : "e4m3", scale_layout_name(into.scales),
                    tensor_dtype_name(into.format)));
  }
  require_aligned(input, "the input", call);
  require_aligned(into.rowwise, "the row-wise copy", call);
  require_aligned(into.scale_inv, "its scale_inv", call);
  const bool columnwise = into.columnwise != nullptr;
  if (columnwise) require_aligned(into.columnwise, "the column-wise copy", call);
  const bool blocks = into.scales != ScaleLayout::Tensor;
  if (columnwise && blocks)
    require_aligned(into.columnwise_scale_inv, "its column-wise scale_inv", call);
  const QuantizedTensorInfo info = quantized_tensor_info(into.shape, into.scales, columnwise);
  const auto bytes = [&](std::int64_t entries) {
    return static_cast<std::size_t>(entries) * info.scale_entry_bytes;
  };
  if (nvfp4) {
    require_aligned(into.tensor_scale, "its tensor_scale", call);
    if (columnwise)
      require_aligned(into.columnwise_tensor_scale, "its columnwise_tensor_scale", call);
  }
  if (into.scale_inv_bytes < bytes(info.scale_inv_entries) ||
      (columnwise && blocks &&
       into.columnwise_scale_inv_bytes < bytes(info.columnwise_scale_inv_entries))) {
    throw UsageError(
        fmt::format("{}: a scale_inv buffer is smaller than the {} layout needs ({} "
                    "and {} bytes)",
                    call, scale_layout_name(into.scales), bytes(info.scale_inv_entries),
                    columnwise && blocks ? bytes(info.columnwise_scale_inv_entries) : 0));
  }
  const bool power_of_2 = options.power_of_2_scale.value_or(blocks);
  const std::string recipe =
      into.scales == ScaleLayout::Mxfp8 ? std::string("mxfp8_block_scaling()")
      : nvfp4 ? fmt::format("nvfp4_block_scaling(rht = {})", options.hadamard)
      // 2-D inputs with 1-D weights: the recipe must run its (unused) GEMMs' layouts.
      : blocks
          ? fmt::format(
                "float8_block_scaling(x_block = {}, w_block = {}, power_of_2_scale = "
                "{}, amax_epsilon = {:.17g})",
                into.scales == ScaleLayout::Block128x128 ? 2 : 1,
                into.scales == ScaleLayout::Block128x128 ? 1 : 2, power_of_2, options.amax_epsilon)
          : fmt::format(
                "current_scaling(format = e4m3, power_of_2_scale = {}, amax_epsilon = "
                "{:.17g})",
                power_of_2, options.amax_epsilon);
  const std::string source = fmt::format(
      "recipe r = {}\n"
      "sequence quantize(x: bf16[rows, {}]) -> (h: {}[rows, {}] quantized(rowwise, columnwise))"
      " uses r {{\n  quantize()\n}}\n",
      recipe, cols, nvfp4 ? "e2m1" : "e4m3", cols);
  // One program per source for the process (compiled once; never destroyed, as the modules
  // above), a session per call: a session must not outlive the stream it allocated on, and the
  // caller's stream may be gone after the call. Its memory is freed in stream order after the
  // copies below.
  static std::mutex mutex;
  static auto& programs = *new std::map<std::string, Program>;
  const Program* program = nullptr;
  {
    const std::lock_guard lock(mutex);
    auto found = programs.find(source);
    if (found == programs.end())
      found = programs.emplace(source, Program::compile(source, "quantize.fuse")).first;
    program = &found->second;
  }
  const auto session = std::make_unique<Session>(*program, "quantize", stream);
  session->bind({{"rows", rows}});
  session->set_tensor("x", input);
  session->forward(stream, columnwise ? RunMode::Training : RunMode::Inference);
  const QuantizedTensorView made = session->quantized_output("h");
  const auto copy = [&](void* to, const void* from, std::size_t n, const char* what) {
    OPFUSE_CUDA_CHECK(cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToDevice, stream), what);
  };
  const std::size_t elements = info.rowwise_bytes;
  copy(into.rowwise, made.rowwise, elements, "quantize(): the row-wise copy");
  copy(into.scale_inv, made.scale_inv, bytes(info.scale_inv_entries), "quantize(): scale_inv");
  if (nvfp4) {
    copy(into.tensor_scale, made.tensor_scale, sizeof(float), "quantize(): the tensor scale");
    if (columnwise) {
      copy(into.columnwise_tensor_scale, made.columnwise_tensor_scale, sizeof(float),
           "quantize(): the column-wise tensor scale");
    }
  }
  if (columnwise) {
    copy(into.columnwise, made.columnwise, elements, "quantize(): the column-wise copy");
    if (blocks) {
      copy(into.columnwise_scale_inv, made.columnwise_scale_inv,
           bytes(info.columnwise_scale_inv_entries), "quantize(): the column-wise scale_inv");
    }
  }
}

}  // namespace opfuse
