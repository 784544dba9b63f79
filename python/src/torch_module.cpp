// `opfuse._opfuse_torch`: the per-call work of opfuse.torch.Sequential in C++ (docs/python.md,
// "The torch fast path"). Built when the interpreter that builds the package has torch; the
// module then imports it after torch (opfuse/torch.py) and keeps the pure-Python path otherwise.
//
// A Runner holds what the module checks on every call (the inputs' and output gradients' shapes
// and dtypes, the parameters' dictionaries, the addresses and version counters the session was
// last given) and runs a call with one Python-to-C++ transition: the tensors are unpacked from
// their Python objects, checked, given to the session where they moved, the forward run, its
// outputs copied into new tensors on the current stream; under grad mode through a C++
// torch::autograd::Function whose backward runs the session's backward. A call whose tensors do
// not fit returns None and the module's Python path reports the misuse (one place for the
// messages). The session itself is reached through its C interface (native_session.h): this
// module links torch, not the opfuse runtime.
#include <ATen/ATen.h>
#include <Python.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "native_session.h"

namespace opfuse::python {

namespace nb = nanobind;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// What a call checks of a tensor.
struct Spec {
  std::string name;
  std::vector<std::int64_t> shape;
  at::ScalarType dtype = at::kBFloat16;
};

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "bf16") return at::kBFloat16;
  if (dtype == "fp16") return at::kHalf;
  if (dtype == "fp32") return at::kFloat;
  throw nb::value_error(("opfuse._opfuse_torch: no torch dtype for " + dtype).c_str());
}

Spec make_spec(const std::tuple<std::string, std::vector<std::int64_t>, std::string>& t) {
  return {std::get<0>(t), std::get<1>(t), scalar_type(std::get<2>(t))};
}

// A strong reference to a Python object that may be let go on a thread without the GIL (the
// autograd engine's, when the last node holding a RunnerCore goes): it takes the GIL to do so.
class PyRef {
 public:
  explicit PyRef(nb::handle object) : object_(object.ptr()) { Py_XINCREF(object_); }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  PyRef(PyRef&& other) noexcept : object_(std::exchange(other.object_, nullptr)) {}
  PyRef& operator=(PyRef&&) = delete;
  ~PyRef() {
    if (object_ == nullptr || Py_IsInitialized() == 0) return;
    const PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(object_);
    PyGILState_Release(gil);
  }
  PyObject* ptr() const { return object_; }

 private:
  PyObject* object_ = nullptr;
};

// A parameter's place: the owner module's own `_parameters` dictionary and its key there (read
// on every call: a Parameter assigned anew is seen), and what the session was last given.
struct ParamSlot {
  Spec spec;
  PyRef table;
  PyRef key;
  const void* given = nullptr;
  std::int64_t version = -1;
};

class RunnerCore;

// The session's forward and backward as a node of torch's autograd graph. The node keeps the
// runner's core (and through it the session) alive in its saved data, so the backward of a
// module dropped after its forward still runs.
struct SequenceFunction : public torch::autograd::Function<SequenceFunction> {
  static variable_list forward(AutogradContext* ctx, const c10::intrusive_ptr<RunnerCore>& core,
                               at::TensorList tensors);
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

// Everything a Runner holds, shared with the autograd nodes of its forwards.
class RunnerCore : public torch::CustomClassHolder {
 public:
  RunnerCore(
      nb::object session, std::uintptr_t native, int device,
      const std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::string>>& inputs,
      const std::vector<bool>& input_has_grad,
      const std::vector<
          std::tuple<nb::object, std::string,
                     std::tuple<std::string, std::vector<std::int64_t>, std::string>>>& params,
      const std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::string>>& outputs,
      const std::vector<std::string>& output_grads, nb::object usage_error, nb::object cuda_error,
      nb::object error)
      : session_(session),
        native_(reinterpret_cast<const NativeSession*>(native)),
        device_(device),
        input_has_grad_(input_has_grad),
        output_grad_names_(output_grads),
        usage_error_(usage_error),
        cuda_error_(cuda_error),
        error_(error) {
    if (native_ == nullptr || native_->api->version != kNativeSessionVersion)
      throw nb::value_error("opfuse._opfuse_torch: the session's C interface has another version");
    for (const auto& t : inputs) inputs_.push_back(make_spec(t));
    for (const auto& [table, key, spec] : params)
      params_.push_back({make_spec(spec), PyRef(table), PyRef(nb::str(key.c_str())), nullptr, -1});
    for (const auto& t : outputs) outputs_.push_back(make_spec(t));
    given_inputs_.assign(inputs_.size(), nullptr);
    kept_inputs_.resize(inputs_.size());
    given_grads_.assign(output_grad_names_.size(), nullptr);
    kept_grads_.resize(output_grad_names_.size());
  }

