#include "reference_executor.h"

#include <fmt/format.h>

#include <array>
#include <map>
#include <optional>
#include <type_traits>
#include <utility>

#include "driver/compile.h"
#include "numerics.h"
#include "reference_ops.h"
#include "support/assert.h"

namespace opfuse::cpu {

namespace {

using ir::OpKind;

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

// [rows, cols] row-major -> [cols, rows].
template <typename T>
std::vector<T> transpose(std::span<const T> x, int64_t rows, int64_t cols) {
  std::vector<T> out(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return out;
}

}  // namespace

template <typename T>
struct ReferenceExecutor<T>::State {
  ir::Sequence seq;
  ReferenceOptions options;
  std::vector<std::vector<int64_t>> shapes;  // per value id
  std::vector<Tensor<T>> values;             // per value id; parameters live here too
  std::vector<float> scale_inv;              // per value id: FP8 values' scale_inv at cast time
  std::vector<bool> transposed;              // per value id: a column-wise FP8 copy
  std::vector<std::string> param_names;
  std::vector<Quantizer> quantizers;  // like seq.quantizers
  // fp8_weights: per weight param, the FP8 codes and scale_inv cast in params_changed().
  std::map<ir::ValueId, std::pair<std::vector<float>, float>> weight_codes;
  bool has_forward = false;

  ir::DType dtype(ir::ValueId id) const { return seq.value(id).type.dtype; }
  Tensor<T> zeros_like(ir::ValueId id) const { return Tensor<T>::zeros(shapes[id]); }
  const Tensor<T>& in(const ir::Operation& op, size_t i) const { return values[op.operands[i]]; }
  Tensor<T>& out(const ir::Operation& op, size_t i) {
    values[op.results[i]] = zeros_like(op.results[i]);
    return values[op.results[i]];
  }
  // A GEMM operand's FP8 scale_inv (1 for high-precision operands).
  T operand_scale(const ir::Operation& op, size_t i) const {
    return seq.value(op.operands[i]).quantizer >= 0 ? T(scale_inv[op.operands[i]]) : T(1);
  }
  void scale_result(Tensor<T>& y, T factor) {
    if (factor != T(1))
      for (T& v : y.data) v *= factor;
  }

