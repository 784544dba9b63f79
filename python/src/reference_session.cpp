#include "reference_session.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "reference/cpu_tensor.h"
#include "reference/reference_kernels.h"
#include "reference/run_driver.h"
#include "reference/run_steps.h"

namespace opfuse::python {

namespace {

TensorDType public_dtype(ir::DType dtype) {
  switch (dtype) {
    case ir::DType::BF16:
      return TensorDType::BF16;
    case ir::DType::FP16:
      return TensorDType::FP16;
    case ir::DType::FP32:
      return TensorDType::FP32;
    case ir::DType::E4M3:
      return TensorDType::E4M3;
    case ir::DType::E5M2:
      return TensorDType::E5M2;
    case ir::DType::E2M1:
      return TensorDType::E2M1;
    case ir::DType::E8M0:
      return TensorDType::E8M0;
  }
  return TensorDType::FP32;
}

std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

TensorInfo make_info(std::string name, TensorKind kind, ir::DType dtype,
                     std::vector<std::int64_t> shape) {
  const TensorDType public_type = public_dtype(dtype);
  const auto bytes =
      static_cast<std::size_t>(element_count(shape)) * tensor_dtype_bytes(public_type);
  return {std::move(name), kind, public_type, std::move(shape), bytes};
}

std::size_t index_of(const std::vector<std::string>& names, std::string_view name) {
  return static_cast<std::size_t>(std::find(names.begin(), names.end(), name) - names.begin());
}

}  // namespace

ReferenceSession::ReferenceSession(const ir::Sequence& sequence,
                                   const std::map<std::string, std::int64_t>& sizes)
    : name_(sequence.name) {
  if (sequence.parallel.active()) {
    throw UsageError(fmt::format(
        "sequence '{}' is tensor-parallel (tp = {}): the CPU session runs one rank; `fusec run "
        "--device cpu --nproc {}` simulates the ranks",
        sequence.name, sequence.parallel.tp, sequence.parallel.tp));
  }
  cpu::Bindings bindings(sizes.begin(), sizes.end());
  try {
    executor_ = std::make_unique<cpu::ReferenceExecutor<float>>(
        cpu::lowered_for_run(sequence, nullptr), bindings);
  } catch (const cpu::ReferenceError& e) {
    throw UsageError(e.what());  // unbound or unknown sizes: misuse, as Session::bind says
  }
  const ir::Sequence& seq = executor_->sequence();
  const auto input_shapes = executor_->input_shapes();
  const auto output_shapes = executor_->output_shapes();
  for (std::size_t i = 0; i < seq.inputs.size(); ++i) {
    const ir::Value& v = seq.value(seq.inputs[i]);
    input_names_.push_back(v.name);
    tensors_.push_back(make_info(v.name, TensorKind::Input, v.type.dtype, input_shapes[i]));
  }
  for (const std::string& name : executor_->param_names()) {
    const ir::Value* param = nullptr;
    for (ir::ValueId id : seq.params)
      if (seq.value(id).name == name) param = &seq.value(id);
    tensors_.push_back(
        make_info(name, TensorKind::Param, param->type.dtype, executor_->param(name).shape));
  }
  for (std::size_t i = 0; i < seq.outputs.size(); ++i) {
    const ir::Value& v = seq.value(seq.outputs[i].value);
    output_names_.push_back(seq.outputs[i].name);
    // Named as the GPU plan names it (compiler/codegen/plan.cpp): "dy" for the output "y".
    const ir::Value& grad = seq.value(seq.output_grads.at(i));
    output_grad_names_.push_back("d" + grad.name);
    tensors_.push_back(make_info(output_grad_names_.back(), TensorKind::OutputGrad, grad.type.dtype,
                                 output_shapes[i]));
    tensors_.push_back(
        make_info(seq.outputs[i].name, TensorKind::Output, v.type.dtype, output_shapes[i]));
  }
  for (std::size_t i = 0; i < seq.inputs.size(); ++i) {
    const ir::Value& v = seq.value(seq.inputs[i]);
    tensors_.push_back(make_info(v.name, TensorKind::InputGrad, v.type.dtype, input_shapes[i]));
  }
  // Parameter gradients keep the parameter's dtype and shape, as the GPU plan's do.
  const std::size_t count = tensors_.size();
  for (std::size_t i = 0; i < count; ++i) {
    if (tensors_[i].kind != TensorKind::Param) continue;
    TensorInfo grad = tensors_[i];
    grad.kind = TensorKind::ParamGrad;
    tensors_.push_back(std::move(grad));
  }
  inputs_.resize(input_names_.size());
  output_grads_.resize(output_names_.size());
}

ReferenceSession::~ReferenceSession() = default;

const TensorInfo& ReferenceSession::find(std::string_view name, TensorKind kind,
                                         std::string_view call) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name && t.kind == kind) return t;
  std::vector<std::string> names;
  for (const TensorInfo& t : tensors_)
    if (t.kind == kind) names.push_back(t.name);
  throw UsageError(fmt::format(
      "{}: sequence '{}' has no {} '{}'; its {}s: {}", call, name_, tensor_kind_name(kind), name,
      tensor_kind_name(kind),
      names.empty() ? std::string("(none)") : fmt::format("{}", fmt::join(names, ", "))));
}

void ReferenceSession::own_parameters(std::uint64_t seed) {
  cpu::init_params_from_seed(*executor_, seed);
}