  // The module's forward, or None where a tensor does not fit (the Python path then says why).
  nb::object call(const nb::tuple& args) {
    if (args.size() != inputs_.size()) return nb::none();
    std::vector<at::Tensor> tensors;
    tensors.reserve(inputs_.size() + params_.size());
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      const at::Tensor* t = unpack(args[i].ptr(), inputs_[i]);
      if (t == nullptr) return nb::none();
      tensors.push_back(*t);
    }
    for (ParamSlot& slot : params_) {
      PyObject* p = PyDict_GetItemWithError(slot.table.ptr(), slot.key.ptr());  // borrowed
      if (p == nullptr) {
        if (PyErr_Occurred()) throw nb::python_error();
        return nb::none();
      }
      const at::Tensor* t = unpack(p, slot.spec);
      if (t == nullptr) return nb::none();
      tensors.push_back(*t);
    }
    give_parameters(tensors);
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      const void* address = tensors[i].data_ptr();
      if (address != given_inputs_[i]) {
        check(native_->api->set_tensor(native_->session, inputs_[i].name.c_str(), address));
        given_inputs_[i] = address;
      }
      kept_inputs_[i] = tensors[i];
    }
    variable_list outputs;
    if (at::GradMode::is_enabled()) {
      outputs = SequenceFunction::apply(c10::intrusive_ptr<RunnerCore>::reclaim_copy(this),
                                        at::TensorList(tensors));
    } else {
      const cudaStream_t stream = current_stream();
      check(native_->api->forward(native_->session, stream, 0));
      outputs = copies(stream);
    }
    if (outputs.size() == 1) return nb::steal(THPVariable_Wrap(outputs[0]));
    nb::list result;
    for (const at::Tensor& t : outputs) result.append(nb::steal(THPVariable_Wrap(t)));
    return nb::tuple(result);
  }

  // The parameters as the module holds them now (the tensors after the inputs): each one at a new
  // address given to the session, one written in place since (its version counter) recast.
  void give_parameters(const std::vector<at::Tensor>& tensors) {
    bool changed = false;
    const std::size_t first = tensors.size() - params_.size();
    for (std::size_t j = 0; j < params_.size(); ++j) {
      ParamSlot& slot = params_[j];
      const at::Tensor& p = tensors[first + j];
      const void* address = p.data_ptr();
      const std::int64_t version = static_cast<std::int64_t>(p._version());
      if (address != slot.given) {
        check(native_->api->set_tensor(native_->session, slot.spec.name.c_str(), address));
      } else if (version != slot.version) {
        changed = true;
      }
      slot.given = address;
      slot.version = version;
    }
    if (changed) check(native_->api->parameters_changed(native_->session));
  }

  // After step() (which recasts the FP8 weights itself): the current versions are the seen ones
  // (of a parameter still where the session reads it; a moved one is given at the next call).
  void mark_parameters_seen(const std::vector<nb::object>& params) {
    for (std::size_t j = 0; j < params_.size() && j < params.size(); ++j) {
      if (!THPVariable_Check(params[j].ptr())) continue;
      const at::Tensor& p = THPVariable_Unpack(params[j].ptr());
      if (p.data_ptr() == params_[j].given)
        params_[j].version = static_cast<std::int64_t>(p._version());
    }
  }

  // Forget what the session was given (after bind(), load(), or a Python-path call).
  void forget() {
    for (ParamSlot& slot : params_) {
      slot.given = nullptr;
      slot.version = -1;
    }
    given_inputs_.assign(inputs_.size(), nullptr);
    given_grads_.assign(output_grad_names_.size(), nullptr);
  }

  std::int64_t forwards() const { return forwards_; }

  // ---- SequenceFunction's halves ----

  variable_list run_forward() {
    const cudaStream_t stream = current_stream();
    check(native_->api->forward(native_->session, stream, 1));
    ++forwards_;
    return copies(stream);
  }

  variable_list run_backward(std::int64_t forward_id, variable_list grads) {
    if (forward_id != forwards_) {
      raise_from_backward(NativeStatus::Usage,
                          "opfuse.torch.Sequential: backward of an earlier forward; the session "
                          "keeps the saved activations of its last training forward only, so run "
                          "each forward's backward before the next forward");
    }
    const cudaStream_t stream = current_stream();
    for (std::size_t i = 0; i < grads.size() && i < outputs_.size(); ++i) {
      const Spec& spec = outputs_[i];
      at::Tensor g =
          grads[i].defined()
              ? grads[i].contiguous()
              : at::zeros(spec.shape,
                          at::TensorOptions().dtype(spec.dtype).device(at::kCUDA, device_));
      if (g.scalar_type() != spec.dtype || g.sizes() != at::IntArrayRef(spec.shape) ||
          !g.is_cuda() || g.get_device() != device_) {
        raise_from_backward(NativeStatus::Usage,
                            "opfuse.torch.Sequential: output gradient '" + spec.name +
                                "' is not a CUDA tensor "
                                "of the output's dtype and shape on the module's device");
      }
      const void* address = g.data_ptr();
      if (address != given_grads_[i]) {
        backward_check(
            native_->api->set_tensor(native_->session, output_grad_names_[i].c_str(), address));
        given_grads_[i] = address;
      }
      kept_grads_[i] = g;
    }
    backward_check(native_->api->backward(native_->session, stream));
    variable_list result;
    result.reserve(1 + inputs_.size() + params_.size());
    result.emplace_back();  // the runner's address
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      result.push_back(input_has_grad_[i] ? copy_of(kNativeInputGrad, inputs_[i], stream, true)
                                          : at::Tensor());
    }
    for (const ParamSlot& slot : params_)
      result.push_back(copy_of(kNativeParamGrad, slot.spec, stream, true));
    return result;
  }

 private:
  // The tensor of a Python object if it fits `spec` (a dense row-major CUDA tensor of its dtype
  // and shape on the module's device); nullptr otherwise.
  const at::Tensor* unpack(PyObject* object, const Spec& spec) const {
    if (!THPVariable_Check(object)) return nullptr;
    const at::Tensor& t = THPVariable_Unpack(object);
    if (t.scalar_type() != spec.dtype || !t.is_cuda() || t.get_device() != device_ ||
        t.sizes() != at::IntArrayRef(spec.shape) || !t.is_contiguous()) {
      return nullptr;
    }
    return &t;
  }

  cudaStream_t current_stream() const {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
  }

  // A new tensor holding the session's result `name` (output, input or parameter gradient),
  // copied on `stream` (the session overwrites its own memory at the next call).
  at::Tensor copy_of(std::int32_t kind, const Spec& spec, cudaStream_t stream, bool in_backward) {
    const void* address = nullptr;
    const NativeStatus status =
        native_->api->result(native_->session, kind, spec.name.c_str(), &address);
    if (in_backward) {
      backward_check(status);
    } else {
      check(status);
    }
    at::Tensor copy =
        at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype).device(at::kCUDA, device_));
    const cudaError_t error =
        cudaMemcpyAsync(copy.data_ptr(), address, copy.nbytes(), cudaMemcpyDeviceToDevice, stream);
    if (error != cudaSuccess) {
      const std::string message = std::string("opfuse.torch.Sequential: copying '") + spec.name +
                                  "' failed: " + cudaGetErrorString(error);
      if (in_backward) raise_from_backward(NativeStatus::Cuda, message);
      raise(NativeStatus::Cuda, message);
    }
    return copy;
  }

  variable_list copies(cudaStream_t stream) {
    variable_list out;
    out.reserve(outputs_.size());
    for (const Spec& spec : outputs_) out.push_back(copy_of(kNativeOutput, spec, stream, false));
    return out;
  }

  PyObject* error_type(NativeStatus status) const {
    return status == NativeStatus::Usage  ? usage_error_.ptr()
           : status == NativeStatus::Cuda ? cuda_error_.ptr()
                                          : error_.ptr();
  }

  // With the GIL held (a forward): the session's failure as its opfuse exception.
  void check(NativeStatus status) const {
    if (status != NativeStatus::Ok) raise(status, native_->api->message());
  }
  [[noreturn]] void raise(NativeStatus status, const std::string& message) const {
    PyErr_SetString(error_type(status), message.c_str());
    throw nb::python_error();
  }

  // In the autograd engine's thread (no GIL): the exception the engine hands back to Python.
  void backward_check(NativeStatus status) const {
    if (status != NativeStatus::Ok) raise_from_backward(status, native_->api->message());
  }
  [[noreturn]] void raise_from_backward(NativeStatus status, const std::string& message) const {
    const PyGILState_STATE gil = PyGILState_Ensure();
    PyErr_SetString(error_type(status), message.c_str());
    python_error error;
    error.persist();
    PyGILState_Release(gil);
    throw error;
  }

  PyRef session_;  // keeps the Session (and its C interface) alive
  const NativeSession* native_;
  int device_;
  std::vector<Spec> inputs_;
  std::vector<bool> input_has_grad_;
  std::vector<ParamSlot> params_;
  std::vector<Spec> outputs_;
  std::vector<std::string> output_grad_names_;
  PyRef usage_error_, cuda_error_, error_;
  std::vector<const void*> given_inputs_, given_grads_;
  std::vector<at::Tensor> kept_inputs_, kept_grads_;  // what the session reads, kept alive
  std::int64_t forwards_ = 0;
};

