// `opfuse._opfuse.Session`: one sequence on the GPU (opfuse::Session) with tensors in and out
// through DLPack. Arrays given to set_tensor() are checked against tensors() (device, dtype,
// shape, row-major strides) before the runtime sees their pointer, and kept alive while the
// session may read them; outputs and gradients are views of the session's memory, valid as the
// C++ API says (docs/python.md).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <utility>

#include "bindings.h"
#include "native_session.h"

namespace opfuse::python {

namespace {

// ---- the C interface opfuse._opfuse_torch calls (native_session.h) ----------------------------

thread_local std::string native_message;

template <typename Call>
NativeStatus native_call(Call&& call) noexcept {
  try {
    call();
    return NativeStatus::Ok;
  } catch (const UsageError& e) {
    native_message = e.what();
    return NativeStatus::Usage;
  } catch (const CudaError& e) {
    native_message = e.what();
    return NativeStatus::Cuda;
  } catch (const std::exception& e) {
    native_message = e.what();
    return NativeStatus::Other;
  } catch (...) {
    native_message = "opfuse: an exception of an unknown type";
    return NativeStatus::Other;
  }
}

Session& native(void* session) { return *static_cast<Session*>(session); }

const NativeSessionApi kNativeApi = {
    kNativeSessionVersion,
    [](void* s, const char* name, const void* ptr) {
      return native_call([&] { native(s).set_tensor(name, ptr); });
    },
    [](void* s) { return native_call([&] { native(s).parameters_changed(); }); },
    [](void* s, void* stream, std::int32_t training) {
      return native_call([&] {
        native(s).forward(static_cast<cudaStream_t>(stream),
                          training != 0 ? RunMode::Training : RunMode::Inference);
      });
    },
    [](void* s, void* stream) {
      return native_call([&] { native(s).backward(static_cast<cudaStream_t>(stream)); });
    },
    [](void* s, std::int32_t kind, const char* name, const void** address) {
      return native_call([&] {
        *address = kind == kNativeOutput      ? native(s).output(name)
                   : kind == kNativeInputGrad ? native(s).input_grad(name)
                                              : native(s).param_grad(name);
      });
    },
    [] { return native_message.c_str(); },
};

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// Row-major and dense: the layout every tensor of a session has (sizes-1 dimensions may carry
// any stride).
bool is_row_major(const InputArray& array) {
  std::int64_t expected = 1;
  for (std::size_t i = array.ndim(); i-- > 0;) {
    if (array.shape(i) != 1 && array.stride(i) != expected) return false;
    expected *= static_cast<std::int64_t>(array.shape(i));
  }
  return true;
}

const char* device_name(int device_type) {
  switch (device_type) {
    case nb::device::cpu::value:
      return "host (CPU) memory";
    case nb::device::cuda::value:
      return "CUDA device memory";
    case nb::device::cuda_host::value:
      return "pinned host memory";
    case nb::device::cuda_managed::value:
      return "CUDA managed memory";
    default:
      return "a device opfuse does not run on";
  }
}

class PySession {
 public:
  PySession(const PyProgram& program, const std::string& sequence,
            const std::map<std::string, std::int64_t>& sizes, nb::handle stream,
            const SessionOptions& options)
      : session_(program.program, sequence, stream_from(stream), options) {
    session_.bind(sizes);
    tensors_ = session_.tensors();
    cudaGetDevice(&device_);
  }
  // native_ points into this object.
  PySession(const PySession&) = delete;
  PySession& operator=(const PySession&) = delete;

