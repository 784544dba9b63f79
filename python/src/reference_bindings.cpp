// `opfuse._opfuse.ReferenceSession`: one sequence on the CPU reference executor
// (reference_session.h) with NumPy arrays in and out, behind the same calls as Session (streams
// are accepted and ignored, so one training loop runs on either). Values are float32 arrays:
// the executor computes in fp32 and rounds each tensor to its storage dtype (bf16 values come
// back as the float32 numbers they round to).
#include <fmt/format.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "reference/run_steps.h"
#include "reference_session.h"

namespace opfuse::python {

namespace {

using Float32Array = nb::ndarray<nb::numpy, float>;

// A NumPy copy of a reference tensor (the session's values change at its next call).
Float32Array to_numpy(const cpu::Tensor<float>& tensor) {
  auto* copy = new std::vector<float>(tensor.data);
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  std::vector<std::size_t> shape(tensor.shape.begin(), tensor.shape.end());
  return Float32Array(copy->data(), shape.size(), shape.data(), owner);
}

struct PyReferenceSession {
  PyReferenceSession(PyProgram& program, const std::string& sequence,
                     const std::map<std::string, std::int64_t>& sizes)
      : session(checked(program).reference_sequence(sequence), sizes) {}

  static PyProgram& checked(PyProgram& program) {
    if (program.program.has_debug_config()) {
      throw UsageError(
          "the CPU session runs no precision-debug config (its features run on the GPU "
          "session); `fusec run --device cpu --debug-config` runs them on the reference");
    }
    return program;
  }

  void set_tensor(const std::string& name, const InputArray& array) {
    const TensorInfo* info = nullptr;
    for (const TensorInfo& t : session.tensors()) {
      if (t.name == name && (t.kind == TensorKind::Input || t.kind == TensorKind::Param ||
                             t.kind == TensorKind::OutputGrad)) {
        info = &t;
      }
    }
    const std::string where = fmt::format("set_tensor('{}')", name);
    if (info != nullptr) {
      if (array.device_type() != nb::device::cpu::value) {
        throw UsageError(fmt::format(
            "{}: the array is not in host memory; the CPU session (the reference executor) takes "
            "NumPy float32 arrays; GPU arrays run on program.session(..., device='cuda')",
            where));
      }
      // float32 whatever the tensor's dtype: the reference keeps fp32 values (docs/python.md).
      TensorInfo as_float = *info;
      as_float.dtype = TensorDType::FP32;
      check_layout(array, as_float, nb::dtype<float>(), where);
    }
    // An unknown name (info == nullptr) is refused by the session, listing the names.
    session.set_tensor(name, array_shape(array), static_cast<const float*>(array.data()));
  }

  ReferenceSession session;
};

}  // namespace

void bind_reference_session(nb::module_& m) {
  const auto stream_arg = nb::arg("stream").none() = nb::none();
  nb::class_<PyReferenceSession>(
      m, "ReferenceSession",
      "One sequence of a program on the CPU reference executor, with NumPy float32 arrays.\n\n"
      "Made by Program.session(device='cpu'). The same calls as Session, computing what "
      "`fusec run --device cpu` computes; `stream` arguments are accepted and ignored. Inputs "
      "and gradients are rounded to their tensor's dtype when set, as the GPU stores them; "
      "results are float32 copies.")
      .def(nb::init<PyProgram&, const std::string&, const std::map<std::string, std::int64_t>&>(),
           nb::arg("program"), nb::arg("sequence"), nb::arg("sizes"))
      .def_prop_ro("sequence", [](PyReferenceSession& s) { return s.session.sequence(); })
      .def_prop_ro("device", [](PyReferenceSession&) { return std::string("cpu"); })
      .def(
          "tensors", [](PyReferenceSession& s) { return s.session.tensors(); },
          "Every tensor of the interface under the sizes, as Session.tensors() gives them.")
      .def(
          "own_parameters",
          [](PyReferenceSession& s, std::uint64_t seed, nb::handle) {
            s.session.own_parameters(seed);
          },
          nb::arg("seed") = 0, stream_arg,
          "Fills every parameter as `fusec run` and Session.own_parameters() do from `seed`.")
      .def(
          "parameter",
          [](PyReferenceSession& s, const std::string& name) {
            return to_numpy(s.session.parameter(name));
          },
          nb::arg("name"), "A copy of a parameter's values (set_tensor() changes them).")
      .def("set_tensor", &PyReferenceSession::set_tensor, nb::arg("name"), nb::arg("array"),
           "Copies a NumPy float32 array (row-major, the tensor's shape) into an input, "
           "parameter or output gradient.")
      .def(
          "parameters_changed", [](PyReferenceSession& s) { s.session.parameters_changed(); },
          "As Session.parameters_changed() (set_tensor() of a parameter already implies it).")
      .def(
          "forward",
          [](PyReferenceSession& s, nb::handle, RunMode mode) {
            nb::gil_scoped_release release;
            s.session.forward(mode);
          },
          stream_arg, nb::arg("mode") = RunMode::Training, "Runs the forward.")
      .def(
          "backward",
          [](PyReferenceSession& s, nb::handle) {
            nb::gil_scoped_release release;
            s.session.backward();
          },
          stream_arg, "Runs the backward of the last training forward.")
      .def(
          "step", [](PyReferenceSession& s, nb::handle) { s.session.step(); }, stream_arg,
          "Ends a training step: every quantizer's amax history and scale updated.")
      .def(
          "output",
          [](PyReferenceSession& s, const std::string& name) {
            return to_numpy(s.session.output(name));
          },
          nb::arg("name"), "A copy of an output of the last forward.")
      .def(
          "input_grad",
          [](PyReferenceSession& s, const std::string& name) {
            return to_numpy(s.session.input_grad(name));
          },
          nb::arg("name"), "A copy of an input's gradient from the last backward.")
      .def(
          "param_grad",
          [](PyReferenceSession& s, const std::string& name) {
            return to_numpy(s.session.param_grad(name));
          },
          nb::arg("name"), "A copy of a parameter's gradient from the last backward.")
      .def(
          "quantizers", [](PyReferenceSession& s, nb::handle) { return s.session.quantizers(); },
          stream_arg, "Every per-tensor quantizer as it is now.");

  m.def(
      "reference_input",
      [](const std::vector<std::int64_t>& shape, std::uint64_t seed, std::size_t index) {
        cpu::Tensor<float> input = cpu::seeded_input(shape, seed, index);
        return to_numpy(input);
      },
      nb::arg("shape"), nb::arg("seed"), nb::arg("index"),
      "The values `fusec run --seed SEED` draws for input `index` (signature order) of `shape`, "
      "before rounding to the input's dtype: to reproduce its runs.");
}

}  // namespace opfuse::python