variable_list SequenceFunction::forward(AutogradContext* ctx,
                                        const c10::intrusive_ptr<RunnerCore>& core,
                                        at::TensorList /*tensors*/) {
  variable_list outputs = core->run_forward();
  ctx->saved_data["core"] =
      c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(core));
  ctx->saved_data["forward"] = core->forwards();
  return outputs;
}

variable_list SequenceFunction::backward(AutogradContext* ctx, variable_list grads) {
  const c10::intrusive_ptr<torch::CustomClassHolder> holder = ctx->saved_data["core"].toCapsule();
  auto* core = static_cast<RunnerCore*>(holder.get());
  return core->run_backward(ctx->saved_data["forward"].toInt(), std::move(grads));
}

// opfuse._opfuse_torch.Runner: the Python object over a RunnerCore.
class Runner {
 public:
  template <typename... Args>
  explicit Runner(Args&&... args) : core_(c10::make_intrusive<RunnerCore>(args...)) {}
  nb::object call(const nb::tuple& args) { return core_->call(args); }
  void mark_parameters_seen(const std::vector<nb::object>& params) {
    core_->mark_parameters_seen(params);
  }
  void forget() { core_->forget(); }
  std::int64_t forwards() const { return core_->forwards(); }

 private:
  c10::intrusive_ptr<RunnerCore> core_;
};

}  // namespace

}  // namespace opfuse::python

