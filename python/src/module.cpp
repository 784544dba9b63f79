// `opfuse._opfuse`: the exceptions of opfuse/error.h as Python classes, the API's value types,
// and the module entry point (bindings.h lists the files that add the rest).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <exception>

#include "api/state_file.h"
#include "bindings.h"
#include "jit/nvrtc_compiler.h"
#include "opfuse/version.h"
#include "reference/cpu_tensor.h"

namespace opfuse::python {

namespace {

// The Python class of opfuse::UsageError, for the CPU reference's run-time user errors.
PyObject* usage_error_type = nullptr;

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

cudaStream_t stream_from(nb::handle stream) {
  if (stream.is_none()) return nullptr;
  nb::object handle = nb::borrow(stream);
  if (nb::hasattr(stream, "__cuda_stream__")) {
    // The CUDA stream protocol: (version, address).
    nb::tuple pair = nb::cast<nb::tuple>(stream.attr("__cuda_stream__")());
    handle = pair[1];
  } else if (nb::hasattr(stream, "cuda_stream")) {
    handle = stream.attr("cuda_stream");
  }
  if (!nb::isinstance<nb::int_>(handle)) {
    throw nb::type_error(
        "stream: expected None, an int (a cudaStream_t) or a stream object with `cuda_stream` "
        "or `__cuda_stream__` (torch.cuda.Stream, cupy.cuda.Stream)");
  }
  // NOLINTNEXTLINE(performance-no-int-to-ptr): a CUDA stream handle travels as an integer.
  return reinterpret_cast<cudaStream_t>(nb::cast<std::uintptr_t>(handle));
}

nb::dlpack::dtype dlpack_dtype(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::BF16:
      return nb::dlpack::dtype{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case TensorDType::FP16:
      return nb::dlpack::dtype{static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case TensorDType::FP32:
      return nb::dtype<float>();
    case TensorDType::E4M3:
    case TensorDType::E5M2:
    case TensorDType::E2M1:
    case TensorDType::E8M0:
      break;
  }
  // No tensor of a session's interface is FP8 (program.h); raw bytes if one ever is.
  return nb::dtype<std::uint8_t>();
}

std::string dlpack_dtype_name(nb::dlpack::dtype dtype) {
  const char* kind = "unknown";
  switch (static_cast<nb::dlpack::dtype_code>(dtype.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      kind = "bool";
      break;
    default:
      kind = "float8_";  // the FP8 codes of DLPack 1.x
      break;
  }
  return fmt::format("{}{}", kind, dtype.bits);
}

void bind_errors(nb::module_& m) {
  // Registered base first: nanobind tries the latest translator first, so a derived class is
  // raised as itself.
  static nb::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static nb::exception<UsageError> usage(m, "UsageError", error);
  static nb::exception<CompileError> compile(m, "CompileError", error);
  static nb::exception<CudaError> cuda(m, "CudaError", error);
  static nb::exception<ContextFaultError> fault(m, "ContextFaultError", cuda);
  static nb::exception<jit::JitError> jit_error(m, "JitError", error);
  static nb::exception<api::StateFileError> state_file(m, "StateFileError", error);
  usage_error_type = usage.ptr();
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const cpu::ReferenceError& e) {
      PyErr_SetString(usage_error_type, e.what());
    }
  });
}

void bind_types(nb::module_& m) {
  nb::enum_<TensorDType>(m, "TensorDType", "The dtype of a tensor or of a quantizer's format.")
      .value("BF16", TensorDType::BF16)
      .value("FP16", TensorDType::FP16)
      .value("FP32", TensorDType::FP32)
      .value("E4M3", TensorDType::E4M3)
      .value("E5M2", TensorDType::E5M2)
      .value("E2M1", TensorDType::E2M1)
      .value("E8M0", TensorDType::E8M0);
  nb::enum_<TensorKind>(m, "TensorKind", "What a tensor of a sequence's interface is.")
      .value("INPUT", TensorKind::Input, "given by the caller (set_tensor)")
      .value("PARAM", TensorKind::Param, "given by the caller or owned by the session")
      .value("OUTPUT_GRAD", TensorKind::OutputGrad, "an output's gradient, given to backward")
      .value("OUTPUT", TensorKind::Output, "written by forward")
      .value("INPUT_GRAD", TensorKind::InputGrad, "written by backward")
      .value("PARAM_GRAD", TensorKind::ParamGrad, "written by backward");
  nb::enum_<RunMode>(m, "RunMode")
      .value("TRAINING", RunMode::Training, "saves what backward reads")
      .value("INFERENCE", RunMode::Inference, "no transposed copies, no saved activations");
  nb::enum_<StateParts>(m, "StateParts")
      .value("ALL", StateParts::All, "the parameters, the quantizer state and the step count")
      .value("QUANTIZERS", StateParts::Quantizers,
             "the quantizer state and the step count alone (the parameters are left as they are)");

  nb::class_<TensorInfo>(m, "TensorInfo",
                         "A tensor of a sequence's interface under the session's sizes.")
      .def_ro("name", &TensorInfo::name, "as in the .fuse program: 'x', 'fc1.weight', 'dy', 'y'")
      .def_ro("kind", &TensorInfo::kind)
      .def_ro("dtype", &TensorInfo::dtype)
      .def_ro("shape", &TensorInfo::shape, "row-major")
      .def_ro("bytes", &TensorInfo::bytes)
      .def("__repr__", [](const TensorInfo& t) {
        return fmt::format("TensorInfo({} {} {}{})", tensor_kind_name(t.kind), t.name,
                           tensor_dtype_name(t.dtype), shape_text(t.shape));
      });
  nb::class_<QuantizerStatus>(m, "QuantizerStatus", "One per-tensor FP8 quantizer as it is now.")
      .def_ro("name", &QuantizerStatus::name, "'fc1.input', 'fc1.weight', 'fc1.grad_output'")
      .def_ro("format", &QuantizerStatus::format)
      .def_ro("amax_history", &QuantizerStatus::amax_history,
              "slot 0: the amax of the step in progress")
      .def_ro("scale", &QuantizerStatus::scale, "the scale the step's casts use")
      .def_ro("scale_inv", &QuantizerStatus::scale_inv)
      .def("__repr__", [](const QuantizerStatus& q) {
        return fmt::format("QuantizerStatus({} {} amax {:.6e} scale {:.6e})", q.name,
                           tensor_dtype_name(q.format),
                           q.amax_history.empty() ? 0.0F : q.amax_history[0], q.scale);
      });
  nb::class_<BlockSummaryStatus>(m, "BlockSummaryStatus",
                                 "One block-scaled copy as its latest cast made it.")
      .def_ro("quantizer", &BlockSummaryStatus::quantizer)
      .def_ro("columnwise", &BlockSummaryStatus::columnwise)
      .def_ro("format", &BlockSummaryStatus::format)
      .def_ro("block_rows", &BlockSummaryStatus::block_rows)
      .def_ro("block_cols", &BlockSummaryStatus::block_cols)
      .def_ro("blocks", &BlockSummaryStatus::blocks)
      .def_ro("zero_blocks", &BlockSummaryStatus::zero_blocks)
      .def_ro("scale_inv_min", &BlockSummaryStatus::scale_inv_min)
      .def_ro("scale_inv_max", &BlockSummaryStatus::scale_inv_max)
      .def_ro("has_tensor_scale", &BlockSummaryStatus::has_tensor_scale)
      .def_ro("tensor_scale", &BlockSummaryStatus::tensor_scale);
  nb::class_<MemoryStats>(m, "MemoryStats", "A session's device memory, in bytes.")
      .def_ro("live_bytes", &MemoryStats::live_bytes, "activations and workspaces now")
      .def_ro("peak_bytes", &MemoryStats::peak_bytes, "most at once since reset_peak_memory()")
      .def_ro("reserved_bytes", &MemoryStats::reserved_bytes, "the activations' allocation")
      .def_ro("owned_bytes", &MemoryStats::owned_bytes, "parameters the session owns");
  nb::class_<BuildStats>(m, "BuildStats", "How a program's kernels were compiled.")
      .def_ro("kernels", &BuildStats::kernels)
      .def_ro("cache_hits", &BuildStats::cache_hits)
      .def_ro("compiled", &BuildStats::compiled)
      .def_ro("compile_ms", &BuildStats::compile_ms, "wall time of NVRTC or the cache loads");
  nb::class_<DebugStat>(m, "DebugStat", "One statistic a precision-debug feature logged.")
      .def_ro("layer", &DebugStat::layer)
      .def_ro("tensor", &DebugStat::tensor)
      .def_ro("gemm", &DebugStat::gemm)
      .def_ro("stat", &DebugStat::stat)
      .def_ro("iteration", &DebugStat::iteration)
      .def_ro("value", &DebugStat::value);
}

}  // namespace opfuse::python

NB_MODULE(_opfuse, m) {
  namespace py = opfuse::python;
  m.doc() = "opfuse's compiler and runtime (docs/python.md); import `opfuse`, not this module.";
  py::bind_errors(m);
  py::bind_types(m);
  m.def(
      "gpu_available",
      [] {
        std::string why;
        const bool available = opfuse::gpu_available(&why);
        return std::make_pair(available, why);
      },
      "(True, '') when a CUDA GPU and driver are usable here, else (False, what is missing).");
  m.def(
      "version", [] { return std::string(opfuse::version()); }, "opfuse's version.");
  py::bind_program(m);
  py::bind_session(m);
  py::bind_reference_session(m);
  py::bind_quantized(m);
  py::bind_bench(m);
}