  void run_op(const ir::Operation& op);
  void run_top(const ir::Operation& op);
  void cast_fp8(const ir::Operation& op);
};

template <typename T>
void ReferenceExecutor<T>::State::cast_fp8(const ir::Operation& op) {
  const ir::ValueId source = op.operands[0];
  Quantizer& q = quantizers.at(size_t(op.quantizer));
  const Tensor<T>& x = values[source];
  std::vector<float> codes(x.data.size());
  float inv = 0.0f;
  if (auto it = weight_codes.find(source); it != weight_codes.end()) {
    codes = it->second.first;  // fp8_weights: the stored FP8 weight, cast when it last changed
    inv = it->second.second;
  } else {
    const std::vector<float> as_float(x.data.begin(), x.data.end());
    inv = quantize(q, as_float, codes);
  }
  size_t r = 0;
  if (ir::attr_bool(op.attrs, "rowwise")) {
    Tensor<T>& y = out(op, r++);
    std::copy(codes.begin(), codes.end(), y.data.begin());
    scale_inv[op.results[r - 1]] = inv;
  }
  if (ir::attr_bool(op.attrs, "columnwise")) {
    Tensor<T>& y = out(op, r++);
    // The column-wise copy holds the same codes (per-tensor scale); stored transposed for
    // TN-only GEMMs (QuantizerDecl::columnwise_layout).
    const std::vector<float> t =
        seq.quantizers.at(size_t(op.quantizer)).columnwise_layout == plan::CopyLayout::Transposed
            ? transpose<float>(codes, x.rows(), x.cols())
            : codes;
    std::copy(t.begin(), t.end(), y.data.begin());
    scale_inv[op.results[r - 1]] = inv;
  }
}

template <typename T>
void ReferenceExecutor<T>::State::run_op(const ir::Operation& op) {
  const auto& attrs = op.attrs;
  // Pointwise ops and their backward: evaluated from their definition (compiler/ir/pointwise_ops.h)
  // with the op's attributes.
  if (const ir::PointwiseDef* def = ir::pointwise_def(op.kind)) {
    const ir::PointwiseExpr expr(*def, attrs, /*device=*/false);
    if (ir::is_pointwise(op.kind)) {
      Tensor<T>& y = out(op, 0);
      ops::pointwise_forward<T>(expr, in(op, 0).data, y.cols(), y.data);
    } else {
      const Tensor<T>& dy = in(op, 0);
      ops::pointwise_backward<T>(expr, in(op, 1).data, dy.data, dy.cols(), out(op, 0).data);
    }
    return;
  }
  switch (op.kind) {
    case OpKind::LayerNorm:
    case OpKind::RMSNorm: {
      const Tensor<T>& x = in(op, 0);
      const bool zero_centered = ir::attr_bool(attrs, "zero_centered_gamma");
      const double eps = ir::attr_float(attrs, "eps");
      std::vector<T> mean(size_t(x.rows())), rstd(size_t(x.rows()));
      Tensor<T>& y = out(op, 0);
      if (op.kind == OpKind::LayerNorm) {
        ops::layernorm_forward<T>(x.data, in(op, 1).data, in(op, 2).data, x.cols(), eps,
                                  zero_centered, y.data, mean, rstd);
      } else {
        ops::rmsnorm_forward<T>(x.data, in(op, 1).data, x.cols(), eps, zero_centered, y.data, rstd);
      }
      // Saved statistics, when build-backward asked for them: (mean, rstd) or (rstd).
      if (op.results.size() == 3) {
        out(op, 1).data = mean;
        out(op, 2).data = rstd;
      } else if (op.results.size() == 2) {
        out(op, 1).data = rstd;
      }
      break;
    }
    case OpKind::Linear: {
      const Tensor<T>& x = in(op, 0);
      Tensor<T>& y = out(op, 0);
      const int64_t n = y.cols(), k = x.cols();
      ops::linear_forward<T>(x.data, in(op, 1).data, x.rows(), n, k, y.data);
      scale_result(y, operand_scale(op, 0) * operand_scale(op, 1));
      if (ir::attr_bool(attrs, "bias")) ops::add_bias<T>(y.data, in(op, 2).data, n);
      break;
    }
    case OpKind::LinearDgrad: {
      const Tensor<T>& dy = in(op, 0);
      const Tensor<T>& w = in(op, 1);
      Tensor<T>& dx = out(op, 0);
      const int64_t m = dy.rows(), n = dy.cols(), k = dx.cols();
      if (transposed[op.operands[1]]) {
        ops::linear_forward<T>(dy.data, w.data, m, k, n, dx.data);  // dx = dy (W^T)^T
      } else {
        ops::linear_dgrad<T>(dy.data, w.data, m, n, k, dx.data);
      }
      scale_result(dx, operand_scale(op, 0) * operand_scale(op, 1));
      break;
    }
    case OpKind::LinearWgrad: {
      const Tensor<T>& dy = in(op, 0);
      const Tensor<T>& x = in(op, 1);
      Tensor<T>& dw = out(op, 0);
      const int64_t n = dw.rows(), k = dw.cols();
      if (transposed[op.operands[0]] && transposed[op.operands[1]]) {
        // dy^T [N, M], x^T [K, M]; M counts every token (a [batch, seq] input too).
        ops::linear_forward<T>(dy.data, x.data, n, k, dy.numel() / n, dw.data);
      } else {
        OPFUSE_ASSERT(!transposed[op.operands[0]] && !transposed[op.operands[1]],
                      "wgrad of '{}' mixes transposed and row-wise operands", op.instance);
        ops::linear_wgrad<T>(dy.data, x.data, dy.rows(), n, k, dw.data);
      }
      scale_result(dw, operand_scale(op, 0) * operand_scale(op, 1));
      break;
    }
    case OpKind::Bias: {
      Tensor<T>& y = out(op, 0);
      y.data = in(op, 0).data;
      ops::add_bias<T>(y.data, in(op, 1).data, y.cols());
      break;
    }
    case OpKind::BiasGrad: {
      const Tensor<T>& dy = in(op, 0);
      ops::bias_grad<T>(dy.data, dy.cols(), out(op, 0).data);
      break;
    }
    case OpKind::LayerNormBackward:
    case OpKind::RMSNormBackward: {
      const bool zero_centered = ir::attr_bool(attrs, "zero_centered_gamma");
      const Tensor<T>& dy = in(op, 0);
      const Tensor<T>& x = in(op, 1);
      const Tensor<T>& gamma = in(op, 2);
      Tensor<T>& dx = out(op, 0);
      Tensor<T>& dgamma = out(op, 1);
      if (op.kind == OpKind::LayerNormBackward) {
        ops::layernorm_backward<T>(x.data, gamma.data, dy.data, in(op, 3).data, in(op, 4).data,
                                   x.cols(), zero_centered, dx.data, dgamma.data, out(op, 2).data);
      } else {
        ops::rmsnorm_backward<T>(x.data, gamma.data, dy.data, in(op, 3).data, x.cols(),
                                 zero_centered, dx.data, dgamma.data);
      }
      break;
    }
    case OpKind::AddExtraInput:
    case OpKind::GradAdd: {
      const Tensor<T>& a = in(op, 0);
      const Tensor<T>& b = values[op.operands.back()];
      Tensor<T>& y = out(op, 0);
      for (size_t i = 0; i < y.data.size(); ++i) y.data[i] = a.data[i] + b.data[i];
      break;
    }
    case OpKind::ConstantScale: {
      const T scale = T(ir::attr_float(attrs, "scale"));
      const Tensor<T>& x = in(op, 0);
      Tensor<T>& y = out(op, 0);
      for (size_t i = 0; i < y.data.size(); ++i) y.data[i] = x.data[i] * scale;
      break;
    }
    case OpKind::Quantize: {
      Tensor<T>& y = out(op, 0);
      y.data = in(op, 0).data;
      if (op.quantizer >= 0) fake_quantize_values<T>(quantizers.at(size_t(op.quantizer)), y.data);
      break;
    }
    case OpKind::CastFp8:
      cast_fp8(op);
      break;
    case OpKind::MakeExtraOutput:
    case OpKind::Identity:
    case OpKind::Reshape:
      out(op, 0).data = in(op, 0).data;
      break;
    case OpKind::Fused:
      internal_failure(__FILE__, __LINE__, "fused ops run through run_top");
  }
}

// A top-level op: a fused op runs its parts with no rounding in between; only the values that
// leave it (its results) are rounded to their storage dtype.
template <typename T>
void ReferenceExecutor<T>::State::run_top(const ir::Operation& op) {
  if (op.kind == OpKind::Fused) {
    for (const ir::Operation& part : op.parts) run_op(part);
  } else {
    run_op(op);
  }
  if (!options.round_outputs) return;
  for (ir::ValueId r : op.results) round_to_storage<T>(values[r].data, dtype(r));
}

template <typename T>
ReferenceExecutor<T>::ReferenceExecutor(const ir::Sequence& sequence, const Bindings& bindings,
                                        const ReferenceOptions& options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.seq = sequence;
  if (!s.seq.has_backward) {
    // Straight from the front end: lower it through the one compile driver, as written (no alias
    // elimination, no fusions: every op runs as its own reference).
    ir::Program program;
    program.sequences.push_back(std::move(s.seq));
    driver::CompileOptions unfused;
    unfused.disabled_passes = {"eliminate-aliases", "fuse-forward", "fuse-backward"};
    unfused.last_stage = driver::Stage::Passes;
    driver::CompileResult lowered =
        driver::compile_ir(std::move(program), nullptr, nullptr, unfused);
    OPFUSE_ASSERT(lowered.status == driver::CompileStatus::Ok, "lowering for the reference: {}",
                  lowered.error);
    s.seq = std::move(lowered.program.sequences.at(0));
  }
  s.options = options;
  std::vector<std::string> unbound;
  for (const std::string& symbol : s.seq.symbols()) {
    auto it = bindings.find(symbol);
    if (it == bindings.end()) {
      unbound.push_back(symbol);
    } else if (it->second <= 0) {
      throw ReferenceError(
          fmt::format("dimension '{}' of sequence '{}' is bound to {}; sizes must "
                      "be positive (e.g. --bind {}=64)",
                      symbol, s.seq.name, it->second, symbol));
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
                    s.seq.name, unbound.size() == 1 ? "" : "s", names, example));
  }
  for (const ir::Value& v : s.seq.values) s.shapes.push_back(bind_shape(v.type.shape, bindings));
  s.values.resize(s.seq.values.size());
  s.scale_inv.assign(s.seq.values.size(), 1.0f);
  s.transposed.assign(s.seq.values.size(), false);
  auto mark_transposed = [&](const ir::Operation& op) {
    if (op.kind == OpKind::CastFp8 && ir::attr_bool(op.attrs, "columnwise") &&
        s.seq.quantizers.at(size_t(op.quantizer)).columnwise_layout == plan::CopyLayout::Transposed)
      s.transposed[op.results.back()] = true;
  };
  for (const ir::Operation& op : s.seq.ops) {
    mark_transposed(op);
    for (const ir::Operation& part : op.parts) mark_transposed(part);
  }
  for (ir::ValueId p : s.seq.params) {
    s.param_names.push_back(s.seq.value(p).name);
    s.values[p] = s.zeros_like(p);
  }
  for (const ir::QuantizerDecl& q : s.seq.quantizers) {
    s.quantizers.push_back(make_quantizer(q.name, q.spec));
    if (s.seq.fp8_weights && q.role == ir::QuantizerRole::Weight) s.weight_codes[q.source] = {};
  }
}

template <typename T>
ReferenceExecutor<T>::~ReferenceExecutor() = default;
template <typename T>
ReferenceExecutor<T>::ReferenceExecutor(ReferenceExecutor&&) noexcept = default;

template <typename T>
const ir::Sequence& ReferenceExecutor<T>::sequence() const {
  return state_->seq;
}

template <typename T>
std::vector<std::vector<int64_t>> ReferenceExecutor<T>::input_shapes() const {
  std::vector<std::vector<int64_t>> out;
  for (ir::ValueId id : state_->seq.inputs) out.push_back(state_->shapes[id]);
  return out;
}

template <typename T>
std::vector<std::vector<int64_t>> ReferenceExecutor<T>::output_shapes() const {
  std::vector<std::vector<int64_t>> out;
  for (const ir::SequenceOutput& o : state_->seq.outputs) out.push_back(state_->shapes[o.value]);
  return out;
}

template <typename T>
const std::vector<std::string>& ReferenceExecutor<T>::param_names() const {
  return state_->param_names;
}

template <typename T>
Tensor<T>& ReferenceExecutor<T>::param(std::string_view name) {
  for (size_t i = 0; i < state_->param_names.size(); ++i)
    if (state_->param_names[i] == name) return state_->values[state_->seq.params[i]];
  throw ReferenceError(fmt::format("sequence '{}' has no parameter '{}'", state_->seq.name, name));
}

template <typename T>
void ReferenceExecutor<T>::params_changed() {
  State& s = *state_;
  for (ir::ValueId p : s.seq.params) {
    OPFUSE_ASSERT(s.values[p].shape == s.shapes[p], "parameter '{}' was given another shape",
                  s.seq.value(p).name);
    if (s.options.round_outputs) round_to_storage<T>(s.values[p].data, s.dtype(p));
  }
  // fp8_weights (TE's quantized_model_init): only the FP8 copy exists. Cast it now with its
  // weight quantizer; the parameter shows its dequantized value.
  for (size_t i = 0; i < s.seq.quantizers.size(); ++i) {
    const ir::QuantizerDecl& q = s.seq.quantizers[i];
    auto it = s.weight_codes.find(q.source);
    if (it == s.weight_codes.end()) continue;
    Tensor<T>& w = s.values[q.source];
    const std::vector<float> as_float(w.data.begin(), w.data.end());
    std::vector<float> codes(as_float.size());
    const float inv = quantize(s.quantizers[i], as_float, codes);
    for (size_t j = 0; j < codes.size(); ++j) w.data[j] = T(codes[j] * inv);
    it->second = {std::move(codes), inv};
  }
}

template <typename T>
std::vector<Tensor<T>> ReferenceExecutor<T>::forward(const std::vector<Tensor<T>>& inputs) {
  State& s = *state_;
  if (inputs.size() != s.seq.inputs.size())
    throw ReferenceError(fmt::format("sequence '{}' takes {} inputs, got {}", s.seq.name,
                                     s.seq.inputs.size(), inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::ValueId id = s.seq.inputs[i];
    if (inputs[i].shape != s.shapes[id] ||
        inputs[i].data.size() != Tensor<T>::zeros(s.shapes[id]).data.size())
      throw ReferenceError(fmt::format("input '{}' of sequence '{}' has the wrong shape",
                                       s.seq.value(id).name, s.seq.name));
    s.values[id] = inputs[i];
  }
  for (const ir::Operation& op : s.seq.ops)
    if (op.phase == ir::Phase::Forward) s.run_top(op);
  s.has_forward = true;
  std::vector<Tensor<T>> outputs;
  for (const ir::SequenceOutput& o : s.seq.outputs) outputs.push_back(s.values[o.value]);
  return outputs;
}

template <typename T>
Gradients<T> ReferenceExecutor<T>::backward(const std::vector<Tensor<T>>& output_grads) {
  State& s = *state_;
  OPFUSE_ASSERT(s.has_forward, "backward called before forward on sequence '{}'", s.seq.name);
  OPFUSE_ASSERT_EQ(output_grads.size(), s.seq.outputs.size());
  for (size_t k = 0; k < output_grads.size(); ++k) {
    const ir::ValueId id = s.seq.output_grads[k];
    if (output_grads[k].data.empty()) {
      s.values[id] = s.zeros_like(id);
      continue;
    }
    OPFUSE_ASSERT(output_grads[k].shape == s.shapes[id],
                  "gradient of output '{}' has another shape", s.seq.outputs[k].name);
    s.values[id] = output_grads[k];
  }
  for (const ir::Operation& op : s.seq.ops)
    if (op.phase == ir::Phase::Backward) s.run_top(op);
  Gradients<T> out;
  for (ir::ValueId g : s.seq.input_grads)
    out.inputs.push_back(g == ir::kNoValue ? Tensor<T>{} : s.values[g]);
  for (size_t i = 0; i < s.seq.inputs.size(); ++i)
    if (out.inputs[i].data.empty()) out.inputs[i] = s.zeros_like(s.seq.inputs[i]);
  for (ir::ValueId g : s.seq.param_grads) out.params.push_back(s.values[g]);
  return out;
}

template <typename T>
void ReferenceExecutor<T>::sgd_step(const Gradients<T>& grads, double lr) {
  State& s = *state_;
  OPFUSE_ASSERT_EQ(grads.params.size(), s.seq.params.size());
  for (size_t i = 0; i < grads.params.size(); ++i) {
    Tensor<T>& p = s.values[s.seq.params[i]];
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
