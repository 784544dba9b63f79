#include "reference_executor.h"

#include <fmt/format.h>

#include <array>
#include <optional>
#include <type_traits>
#include <utility>

#include "numerics.h"
#include "reference_ops.h"
#include "support/assert.h"

namespace opfuse::cpu {

namespace {

using ir::OpKind;

// Quantizer slots of one op: linear uses all three; quantize uses kInput (forward) and kGrad.
constexpr size_t kInput = 0, kWeight = 1, kGrad = 2;
using QuantizerSlots = std::array<int, 3>;

std::vector<int64_t> bind_shape(const ir::Shape& shape, const Bindings& bindings) {
  std::vector<int64_t> out;
  for (const ir::Dim& d : shape)
    out.push_back(d.is_symbolic() ? bindings.find(d.symbol)->second : d.size);
  return out;
}

// What a kernel storing the value in `dtype` and reading it back sees. FP32 storage keeps a float
// as it is; in double mode it rounds to float like any other storage dtype.
template <typename T>
void round_to_storage(std::span<T> values, ir::DType dtype) {
  std::vector<float> as_float;
  std::span<float> f;
  if constexpr (std::is_same_v<T, float>) {
    f = values;
  } else {
    as_float.assign(values.begin(), values.end());
    f = as_float;
  }
  if (dtype == ir::DType::BF16) round_to_bf16(f);
  if (dtype == ir::DType::FP16) round_to_fp16(f);
  if constexpr (!std::is_same_v<T, float>) std::copy(f.begin(), f.end(), values.begin());
}

template <typename T>
void fake_quantize_values(Quantizer& quantizer, std::span<T> values) {
  if constexpr (std::is_same_v<T, float>) {
    fake_quantize(quantizer, values);
  } else {
    std::vector<float> f(values.begin(), values.end());
    fake_quantize(quantizer, f);
    std::copy(f.begin(), f.end(), values.begin());
  }
}

std::optional<ops::Activation> activation_of(OpKind kind) {
  switch (kind) {
    case OpKind::GELU:
    case OpKind::GEGLU:
      return ops::Activation::GELU;
    case OpKind::QGELU:
      return ops::Activation::QGELU;
    case OpKind::ReLU:
    case OpKind::ReGLU:
      return ops::Activation::ReLU;
    case OpKind::SiLU:
    case OpKind::SwiGLU:
      return ops::Activation::SiLU;
    default:
      return std::nullopt;
  }
}

}  // namespace

template <typename T>
struct ReferenceExecutor<T>::State {
  struct Saved {
    Tensor<T> x_operand, w_operand;  // the linear's GEMM operands as used (FP8-dequantized)
    std::vector<T> mean, rstd;       // norms
  };

  const ir::Sequence* seq = nullptr;
  ReferenceOptions options;
  std::vector<std::vector<int64_t>> shapes;  // per value id
  std::vector<Tensor<T>> values;             // per value id; parameters live here too
  std::vector<std::string> param_names;
  std::vector<Saved> saved;  // per op
  std::vector<Quantizer> quantizers;
  std::vector<QuantizerSlots> slots;           // per op
  std::vector<int> weight_quantizer_of_param;  // per value id: fp8_weights weight quantizer or -1
  bool has_forward = false;

  bool fp8() const { return seq->recipe.is_fp8(); }
  bool rounds(size_t op) const {
    return op < options.round_after_op.size() ? bool(options.round_after_op[op])
                                              : options.round_outputs;
  }
  ir::DType dtype(ir::ValueId id) const { return seq->value(id).type.dtype; }
  Quantizer* quantizer(size_t op, size_t slot) {
    const int q = slots[op][slot];
    return q < 0 ? nullptr : &quantizers[size_t(q)];
  }
  Tensor<T> zeros_like(ir::ValueId id) const { return Tensor<T>::zeros(shapes[id]); }

  void add_grad(std::vector<Tensor<T>>& grads, ir::ValueId id, Tensor<T> g, bool round) {
    if (round) round_to_storage<T>(g.data, dtype(id));
    Tensor<T>& have = grads[id];
    if (have.data.empty()) {
      have = std::move(g);
      return;
    }
    for (size_t i = 0; i < g.data.size(); ++i) have.data[i] += g.data[i];
    if (round) round_to_storage<T>(have.data, dtype(id));
  }