NB_MODULE(_opfuse_torch, m) {
  using opfuse::python::Runner;
  namespace nb = nanobind;
  m.doc() = "opfuse.torch.Sequential's per-call work in C++ (docs/python.md); not part of the API";
  // torch.__version__ of the torch this module was compiled against (python/CMakeLists.txt).
  m.attr("torch_version") = OPFUSE_TORCH_VERSION;
  nb::class_<Runner>(m, "Runner")
      .def(nb::init<
               nb::object, std::uintptr_t, int,
               const std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::string>>&,
               const std::vector<bool>&,
               const std::vector<
                   std::tuple<nb::object, std::string,
                              std::tuple<std::string, std::vector<std::int64_t>, std::string>>>&,
               const std::vector<std::tuple<std::string, std::vector<std::int64_t>, std::string>>&,
               const std::vector<std::string>&, nb::object, nb::object, nb::object>(),
           nb::arg("session"), nb::arg("native"), nb::arg("device"), nb::arg("inputs"),
           nb::arg("input_has_grad"), nb::arg("params"), nb::arg("outputs"),
           nb::arg("output_grads"), nb::arg("usage_error"), nb::arg("cuda_error"), nb::arg("error"))
      .def("__call__", &Runner::call, nb::arg("inputs"))
      .def("mark_parameters_seen", &Runner::mark_parameters_seen, nb::arg("params"))
      .def("forget", &Runner::forget)
      .def_prop_ro("forwards", &Runner::forwards);
}
