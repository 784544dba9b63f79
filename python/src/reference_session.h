// The Python package's CPU session: one sequence of a program on the CPU reference executor
// (reference/reference_executor.h), behind the calls opfuse::Session offers (docs/python.md).
// It runs what `fusec run --device cpu` runs: the sequence as the pipeline compiles it
// (reference/run_steps.h, lowered_for_run), parameters drawn as own_parameters() draws them,
// values in fp32 rounded to each tensor's storage dtype. No nanobind here: the bindings
// (reference_bindings.cpp) convert arrays, this class checks names and shapes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "opfuse/program.h"
#include "reference/reference_executor.h"

namespace opfuse::python {

class ReferenceSession {
 public:
  // `sequence` as the front end built it (not lowered); `sizes` binds every symbolic size.
  // UsageError for a missing or unknown size, a tensor-parallel sequence (fusec run --nproc
  // simulates those) or a bad size.
  ReferenceSession(const ir::Sequence& sequence, const std::map<std::string, std::int64_t>& sizes);
  ~ReferenceSession();

  const std::string& sequence() const { return name_; }
  // The same names, kinds, dtypes and shapes Session::tensors() gives.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  // Every parameter from `seed`, as Session::own_parameters and `fusec run` draw them.
  void own_parameters(std::uint64_t seed);
  // Copies `values` (row-major, the tensor's element count) into an input, parameter or output
  // gradient; parameters are rounded to their storage dtype (as the GPU stores them) and the
  // FP8 weight copies recast. UsageError for another name or kind, or a wrong count.
  void set_tensor(std::string_view name, const std::vector<std::int64_t>& shape,
                  const float* values);
  // A parameter's current values (UsageError for another name).
  const cpu::Tensor<float>& parameter(std::string_view name);
  // After changing parameters through parameter(): round them and recast the FP8 copies.
  void parameters_changed();

  // UsageError naming the inputs not set. Inference forwards make no saved state for backward.
  void forward(RunMode mode);
  // UsageError without a training forward since the last backward-able state, or unset output
  // gradients (each output's gradient must be set; an extra output may be left at zero by
  // setting zeros).
  void backward();
  void step();

  const cpu::Tensor<float>& output(std::string_view name) const;
  const cpu::Tensor<float>& input_grad(std::string_view name) const;
  const cpu::Tensor<float>& param_grad(std::string_view name) const;

  std::vector<QuantizerStatus> quantizers() const;

 private:
  const TensorInfo& find(std::string_view name, TensorKind kind, std::string_view call) const;

  std::string name_;
  std::unique_ptr<cpu::ReferenceExecutor<float>> executor_;
  std::vector<TensorInfo> tensors_;
  std::vector<std::string> input_names_;        // signature order
  std::vector<std::string> output_names_;       // signature order
  std::vector<std::string> output_grad_names_;  // one per output, signature order
  std::vector<std::optional<cpu::Tensor<float>>> inputs_;
  std::vector<std::optional<cpu::Tensor<float>>> output_grads_;
  std::vector<cpu::Tensor<float>> outputs_;
  std::optional<cpu::Gradients<float>> grads_;
  bool backward_ready_ = false;  // a training forward ran and no backward consumed it yet
};

}  // namespace opfuse::python