  void forward_op(size_t index);
  void backward_op(size_t index, std::vector<Tensor<T>>& grads);
};

template <typename T>
ReferenceExecutor<T>::ReferenceExecutor(const ir::Sequence& sequence, const Bindings& bindings,
                                        const ReferenceOptions& options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.seq = &sequence;
  s.options = options;
  std::vector<std::string> unbound;
  for (const std::string& symbol : sequence.symbols()) {
    auto it = bindings.find(symbol);
    if (it == bindings.end()) {
      unbound.push_back(symbol);
    } else if (it->second <= 0) {
      throw ReferenceError(
          fmt::format("dimension '{}' of sequence '{}' is bound to {}; sizes must "
                      "be positive (e.g. --bind {}=64)",
                      symbol, sequence.name, it->second, symbol));
    }
  }
  if (!unbound.empty()) {
    std::string names, example;
    for (const std::string& u : unbound) {
      names += fmt::format("{}'{}'", names.empty() ? "" : ", ", u);
      example += fmt::format(" --bind {}=64", u);
    }
    throw ReferenceError(
        fmt::format("sequence '{}' has unbound symbolic dimension{} {}; give each "
                    "a size with --bind NAME=SIZE (e.g.{})",
                    sequence.name, unbound.size() == 1 ? "" : "s", names, example));
  }
  for (const ir::Value& v : sequence.values) s.shapes.push_back(bind_shape(v.type.shape, bindings));
  s.values.resize(sequence.values.size());
  s.saved.resize(sequence.ops.size());
  s.slots.assign(sequence.ops.size(), QuantizerSlots{-1, -1, -1});
  s.weight_quantizer_of_param.assign(sequence.values.size(), -1);
  for (ir::ValueId p : sequence.params) {
    s.param_names.push_back(sequence.value(p).name);
    s.values[p] = s.zeros_like(p);
  }
  if (!s.fp8()) return;
  auto add = [&](size_t op, size_t slot, const std::string& role, bool is_gradient) {
    s.slots[op][slot] = int(s.quantizers.size());
    s.quantizers.push_back(
        make_quantizer(sequence.ops[op].instance + "." + role, sequence.recipe, is_gradient));
  };
  for (size_t i = 0; i < sequence.ops.size(); ++i) {
    const ir::Operation& op = sequence.ops[i];
    if (op.kind == OpKind::Linear) {
      add(i, kInput, "input", false);
      add(i, kWeight, "weight", false);
      add(i, kGrad, "grad_output", true);
      if (sequence.fp8_weights) s.weight_quantizer_of_param[op.operands[1]] = s.slots[i][kWeight];
    } else if (op.kind == OpKind::Quantize) {
      if (ir::attr_bool(op.attrs, "forward")) add(i, kInput, "output", false);
      if (ir::attr_bool(op.attrs, "backward")) add(i, kGrad, "grad_input", true);
    }
  }
}

template <typename T>
ReferenceExecutor<T>::~ReferenceExecutor() = default;
template <typename T>
ReferenceExecutor<T>::ReferenceExecutor(ReferenceExecutor&&) noexcept = default;

template <typename T>
const ir::Sequence& ReferenceExecutor<T>::sequence() const {
  return *state_->seq;
}

template <typename T>
std::vector<std::vector<int64_t>> ReferenceExecutor<T>::input_shapes() const {
  std::vector<std::vector<int64_t>> out;
  for (ir::ValueId id : state_->seq->inputs) out.push_back(state_->shapes[id]);
  return out;
}

template <typename T>
std::vector<std::vector<int64_t>> ReferenceExecutor<T>::output_shapes() const {
  std::vector<std::vector<int64_t>> out;
  for (const ir::SequenceOutput& o : state_->seq->outputs) out.push_back(state_->shapes[o.value]);
  return out;
}

template <typename T>
const std::vector<std::string>& ReferenceExecutor<T>::param_names() const {
  return state_->param_names;
}

template <typename T>
Tensor<T>& ReferenceExecutor<T>::param(std::string_view name) {
  for (size_t i = 0; i < state_->param_names.size(); ++i)
    if (state_->param_names[i] == name) return state_->values[state_->seq->params[i]];
  throw ReferenceError(fmt::format("sequence '{}' has no parameter '{}'", state_->seq->name, name));
}

template <typename T>
void ReferenceExecutor<T>::params_changed() {
  State& s = *state_;
  for (ir::ValueId p : s.seq->params) {
    OPFUSE_ASSERT(s.values[p].shape == s.shapes[p], "parameter '{}' was given another shape",
                  s.seq->value(p).name);
    if (s.options.round_outputs) round_to_storage<T>(s.values[p].data, s.dtype(p));
    // fp8_weights (TE's quantized_model_init): only the FP8 copy exists; use its dequantized value.
    if (const int q = s.weight_quantizer_of_param[p]; q >= 0)
      fake_quantize_values<T>(s.quantizers[size_t(q)], s.values[p].data);
  }
}

template <typename T>
void ReferenceExecutor<T>::State::forward_op(size_t index) {
  const ir::Operation& op = seq->ops[index];
  const ir::ValueId out_id = op.results[0];
  const Tensor<T>& x = values[op.operands[0]];
  Tensor<T> y = zeros_like(out_id);
  Saved& keep = saved[index];
  const auto& attrs = op.attrs;
  switch (op.kind) {
    case OpKind::LayerNorm:
    case OpKind::RMSNorm: {
      const bool zero_centered = ir::attr_bool(attrs, "zero_centered_gamma");
      const double eps = ir::attr_float(attrs, "eps");
      keep.mean.assign(size_t(x.rows()), T(0));
      keep.rstd.assign(size_t(x.rows()), T(0));
      const std::span<const T> gamma = values[op.operands[1]].data;
      if (op.kind == OpKind::LayerNorm) {
        ops::layernorm_forward<T>(x.data, gamma, values[op.operands[2]].data, x.cols(), eps,
                                  zero_centered, y.data, keep.mean, keep.rstd);
      } else {
        ops::rmsnorm_forward<T>(x.data, gamma, x.cols(), eps, zero_centered, y.data, keep.rstd);
      }
      break;
    }
    case OpKind::Linear: {
      keep.x_operand = x;
      keep.w_operand = values[op.operands[1]];
      if (Quantizer* q = quantizer(index, kInput)) fake_quantize_values<T>(*q, keep.x_operand.data);
      // Under fp8_weights the stored weight is already FP8 (cast in params_changed).
      if (Quantizer* q = quantizer(index, kWeight); q && !seq->fp8_weights)
        fake_quantize_values<T>(*q, keep.w_operand.data);
      const int64_t n = y.cols(), k = x.cols();
      ops::linear_forward<T>(keep.x_operand.data, keep.w_operand.data, x.rows(), n, k, y.data);
      if (ir::attr_bool(attrs, "bias")) ops::add_bias<T>(y.data, values[op.operands[2]].data, n);
      break;
    }
    case OpKind::Bias:
      y.data = x.data;
      ops::add_bias<T>(y.data, values[op.operands[1]].data, y.cols());
      break;
    case OpKind::GELU:
    case OpKind::QGELU:
    case OpKind::ReLU:
    case OpKind::SiLU:
      for (size_t i = 0; i < y.data.size(); ++i)
        y.data[i] = ops::activation(*activation_of(op.kind), x.data[i]);
      break;
    case OpKind::SwiGLU:
    case OpKind::GEGLU:
    case OpKind::ReGLU:
      ops::gated_forward<T>(*activation_of(op.kind), x.data, y.cols(), y.data);
      break;
    case OpKind::AddExtraInput: {
      const Tensor<T>& extra = values[op.operands.back()];
      for (size_t i = 0; i < y.data.size(); ++i) y.data[i] = x.data[i] + extra.data[i];
      break;
    }
    case OpKind::ConstantScale: {
      const T scale = T(ir::attr_float(attrs, "scale"));
      for (size_t i = 0; i < y.data.size(); ++i) y.data[i] = x.data[i] * scale;
      break;
    }
    case OpKind::Quantize:
      y.data = x.data;
      if (Quantizer* q = quantizer(index, kInput)) fake_quantize_values<T>(*q, y.data);
      break;
    case OpKind::MakeExtraOutput:
    case OpKind::Identity:
    case OpKind::Reshape:
      y.data = x.data;
      break;
  }
  if (rounds(index)) round_to_storage<T>(y.data, dtype(out_id));
  values[out_id] = std::move(y);
}

template <typename T>
void ReferenceExecutor<T>::State::backward_op(size_t index, std::vector<Tensor<T>>& grads) {
  const ir::Operation& op = seq->ops[index];
  const ir::ValueId in_id = op.operands[0];
  Tensor<T> dy =
      grads[op.results[0]].data.empty() ? zeros_like(op.results[0]) : grads[op.results[0]];
  const Tensor<T>& x = values[in_id];
  Tensor<T> dx = zeros_like(in_id);
  const bool round = rounds(index);
  const Saved& keep = saved[index];
  const auto& attrs = op.attrs;
  switch (op.kind) {
    case OpKind::LayerNorm:
    case OpKind::RMSNorm: {
      const bool zero_centered = ir::attr_bool(attrs, "zero_centered_gamma");
      const ir::ValueId gamma_id = op.operands[1];
      Tensor<T> dgamma = zeros_like(gamma_id);
      if (op.kind == OpKind::LayerNorm) {
        Tensor<T> dbeta = zeros_like(op.operands[2]);
        ops::layernorm_backward<T>(x.data, values[gamma_id].data, dy.data, keep.mean, keep.rstd,
                                   x.cols(), zero_centered, dx.data, dgamma.data, dbeta.data);
        add_grad(grads, op.operands[2], std::move(dbeta), round);
      } else {
        ops::rmsnorm_backward<T>(x.data, values[gamma_id].data, dy.data, keep.rstd, x.cols(),
                                 zero_centered, dx.data, dgamma.data);
      }
      add_grad(grads, gamma_id, std::move(dgamma), round);
      break;
    }
    case OpKind::Linear: {
      const int64_t m = x.rows(), n = dy.cols(), k = x.cols();
      if (ir::attr_bool(attrs, "bias")) {
        Tensor<T> dbias = zeros_like(op.operands[2]);
        ops::bias_grad<T>(dy.data, n, dbias.data);  // from the unquantized gradient, as TE does
        add_grad(grads, op.operands[2], std::move(dbias), round);
      }
      if (Quantizer* q = quantizer(index, kGrad)) fake_quantize_values<T>(*q, dy.data);
      Tensor<T> dw = zeros_like(op.operands[1]);
      ops::linear_dgrad<T>(dy.data, keep.w_operand.data, m, n, k, dx.data);
      ops::linear_wgrad<T>(dy.data, keep.x_operand.data, m, n, k, dw.data);
      add_grad(grads, op.operands[1], std::move(dw), round);
      break;
    }
    case OpKind::Bias: {
      Tensor<T> dbias = zeros_like(op.operands[1]);
      ops::bias_grad<T>(dy.data, dy.cols(), dbias.data);
      add_grad(grads, op.operands[1], std::move(dbias), round);
      dx.data = dy.data;
      break;
    }
    case OpKind::GELU:
    case OpKind::QGELU:
    case OpKind::ReLU:
    case OpKind::SiLU:
      for (size_t i = 0; i < dx.data.size(); ++i)
        dx.data[i] = ops::activation_derivative(*activation_of(op.kind), x.data[i]) * dy.data[i];
      break;
    case OpKind::SwiGLU:
    case OpKind::GEGLU:
    case OpKind::ReGLU:
      ops::gated_backward<T>(*activation_of(op.kind), x.data, dy.data, dy.cols(), dx.data);
      break;
    case OpKind::AddExtraInput:
      add_grad(grads, op.operands.back(), dy, round);
      dx.data = dy.data;
      break;
    case OpKind::ConstantScale: {
      const T scale = T(ir::attr_float(attrs, "scale"));
      for (size_t i = 0; i < dx.data.size(); ++i) dx.data[i] = dy.data[i] * scale;
      break;
    }
    case OpKind::Quantize:
      // Straight-through: the cast's gradient is the identity, itself quantized when asked.
      dx.data = dy.data;
      if (Quantizer* q = quantizer(index, kGrad)) fake_quantize_values<T>(*q, dx.data);
      break;
    case OpKind::MakeExtraOutput:  // the extra output's gradient was seeded into this result
    case OpKind::Identity:
    case OpKind::Reshape:
      dx.data = dy.data;
      break;
  }
  add_grad(grads, in_id, std::move(dx), round);
}

template <typename T>
std::vector<Tensor<T>> ReferenceExecutor<T>::forward(const std::vector<Tensor<T>>& inputs) {
  State& s = *state_;
  if (inputs.size() != s.seq->inputs.size())
    throw ReferenceError(fmt::format("sequence '{}' takes {} inputs, got {}", s.seq->name,
                                     s.seq->inputs.size(), inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::ValueId id = s.seq->inputs[i];
    if (inputs[i].shape != s.shapes[id] ||
        inputs[i].data.size() != Tensor<T>::zeros(s.shapes[id]).data.size())
      throw ReferenceError(fmt::format("input '{}' of sequence '{}' has the wrong shape",
                                       s.seq->value(id).name, s.seq->name));
    s.values[id] = inputs[i];
  }
  for (size_t i = 0; i < s.seq->ops.size(); ++i) s.forward_op(i);
  s.has_forward = true;
  std::vector<Tensor<T>> outputs;
  for (const ir::SequenceOutput& o : s.seq->outputs) outputs.push_back(s.values[o.value]);
  return outputs;
}

template <typename T>
Gradients<T> ReferenceExecutor<T>::backward(const std::vector<Tensor<T>>& output_grads) {
  State& s = *state_;
  OPFUSE_ASSERT(s.has_forward, "backward called before forward on sequence '{}'", s.seq->name);
  OPFUSE_ASSERT_EQ(output_grads.size(), s.seq->outputs.size());
  std::vector<Tensor<T>> grads(s.values.size());
  for (size_t k = 0; k < output_grads.size(); ++k) {
    if (output_grads[k].data.empty()) continue;
    const ir::ValueId id = s.seq->outputs[k].value;
    OPFUSE_ASSERT(output_grads[k].shape == s.shapes[id],
                  "gradient of output '{}' has another shape", s.seq->outputs[k].name);
    s.add_grad(grads, id, output_grads[k], false);
  }
  for (size_t i = s.seq->ops.size(); i-- > 0;) s.backward_op(i, grads);
  Gradients<T> out;
  for (ir::ValueId id : s.seq->inputs)
    out.inputs.push_back(grads[id].data.empty() ? s.zeros_like(id) : std::move(grads[id]));
  for (ir::ValueId id : s.seq->params)
    out.params.push_back(grads[id].data.empty() ? s.zeros_like(id) : std::move(grads[id]));
  return out;
}

template <typename T>
void ReferenceExecutor<T>::sgd_step(const Gradients<T>& grads, double lr) {
  State& s = *state_;
  OPFUSE_ASSERT_EQ(grads.params.size(), s.seq->params.size());
  for (size_t i = 0; i < grads.params.size(); ++i) {
    Tensor<T>& p = s.values[s.seq->params[i]];
    for (size_t j = 0; j < p.data.size(); ++j) p.data[j] -= T(lr) * grads.params[i].data[j];
  }
  params_changed();
}

template <typename T>
std::vector<QuantizerInfo> ReferenceExecutor<T>::quantizers() const {
  std::vector<QuantizerInfo> out;
  for (const Quantizer& q : state_->quantizers)
    out.push_back({q.name, q.format, q.state.amax_history, q.state.scale, q.state.scale_inv});
  return out;
}

template <typename T>
void ReferenceExecutor<T>::step() {
  for (Quantizer& q : state_->quantizers) end_step(q);
}

template class ReferenceExecutor<float>;
template class ReferenceExecutor<double>;

}  // namespace opfuse::cpu