  Session& get() { return session_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const NativeSession* native_session() const { return &native_; }

  void bind(const std::map<std::string, std::int64_t>& sizes) {
    session_.bind(sizes);
    tensors_ = session_.tensors();
  }

  const TensorInfo& info(std::string_view name, std::initializer_list<TensorKind> kinds,
                         std::string_view call) const {
    for (TensorKind kind : kinds)
      for (const TensorInfo& t : tensors_)
        if (t.name == name && t.kind == kind) return t;
    std::vector<std::string> names;
    for (const TensorInfo& t : tensors_)
      for (TensorKind kind : kinds)
        if (t.kind == kind) names.push_back(t.name);
    throw UsageError(fmt::format("{}('{}'): sequence '{}' has no such tensor; it has: {}", call,
                                 name, session_.sequence(), fmt::join(names, ", ")));
  }

  void set_tensor(const std::string& name, const InputArray& array) {
    const TensorInfo& t =
        info(name, {TensorKind::Input, TensorKind::Param, TensorKind::OutputGrad}, "set_tensor");
    const std::string where = fmt::format("set_tensor('{}')", name);
    if (array.device_type() != nb::device::cuda::value &&
        array.device_type() != nb::device::cuda_managed::value) {
      throw UsageError(fmt::format(
          "{}: the array is in {}; a GPU session takes CUDA arrays (torch, cupy, jax on the "
          "GPU). NumPy arrays run on the CPU reference: program.session(..., device='cpu')",
          where, device_name(array.device_type())));
    }
    if (array.device_type() == nb::device::cuda::value && array.device_id() != device_) {
      throw UsageError(fmt::format("{}: the array is on CUDA device {}, the session on device {}",
                                   where, array.device_id(), device_));
    }
    check_layout(array, t, dlpack_dtype(t.dtype), where);
    session_.set_tensor(name, array.data());
    kept_[std::string(tensor_kind_name(t.kind)) + ":" + name] = array;  // alive while read
  }

  // Note "Quantized boundaries" (docs/python.md, "Quantized tensors"): a quantized input from
  // arrays (codes as any 8-bit dtype; scales float32, or one byte each under the micro layouts;
  // NVFP4's tensor scales float32), checked against quantized_tensors() and then as
  // Session::set_tensor checks a view; the arrays are kept alive while read.
  void set_quantized(const std::string& name, const InputArray& rowwise,
                     const InputArray& scale_inv, std::optional<InputArray> columnwise,
                     std::optional<InputArray> columnwise_scale_inv,
                     std::optional<std::string> format, std::optional<std::string> scales,
                     std::optional<std::vector<std::int64_t>> shape,
                     std::optional<InputArray> tensor_scale,
                     std::optional<InputArray> columnwise_tensor_scale) {
    const QuantizedTensorInfo info = quantized_info(name, TensorKind::Input, "set_quantized");
    const std::string where = fmt::format("set_quantized('{}')", name);
    // A producer's quantized_output() dict carries these: they must be the input's.
    if ((format && *format != tensor_dtype_name(info.format)) ||
        (scales && *scales != scale_layout_name(info.scales)) || (shape && *shape != info.shape)) {
      throw UsageError(fmt::format(
          "{}: the tensor is {} with {} scales, shape {}; the input is {} "
          "with {} scales, shape {}",
          where, format.value_or("?"), scales.value_or("?"),
          shape_text(shape.value_or(std::vector<std::int64_t>{})), tensor_dtype_name(info.format),
          scale_layout_name(info.scales), shape_text(info.shape)));
    }
    QuantizedTensorView view;
    view.format = info.format;
    view.scales = info.scales;
    view.shape = info.shape;
    const bool nvfp4 = info.scales == ScaleLayout::Nvfp4;
    auto on_device = [&](const InputArray& a, const char* what) {
      if (a.device_type() != nb::device::cuda::value || a.device_id() != device_)
        throw UsageError(
            fmt::format("{}: the {} is not on this session's CUDA device", where, what));
    };
    auto codes = [&](const InputArray& a, const char* what) {
      if (a.dtype().bits != 8 || a.dtype().lanes != 1 || !is_row_major(a)) {
        throw UsageError(
            fmt::format("{}: the {} copy must be a dense row-major array of 8-bit "
                        "codes (uint8 or a float8 dtype)",
                        where, what));
      }
      if (a.device_type() != nb::device::cuda::value || a.device_id() != device_)
        throw UsageError(
            fmt::format("{}: the {} copy is not on this session's CUDA device", where, what));
      return a.data();
    };
    // FP32 entries (tensor and block layouts), or one byte each (MXFP8's E8M0 and NVFP4's E4M3
    // block scales, any 8-bit dtype): as quantized_tensors() says.
    auto scale_array = [&](const InputArray& a, const char* what, std::size_t* bytes) {
      const bool fits = info.scale_entry_bytes == 4 ? a.dtype() == nb::dtype<float>()
                                                    : a.dtype().bits == 8 && a.dtype().lanes == 1;
      if (!fits || !is_row_major(a)) {
        throw UsageError(fmt::format("{}: the {} must be a dense {} array", where, what,
                                     info.scale_entry_bytes == 4 ? "float32" : "8-bit"));
      }
      on_device(a, what);
      *bytes = a.size() * info.scale_entry_bytes;
      return a.data();
    };
    // NVFP4's S_enc of a copy: one float32 value (the runtime refuses it under other layouts).
    auto scalar = [&](const InputArray& a, const char* what) {
      if (a.dtype() != nb::dtype<float>() || a.size() != 1)
        throw UsageError(
            fmt::format("{}: the {} must be a float32 array of one element", where, what));
      on_device(a, what);
      return static_cast<const float*>(a.data());
    };
    // NVFP4 packs two codes per byte: its copies are arrays of rowwise_bytes elements, of any
    // shape; the FP8 copies have the tensor's shape (the column-wise one is checked by size).
    if (nvfp4 ? rowwise.size() != info.rowwise_bytes : array_shape(rowwise) != info.shape) {
      throw UsageError(
          nvfp4 ? fmt::format("{}: the row-wise copy is {} bytes (two codes per byte), the array "
                              "holds {} elements",
                              where, info.rowwise_bytes, rowwise.size())
                : fmt::format("{}: the tensor is {}, the array {}", where, shape_text(info.shape),
                              shape_text(array_shape(rowwise))));
    }
    view.rowwise = codes(rowwise, "row-wise");
    view.scale_inv = scale_array(scale_inv, "scale_inv", &view.scale_inv_bytes);
    if (columnwise) {
      if (columnwise->size() != rowwise.size())
        throw UsageError(fmt::format("{}: the column-wise copy holds {} codes, the tensor {}",
                                     where, columnwise->size(), rowwise.size()));
      view.columnwise = codes(*columnwise, "column-wise");
    }
    if (columnwise_scale_inv) {
      view.columnwise_scale_inv = scale_array(*columnwise_scale_inv, "columnwise_scale_inv",
                                              &view.columnwise_scale_inv_bytes);
    }
    if (tensor_scale) view.tensor_scale = scalar(*tensor_scale, "tensor_scale");
    if (columnwise_tensor_scale) {
      view.columnwise_tensor_scale = scalar(*columnwise_tensor_scale, "columnwise_tensor_scale");
    }
    session_.set_tensor(name, view);
    kept_["quantized:" + name] = rowwise;
    kept_["quantized_scale:" + name] = scale_inv;
    if (columnwise) kept_["quantized_columnwise:" + name] = *columnwise;
    if (columnwise_scale_inv) kept_["quantized_columnwise_scale:" + name] = *columnwise_scale_inv;
    if (tensor_scale) kept_["quantized_tensor_scale:" + name] = *tensor_scale;
    if (columnwise_tensor_scale)
      kept_["quantized_columnwise_tensor_scale:" + name] = *columnwise_tensor_scale;
  }

  QuantizedTensorInfo quantized_info(std::string_view name, TensorKind kind,
                                     std::string_view call) const {
    std::vector<std::string> names;
    for (const QuantizedTensorInfo& info : session_.quantized_tensors()) {
      if (info.kind != kind) continue;
      if (info.name == name) return info;
      names.push_back(info.name);
    }
    throw UsageError(
        fmt::format("{}('{}'): sequence '{}' has no quantized {} of that name; it "
                    "has: [{}]",
                    call, name, session_.sequence(), kind == TensorKind::Input ? "input" : "output",
                    fmt::join(names, ", ")));
  }

  // An output's copies and scales as DLPack views (None where absent), in a dict whose keys are
  // set_quantized()'s arguments.
  nb::dict quantized_output(const std::string& name) const {
    const QuantizedTensorInfo info = quantized_info(name, TensorKind::Output, "quantized_output");
    const QuantizedTensorView v = session_.quantized_output(name);
    nb::dict d;
    const auto array = [&](const void* data, std::vector<std::size_t> shape,
                           nb::dlpack::dtype dtype) -> nb::object {
      if (data == nullptr) return nb::none();
      return nb::cast(nb::ndarray<nb::array_api>(const_cast<void*>(data), shape.size(),
                                                 shape.data(), nb::handle(), nullptr, dtype,
                                                 nb::device::cuda::value, device_),
                      nb::rv_policy::reference);  // no owner: valid until the next forward
    };
    const auto rows = static_cast<std::size_t>(info.rows);
    const auto cols = static_cast<std::size_t>(info.cols);
    const nb::dlpack::dtype u8 = nb::dtype<std::uint8_t>(), f32 = nb::dtype<float>();
    // The codes: the tensor's shape (column-wise [cols, rows], MXFP8's [rows, cols]); NVFP4's,
    // two per byte, as bytes.
    std::vector<std::size_t> row_shape(info.shape.begin(), info.shape.end());
    std::vector<std::size_t> col_shape = {cols, rows};
    if (info.scales == ScaleLayout::Mxfp8) col_shape = {rows, cols};
    if (info.scales == ScaleLayout::Nvfp4) {
      row_shape = {info.rowwise_bytes};
      col_shape = {info.columnwise_bytes};
    }
    // The scales: FP32 entries, or one byte each under the micro layouts.
    const bool bytes = info.scale_entry_bytes == 1;
    const auto grid = [&](const void* data, std::size_t size) {
      return array(data, {bytes ? size : size / sizeof(float)}, bytes ? u8 : f32);
    };
    d["format"] = std::string(tensor_dtype_name(info.format));
    d["scales"] = std::string(scale_layout_name(info.scales));
    d["shape"] = info.shape;
    d["rowwise"] = array(v.rowwise, row_shape, u8);
    d["columnwise"] = array(v.columnwise, col_shape, u8);
    d["scale_inv"] = grid(v.scale_inv, v.scale_inv_bytes);
    d["columnwise_scale_inv"] =
        grid(info.scales == ScaleLayout::Tensor ? nullptr : v.columnwise_scale_inv,
             v.columnwise_scale_inv_bytes);
    d["tensor_scale"] = array(v.tensor_scale, {1}, f32);
    d["columnwise_tensor_scale"] = array(v.columnwise_tensor_scale, {1}, f32);
    return d;
  }

  // A view of session memory (an output, a gradient, an owned parameter) as a DLPack array: an
  // object with __dlpack__ and __dlpack_device__ (nb::array_api), which every consumer of the
  // protocol takes (jax.dlpack.from_dlpack takes nothing else; a bare capsule is refused).
  nb::ndarray<nb::array_api> view(const void* data, const TensorInfo& t) const {
    std::vector<std::size_t> shape(t.shape.begin(), t.shape.end());
    return nb::ndarray<nb::array_api>(const_cast<void*>(data), shape.size(), shape.data(),
                                      nb::handle(), nullptr, dlpack_dtype(t.dtype),
                                      nb::device::cuda::value, device_);
  }

 private:
  Session session_;
  std::vector<TensorInfo> tensors_;
  int device_ = 0;
  std::map<std::string, InputArray> kept_;
  NativeSession native_{&kNativeApi, &session_};
};

}  // namespace

std::vector<std::int64_t> array_shape(const InputArray& array) {
  std::vector<std::int64_t> shape;
  for (std::size_t i = 0; i < array.ndim(); ++i)
    shape.push_back(static_cast<std::int64_t>(array.shape(i)));
  return shape;
}

void check_layout(const InputArray& array, const TensorInfo& info, nb::dlpack::dtype dtype,
                  const std::string& where) {
  const std::vector<std::int64_t> shape = array_shape(array);
  if (shape != info.shape) {
    throw UsageError(fmt::format("{}: the {} '{}' has shape {}, the array has shape {}", where,
                                 tensor_kind_name(info.kind), info.name, shape_text(info.shape),
                                 shape_text(shape)));
  }
  if (array.dtype() != dtype) {
    throw UsageError(fmt::format("{}: the {} '{}' is {} ({}), the array is {}", where,
                                 tensor_kind_name(info.kind), info.name,
                                 tensor_dtype_name(info.dtype), dlpack_dtype_name(dtype),
                                 dlpack_dtype_name(array.dtype())));
  }
  if (!is_row_major(array)) {
    throw UsageError(fmt::format(
        "{}: the array for '{}' is not dense and row-major (strides of a transposed view or a "
        "slice); pass a contiguous copy (.contiguous() in torch, numpy.ascontiguousarray)",
        where, info.name));
  }
}

void bind_session(nb::module_& m) {
  nb::class_<DebugSessionOptions>(m, "DebugSessionOptions",
                                  "Where a session of a program with a debug config logs "
                                  "(docs/debugging.md).")
      .def(nb::init<>())
      .def_rw("log_dir", &DebugSessionOptions::log_dir, "empty: no files")
      .def_rw("rank", &DebugSessionOptions::rank)
      .def_rw("precision", &DebugSessionOptions::precision)
      .def_rw("start_iteration", &DebugSessionOptions::start_iteration)
      .def_prop_rw(
          "on_stat", [](const DebugSessionOptions& o) { return o.on_stat != nullptr; },
          [](DebugSessionOptions& o, const nb::callable& callback) {
            o.on_stat = [callback](const DebugStat& stat) {
              nb::gil_scoped_acquire acquire;
              callback(stat);
            };
          },
          "set: a callable called with each DebugStat of an ended iteration; get: whether set");
  nb::class_<ParallelOptions>(m, "ParallelOptions",
                              "This process's rank of a tensor-parallel sequence "
                              "(docs/parallel.md).")
      .def(nb::init<>())
      .def_rw("rank", &ParallelOptions::rank)
      .def_rw("size", &ParallelOptions::size)
      .def_rw("nccl_id", &ParallelOptions::nccl_id)
      .def_rw("bootstrap_dir", &ParallelOptions::bootstrap_dir)
      .def_rw("job", &ParallelOptions::job)
      .def_rw("timeout_s", &ParallelOptions::timeout_s)
      .def_static("from_environment", &ParallelOptions::from_environment,
                  "What `fusec run --nproc N` sets (OPFUSE_RANK, OPFUSE_WORLD_SIZE, ...).");
  m.def("new_parallel_id", &new_parallel_id, "A new NCCL unique id for ParallelOptions.nccl_id.");
  nb::class_<SessionOptions>(m, "SessionOptions", "How a GPU session runs (docs/embedding.md).")
      .def(nb::init<>())
      .def_rw("gemm_autotune", &SessionOptions::gemm_autotune)
      .def_rw("auto_graph", &SessionOptions::auto_graph)
      .def_rw("fused_epilogues", &SessionOptions::fused_epilogues)
      .def_rw("fused_training_epilogues", &SessionOptions::fused_training_epilogues)
      .def_rw("block_summaries", &SessionOptions::block_summaries)
      .def_rw("debug", &SessionOptions::debug)
      .def_rw("parallel", &SessionOptions::parallel)
      .def_rw("amax_group", &SessionOptions::amax_group);

  nb::enum_<Session::GraphScope>(m, "GraphScope")
      .value("INFERENCE_FORWARD", Session::GraphScope::InferenceForward)
      .value("TRAINING_STEP", Session::GraphScope::TrainingStep);

  const auto stream_arg = nb::arg("stream").none() = nb::none();
  nb::class_<PySession>(
      m, "Session",
      "One sequence of a program on the current CUDA device, bound to its sizes.\n\n"
      "Made by Program.session(device='cuda'). Tensors go in through set_tensor() (any DLPack "
      "CUDA array, no copy) and come out as DLPack views of the session's memory "
      "(torch.from_dlpack). `stream` arguments take None (the legacy default stream), an int "
      "(a cudaStream_t) or a stream object (torch.cuda.Stream, cupy). Misuse raises UsageError "
      "before anything is enqueued.")
      .def(
          nb::init<const PyProgram&, const std::string&, const std::map<std::string, std::int64_t>&,
                   nb::handle, const SessionOptions&>(),
          nb::arg("program"), nb::arg("sequence"), nb::arg("sizes"), nb::arg("stream").none(),
          nb::arg("options"))
      .def_prop_ro("sequence", [](PySession& s) { return s.get().sequence(); })
      .def_prop_ro("device", [](PySession&) { return std::string("cuda"); })
      .def("bind", &PySession::bind, nb::arg("sizes"),
           "Binds every symbolic size again ({'tokens': 4096}); tensors() changes with it.")
      .def("tensors", &PySession::tensors, "Every tensor of the interface under the sizes.")
      .def(
          "own_parameters",
          [](PySession& s, std::uint64_t seed, nb::handle stream) {
            s.get().own_parameters(seed, stream_from(stream));
          },
          nb::arg("seed") = 0, stream_arg,
          "Allocates and fills every parameter as `fusec run` does from `seed` (linear weights "
          "~ N(0, 0.02), norm weights 1, biases 0); the session owns them.")
      .def(
          "allocate_parameters",
          [](PySession& s, nb::handle stream) { s.get().allocate_parameters(stream_from(stream)); },
          stream_arg, "Allocates every parameter zero-filled (to load() into).")
      .def(
          "parameter",
          [](PySession& s, const std::string& name) {
            return s.view(s.get().parameter(name), s.info(name, {TensorKind::Param}, "parameter"));
          },
          nb::arg("name"), nb::rv_policy::reference_internal,
          nb::sig("def parameter(self, name: str) -> opfuse._dlpack.SupportsDLPack"),
          "A view of an owned parameter (UsageError unless owned).")
      .def("set_tensor", &PySession::set_tensor, nb::arg("name"), nb::arg("array"),
           nb::sig("def set_tensor(self, name: str, array: opfuse._dlpack.SupportsDLPack) -> None"),
           "Gives an input, parameter or output gradient: a dense row-major CUDA array of its "
           "dtype and shape, read in place (kept alive by the session).")
      .def(
          "quantized_tensors",
          [](PySession& s) {
            nb::list out;
            for (const QuantizedTensorInfo& i : s.get().quantized_tensors()) {
              nb::dict d;
              d["name"] = i.name;
              d["kind"] = std::string(tensor_kind_name(i.kind));
              d["format"] = std::string(tensor_dtype_name(i.format));
              d["scales"] = std::string(scale_layout_name(i.scales));
              d["shape"] = i.shape;
              d["rows"] = i.rows;
              d["cols"] = i.cols;
              d["rowwise"] = i.rowwise;
              d["columnwise"] = i.columnwise;
              d["rowwise_bytes"] = i.rowwise_bytes;
              d["columnwise_bytes"] = i.columnwise_bytes;
              d["scale_inv_entries"] = i.scale_inv_entries;
              d["columnwise_scale_inv_entries"] = i.columnwise_scale_inv_entries;
              d["scale_grid"] = std::vector<std::int64_t>{i.scale_grid[0], i.scale_grid[1]};
              d["columnwise_scale_grid"] =
                  std::vector<std::int64_t>{i.columnwise_scale_grid[0], i.columnwise_scale_grid[1]};
              d["scale_entry_bytes"] = i.scale_entry_bytes;
              d["tensor_scales"] = i.tensor_scales;
              d["hadamard"] = i.hadamard;
              out.append(d);
            }
            return out;
          },
          "The quantized inputs and outputs under the sizes, one dict each (docs/python.md).")
      .def("set_quantized", &PySession::set_quantized, nb::arg("name"), nb::arg("rowwise"),
           nb::arg("scale_inv"), nb::arg("columnwise").none() = nb::none(),
           nb::arg("columnwise_scale_inv").none() = nb::none(),
           nb::arg("format").none() = nb::none(), nb::arg("scales").none() = nb::none(),
           nb::arg("shape").none() = nb::none(), nb::arg("tensor_scale").none() = nb::none(),
           nb::arg("columnwise_tensor_scale").none() = nb::none(),
           "Gives a quantized input: its row-wise codes (8-bit CUDA array of the input's shape; "
           "nvfp4_1x16: of rowwise_bytes elements, two codes per byte), its scale_inv (float32: "
           "one value, or the row-wise grid; mxfp8_1x32 and nvfp4_1x16: an 8-bit array, one byte "
           "per scale), for backward the column-wise codes and, under block and micro scales, "
           "their grid, and under nvfp4_1x16 each copy's tensor_scale (float32, one element). "
           "Another session's quantized_output() dict passes as set_quantized(name, **d) (its "
           "format, scales and shape are checked against the input's).")
      .def("quantized_output", &PySession::quantized_output, nb::arg("name"),
           nb::rv_policy::reference_internal,
           "A quantized output: {'format', 'scales', 'shape', 'rowwise', 'columnwise', "
           "'scale_inv', 'columnwise_scale_inv', 'tensor_scale', 'columnwise_tensor_scale'}, the "
           "arrays DLPack views of the session's memory (valid until the next forward; "
           "column-wise ones None after an inference forward; tensor scales None but under "
           "nvfp4_1x16).")
      .def(
          "parameters_changed", [](PySession& s) { s.get().parameters_changed(); },
          "The parameters' contents changed (an optimizer step): recast the FP8 weight copies.")
      .def(
          "forward",
          [](PySession& s, nb::handle stream, RunMode mode) {
            cudaStream_t cuda_stream = stream_from(stream);
            nb::gil_scoped_release release;
            s.get().forward(cuda_stream, mode);
          },
          stream_arg, nb::arg("mode") = RunMode::Training, "Enqueues the forward on `stream`.")
      .def(
          "backward",
          [](PySession& s, nb::handle stream) {
            cudaStream_t cuda_stream = stream_from(stream);
            nb::gil_scoped_release release;
            s.get().backward(cuda_stream);
          },
          stream_arg, "Enqueues the backward of the last training forward.")
      .def(
          "step",
          [](PySession& s, nb::handle stream) {
            cudaStream_t cuda_stream = stream_from(stream);
            nb::gil_scoped_release release;
            s.get().step(cuda_stream);
          },
          stream_arg, "Ends a training step: every quantizer updated in one launch.")
      .def(
          "_native",
          [](const PySession& s) { return reinterpret_cast<std::uintptr_t>(s.native_session()); },
          "The address of this session's C interface (python/src/native_session.h) for "
          "opfuse._opfuse_torch; valid while this object lives. Not part of the API.")
      .def(
          "_address",
          [](PySession& s, const std::string& what, const std::string& name) {
            const void* data = nullptr;
            if (what == "output") {
              data = s.get().output(name);
            } else if (what == "input_grad") {
              data = s.get().input_grad(name);
            } else if (what == "param_grad") {
              data = s.get().param_grad(name);
            } else {
              throw UsageError(
                  fmt::format("_address: '{}' is not output, input_grad or param_grad", what));
            }
            return reinterpret_cast<std::uintptr_t>(data);
          },
          nb::arg("what"), nb::arg("name"),
          "The device address output(name), input_grad(name) or param_grad(name) would view "
          "(for opfuse.torch, which keeps one torch view per address instead of a DLPack "
          "exchange per call).")
      .def(
          "output",
          [](PySession& s, const std::string& name) {
            return s.view(s.get().output(name), s.info(name, {TensorKind::Output}, "output"));
          },
          nb::arg("name"), nb::rv_policy::reference_internal,
          nb::sig("def output(self, name: str) -> opfuse._dlpack.SupportsDLPack"),
          "A view of an output, valid until the next forward.")
      .def(
          "input_grad",
          [](PySession& s, const std::string& name) {
            return s.view(s.get().input_grad(name),
                          s.info(name, {TensorKind::InputGrad}, "input_grad"));
          },
          nb::arg("name"), nb::rv_policy::reference_internal,
          nb::sig("def input_grad(self, name: str) -> opfuse._dlpack.SupportsDLPack"),
          "A view of an input's gradient, valid until the next forward or backward.")
      .def(
          "param_grad",
          [](PySession& s, const std::string& name) {
            return s.view(s.get().param_grad(name),
                          s.info(name, {TensorKind::ParamGrad}, "param_grad"));
          },
          nb::arg("name"), nb::rv_policy::reference_internal,
          nb::sig("def param_grad(self, name: str) -> opfuse._dlpack.SupportsDLPack"),
          "A view of a parameter's gradient, valid until the next forward or backward.")
      .def(
          "save",
          [](PySession& s, const std::string& path, nb::handle stream, StateParts parts) {
            cudaStream_t cuda_stream = stream_from(stream);
            nb::gil_scoped_release release;
            s.get().save(path, cuda_stream, parts);
          },
          nb::arg("path"), stream_arg, nb::arg("parts") = StateParts::All,
          "Parameters and quantizer state (or with StateParts.QUANTIZERS the quantizer state "
          "alone) to a checksummed file (docs/state_files.md).")
      .def(
          "load",
          [](PySession& s, const std::string& path, nb::handle stream, StateParts parts) {
            cudaStream_t cuda_stream = stream_from(stream);
            nb::gil_scoped_release release;
            s.get().load(path, cuda_stream, parts);
          },
          nb::arg("path"), stream_arg, nb::arg("parts") = StateParts::All,
          "Reads and verifies a file, checks it against the sequence, then copies (with "
          "StateParts.QUANTIZERS only the quantizer state and step count).")
      .def(
          "capture",
          [](PySession& s, nb::handle stream, Session::GraphScope scope) {
            s.get().capture(stream_from(stream), scope);
          },
          nb::arg("stream"), nb::arg("scope") = Session::GraphScope::TrainingStep,
          "Records one training step or inference forward into a CUDA graph (not on the legacy "
          "default stream).")
      .def(
          "replay", [](PySession& s, nb::handle stream) { s.get().replay(stream_from(stream)); },
          nb::arg("stream"), "Launches the recording.")
      .def(
          "release_graph", [](PySession& s) { s.get().release_graph(); }, "Back to eager calls.")
      .def_prop_ro("has_graph", [](PySession& s) { return s.get().has_graph(); })
      .def(
          "quantizers",
          [](PySession& s, nb::handle stream) { return s.get().quantizers(stream_from(stream)); },
          stream_arg, "Every per-tensor quantizer, copied to the host after `stream`.")
      .def(
          "block_summaries",
          [](PySession& s, nb::handle stream) {
            return s.get().block_summaries(stream_from(stream));
          },
          stream_arg, "Every block-scaled copy (SessionOptions.block_summaries).")
      .def(
          "memory", [](PySession& s) { return s.get().memory(); }, "Device memory, in bytes.")
      .def("reset_peak_memory", [](PySession& s) { s.get().reset_peak_memory(); })
      .def(
          "flush_debug_stats", [](PySession& s) { s.get().flush_debug_stats(); },
          "Logs the statistics of every ended debug iteration.")
      .def_prop_ro(
          "debug_iteration", [](PySession& s) { return s.get().debug_iteration(); },
          "the debug iteration the next forward belongs to");
}

}  // namespace opfuse::python