void ReferenceSession::set_tensor(std::string_view name, const std::vector<std::int64_t>& shape,
                                  const float* values) {
  const TensorInfo* info = nullptr;
  for (const TensorInfo& t : tensors_) {
    if (t.name == name && (t.kind == TensorKind::Input || t.kind == TensorKind::Param ||
                           t.kind == TensorKind::OutputGrad)) {
      info = &t;
    }
  }
  if (info == nullptr) {
    std::vector<std::string> names;
    for (const TensorInfo& t : tensors_) {
      if (t.kind == TensorKind::Input || t.kind == TensorKind::Param ||
          t.kind == TensorKind::OutputGrad) {
        names.push_back(t.name);
      }
    }
    throw UsageError(
        fmt::format("set_tensor('{}'): sequence '{}' takes no such tensor; it takes: {}", name,
                    name_, fmt::join(names, ", ")));
  }
  if (shape != info->shape) {
    throw UsageError(fmt::format("set_tensor('{}'): the {} '{}' has shape [{}], got [{}]", name,
                                 tensor_kind_name(info->kind), name, fmt::join(info->shape, ", "),
                                 fmt::join(shape, ", ")));
  }
  cpu::Tensor<float> tensor;
  tensor.shape = shape;
  tensor.data.assign(values, values + element_count(shape));
  if (info->kind == TensorKind::Param) {
    executor_->param(name).data = std::move(tensor.data);
    executor_->params_changed();
    return;
  }
  // Inputs and gradients are stored in their dtype, as the GPU holds them.
  const ir::DType dtype = info->dtype == TensorDType::BF16   ? ir::DType::BF16
                          : info->dtype == TensorDType::FP16 ? ir::DType::FP16
                                                             : ir::DType::FP32;
  cpu::round_as_stored(tensor.data, dtype);
  if (info->kind == TensorKind::Input) {
    inputs_[index_of(input_names_, name)] = std::move(tensor);
  } else {
    output_grads_[index_of(output_grad_names_, name)] = std::move(tensor);
  }
}

const cpu::Tensor<float>& ReferenceSession::parameter(std::string_view name) {
  find(name, TensorKind::Param, "parameter()");
  return executor_->param(name);
}

void ReferenceSession::parameters_changed() { executor_->params_changed(); }

void ReferenceSession::forward(RunMode mode) {
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < inputs_.size(); ++i)
    if (!inputs_[i]) missing.push_back(input_names_[i]);
  if (!missing.empty()) {
    throw UsageError(fmt::format(
        "forward() of sequence '{}' reads [{}], which were not set: call set_tensor() for each",
        name_, fmt::join(missing, ", ")));
  }
  std::vector<cpu::Tensor<float>> inputs;
  inputs.reserve(inputs_.size());
  for (const auto& input : inputs_) inputs.push_back(*input);
  outputs_ = executor_->forward(inputs);
  backward_ready_ = mode == RunMode::Training;
}

void ReferenceSession::backward() {
  if (!backward_ready_) {
    throw UsageError(fmt::format(
        "backward() of sequence '{}' needs a training forward first (and one per backward)",
        name_));
  }
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < output_grads_.size(); ++i)
    if (!output_grads_[i]) missing.push_back(output_grad_names_[i]);
  if (!missing.empty()) {
    throw UsageError(fmt::format(
        "backward() of sequence '{}' reads [{}], which were not set: call set_tensor() for each",
        name_, fmt::join(missing, ", ")));
  }
  std::vector<cpu::Tensor<float>> grads;
  grads.reserve(output_grads_.size());
  for (const auto& grad : output_grads_) grads.push_back(*grad);
  grads_ = executor_->backward(grads);
  backward_ready_ = false;
}

void ReferenceSession::step() { executor_->step(); }

const cpu::Tensor<float>& ReferenceSession::output(std::string_view name) const {
  find(name, TensorKind::Output, "output()");
  if (outputs_.empty()) throw UsageError(fmt::format("output('{}'): no forward has run yet", name));
  return outputs_[index_of(output_names_, name)];
}

const cpu::Tensor<float>& ReferenceSession::input_grad(std::string_view name) const {
  find(name, TensorKind::InputGrad, "input_grad()");
  if (!grads_) throw UsageError(fmt::format("input_grad('{}'): no backward has run yet", name));
  return grads_->inputs[index_of(input_names_, name)];
}

const cpu::Tensor<float>& ReferenceSession::param_grad(std::string_view name) const {
  find(name, TensorKind::ParamGrad, "param_grad()");
  if (!grads_) throw UsageError(fmt::format("param_grad('{}'): no backward has run yet", name));
  return grads_->params[index_of(executor_->param_names(), name)];
}

std::vector<QuantizerStatus> ReferenceSession::quantizers() const {
  std::vector<QuantizerStatus> result;
  for (const cpu::QuantizerInfo& q : executor_->quantizers()) {
    if (!q.has_tensor_scale) continue;  // block scales live with each copy (as on the GPU)
    QuantizerStatus status;
    status.name = q.name;
    status.format = q.format_name == "e5m2"   ? TensorDType::E5M2
                    : q.format_name == "e2m1" ? TensorDType::E2M1
                                              : TensorDType::E4M3;
    status.amax_history = q.amax_history;
    status.scale = q.scale;
    status.scale_inv = q.scale_inv;
    result.push_back(std::move(status));
  }
  return result;
}

}  // namespace opfuse::python
