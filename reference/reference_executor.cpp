#include "reference_executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>
#include <utility>

#include "driver/compile.h"
#include "numerics.h"
#include "reference_kernels.h"
#include "support/assert.h"

namespace opfuse::cpu {

namespace {

using ir::OpKind;

std::vector<int64_t> bind_shape(const ir::Shape& shape, const Bindings& bindings) {
  std::vector<int64_t> out;
  for (const ir::Dim& d : shape)
    out.push_back(d.is_symbolic() ? bindings.find(d.symbol)->second / d.divisor : d.size);
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

}  // namespace

// The kernels' context (reference_kernels.h) and what only the executor keeps.
template <typename T>
struct ReferenceExecutor<T>::State : ReferenceContext<T> {
  ReferenceOptions options;
  std::vector<std::string> param_names;
  bool has_forward = false;
  // Note "Quantized boundaries": the quantized input's copies (set_quantized_input), and whether
  // the last forward was a training one (an inference forward makes no column-wise output copy).
  std::optional<QuantizedTensor> quantized_input;
  bool last_forward_training = false;

  // The boundary's scales as the sequence's spec gives them, and its logical matrix.
  ScaleLayout boundary_layout(const ir::QuantizerDecl& q) const {
    if (q.spec.per_tensor()) return ScaleLayout::Tensor;
    if (q.spec.micro_scaled()) return q.spec.nvfp4() ? ScaleLayout::Nvfp4 : ScaleLayout::Mxfp8;
    return q.spec.scaling == plan::ScalingKind::Block2D ? ScaleLayout::Block2D
                                                        : ScaleLayout::Block1D;
  }
  // NVFP4: whether the column-wise copy a linear's weight gradient reads is Hadamard-transformed
  // (the boundary quantizer's rht: plan-quantization's quantized_input).
  bool boundary_hadamard() const {
    const ir::Value& in = this->seq.value(this->seq.inputs.at(0));
    return in.quantizer >= 0 && this->seq.quantizers.at(size_t(in.quantizer)).spec.nvfp4() &&
           this->seq.quantizers.at(size_t(in.quantizer)).spec.rht;
  }
  void load_quantized_input();

  ir::DType dtype(ir::ValueId id) const { return this->seq.value(id).type.dtype; }
  void run_op(const ir::Operation& op);
  void run_top(const ir::Operation& op);
};

template <typename T>
void ReferenceExecutor<T>::State::run_op(const ir::Operation& op) {
  const ReferenceKernel<T> kernel = reference_kernel<T>(op.kind);
  OPFUSE_ASSERT(kernel != nullptr, "op '{}' ({}) has no reference kernel",
                ir::op_info(op.kind).name, op.instance);
  kernel(*this, op);
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
  for (ir::ValueId r : op.results) round_to_storage<T>(this->values[r].data, dtype(r));
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
  // `tokens / tp`: a rank's share must be whole.
  for (const ir::Value& v : s.seq.values) {
    for (const ir::Dim& d : v.type.shape) {
      if (d.is_symbolic() && bindings.find(d.symbol)->second % d.divisor != 0)
        throw ReferenceError(fmt::format(
            "dimension '{}' of sequence '{}' is bound to {}, which does not divide into {} "
            "equal shares ({} is {}); bind a multiple of {}",
            d.symbol, s.seq.name, bindings.find(d.symbol)->second, d.divisor,
            v.name.empty() ? "a value" : v.name, ir::type_string(v.type), d.divisor));
    }
  }
  if (s.seq.parallel.active() &&
      (options.group == nullptr || options.group->size() != s.seq.parallel.tp))
    throw ReferenceError(fmt::format(
        "sequence '{}' is tensor-parallel over tp = {} ranks: run one executor per rank with a "
        "group of {} (cpu::SimulatedGroup){}",
        s.seq.name, s.seq.parallel.tp, s.seq.parallel.tp,
        options.group ? fmt::format(", not {}", options.group->size()) : ""));
  s.group = s.seq.parallel.active() ? options.group : nullptr;
  for (const ir::Value& v : s.seq.values) s.shapes.push_back(bind_shape(v.type.shape, bindings));
  s.values.resize(s.seq.values.size());
  s.scale_inv.assign(s.seq.values.size(), 1.0f);
  s.transposed.assign(s.seq.values.size(), false);
  auto mark_transposed = [&](const ir::Operation& op) {
    if ((op.kind == OpKind::CastFp8 && ir::attr_bool(op.attrs, "columnwise") &&
         s.seq.quantizers.at(size_t(op.quantizer)).columnwise_layout ==
             plan::CopyLayout::Transposed) ||
        op.kind == OpKind::Fp8Transpose)
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
    s.quantizers.back().index = uint32_t(s.quantizers.size() - 1);
    if (s.group) {
      // Current scaling casts with the amax of the whole tensor, the max over the ranks' shares.
      Collectives* group = s.group;
      s.quantizers.back().reduce_amax = [group](float amax) {
        double v = amax;
        group->all_reduce(std::span(&v, 1), ReduceKind::Max);
        return static_cast<float>(v);
      };
    }
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
    if (s.quantizers[i].block_scaled) {
      // Block scales: every forward's cast starts from the weight as it was at this change (the
      // GPU casts it once and keeps both copies); the parameter shows its row-wise dequantization.
      std::vector<float> shown = as_float;
      fake_quantize(s.quantizers[i], shown, w.cols());
      std::copy(shown.begin(), shown.end(), w.data.begin());
      it->second = {as_float, 0.0f};
      continue;
    }
    std::vector<float> codes(as_float.size());
    const float inv = quantize(s.quantizers[i], as_float, codes);
    for (size_t j = 0; j < codes.size(); ++j) w.data[j] = T(codes[j] * inv);
    it->second = {std::move(codes), inv};
  }
}

template <typename T>
std::vector<Tensor<T>> ReferenceExecutor<T>::forward_inference(
    const std::vector<Tensor<T>>& inputs) {
  state_->training = false;
  std::vector<Tensor<T>> outputs;
  try {
    outputs = forward(inputs);
  } catch (...) {
    state_->training = true;
    throw;
  }
  state_->training = true;
  // Its values are no training forward's: backward must not follow it.
  state_->has_forward = false;
  state_->dropout_masks.clear();
  return outputs;
}

template <typename T>
std::vector<Tensor<T>> ReferenceExecutor<T>::forward(const std::vector<Tensor<T>>& inputs) {
  State& s = *state_;
  if (inputs.size() != s.seq.inputs.size())
    throw ReferenceError(fmt::format("sequence '{}' takes {} inputs, got {}", s.seq.name,
                                     s.seq.inputs.size(), inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::ValueId id = s.seq.inputs[i];
    if (i == 0 && s.seq.quantized_input) {
      s.load_quantized_input();
      continue;
    }
    if (inputs[i].shape != s.shapes[id] ||
        inputs[i].data.size() != Tensor<T>::zeros(s.shapes[id]).data.size())
      throw ReferenceError(fmt::format("input '{}' of sequence '{}' has the wrong shape",
                                       s.seq.value(id).name, s.seq.name));
    s.values[id] = inputs[i];
  }
  for (const ir::Operation& op : s.seq.ops)
    if (op.phase == ir::Phase::Forward) s.run_top(op);
  s.has_forward = true;
  s.last_forward_training = s.training;
  std::vector<Tensor<T>> outputs;
  for (const ir::SequenceOutput& o : s.seq.outputs) outputs.push_back(s.values[o.value]);
  if (s.seq.quantized_output) {
    const QuantizedTensor q = quantized_output();
    const std::vector<float> decoded = dequantize_tensor(q);
    std::copy(decoded.begin(), decoded.end(), outputs[0].data.begin());
  }
  return outputs;
}

// Note "Quantized boundaries" (docs/architecture.md): the input's row-wise copy and its
// column-wise one become the FP8 values the linears read, as a cast would have left them (codes
// as numbers with their scale_inv, or the block copies with their grids).
template <typename T>
void ReferenceExecutor<T>::State::load_quantized_input() {
  if (!quantized_input)
    throw ReferenceError(
        fmt::format("input '{}' of sequence '{}' is quantized: give its copies "
                    "with set_quantized_input() before forward",
                    this->seq.value(this->seq.inputs[0]).name, this->seq.name));
  const QuantizedTensor& q = *quantized_input;
  const ir::ValueId in = this->seq.inputs[0];
  const ir::ValueId col = this->seq.quantized_input->columnwise;
  const ir::QuantizerDecl& decl = this->seq.quantizers.at(size_t(this->seq.value(in).quantizer));
  if (micro_scaled(q.scales)) {
    // The codes as the caller gave them; the consumer's emulated casts decode them.
    auto load_micro = [&](ir::ValueId v, bool columnwise) {
      MicroCopy copy;
      copy.nvfp4 = q.scales == ScaleLayout::Nvfp4;
      if (copy.nvfp4) {
        copy.fp4 = nvfp4_copy(q, columnwise);
      } else {
        copy.fp8 = mxfp8_copy(q, columnwise);
      }
      this->values[v] = this->zeros_like(v);
      this->micro_codes[v] = std::move(copy);
    };
    load_micro(in, false);
    if (col != ir::kNoValue && decl.usages.columnwise) load_micro(col, true);
    return;
  }
  const bool two_d = q.scales == ScaleLayout::Block2D;
  auto load = [&](ir::ValueId v, const std::vector<uint8_t>& bits, const std::vector<float>& grid,
                  int64_t rows, int64_t cols) {
    Tensor<T>& t = this->values[v];
    t = this->zeros_like(v);
    for (size_t i = 0; i < bits.size(); ++i) t.data[i] = T(fp8_to_float(bits[i], q.format));
    if (q.scales == ScaleLayout::Tensor) {
      this->scale_inv[v] = q.scale_inv.at(0);
      return;
    }
    BlockQuantizedCopy copy;
    copy.rows = rows;
    copy.cols = cols;
    copy.data = bits;
    copy.scale_inv = grid;
    this->block_scaled[v] = {std::move(copy), two_d};
  };
  load(in, q.rowwise, q.scale_inv, q.rows, q.cols);
  if (col != ir::kNoValue && decl.usages.columnwise) {
    load(col, q.columnwise, q.columnwise_scale_inv, q.cols, q.rows);
    this->transposed[col] = decl.columnwise_layout == plan::CopyLayout::Transposed;
  }
}

template <typename T>
void ReferenceExecutor<T>::set_quantized_input(const QuantizedTensor& q) {
  State& s = *state_;
  if (!s.seq.quantized_input)
    throw ReferenceError(fmt::format("sequence '{}' has no quantized input", s.seq.name));
  const ir::ValueId in = s.seq.inputs[0];
  const std::string& name = s.seq.value(in).name;
  const int quantizer = s.seq.value(in).quantizer;
  OPFUSE_ASSERT(quantizer >= 0, "the quantized input '{}' was not planned", name);
  const ir::QuantizerDecl& decl = s.seq.quantizers.at(size_t(quantizer));
  const std::vector<int64_t>& shape = s.shapes[in];
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  const int64_t cols = shape.back(), rows = elements / cols;
  const Fp8Format format = decl.format() == ir::DType::E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  std::string problem = quantized_tensor_problem(q);
  if (problem.empty() && (q.rows != rows || q.cols != cols))
    problem = fmt::format("it is [{}, {}], the input [{}, {}]", q.rows, q.cols, rows, cols);
  if (problem.empty() && q.format != format && q.scales != ScaleLayout::Nvfp4)
    problem = "its format is not the input's";
  if (problem.empty() && q.scales != s.boundary_layout(decl))
    problem = fmt::format("its scales are {}, the input's {}", scale_layout_name(q.scales),
                          scale_layout_name(s.boundary_layout(decl)));
  if (problem.empty() && q.scales == ScaleLayout::Nvfp4 && !q.columnwise.empty() &&
      q.hadamard != s.boundary_hadamard())
    problem = s.boundary_hadamard() ? "its column-wise copy is not Hadamard-transformed"
                                    : "its column-wise copy is Hadamard-transformed";
  if (problem.empty() && q.rowwise.empty()) problem = "it has no row-wise copy";
  if (problem.empty() && decl.usages.columnwise && q.columnwise.empty())
    problem = "it has no column-wise copy";
  if (!problem.empty())
    throw ReferenceError(
        fmt::format("quantized input '{}' of sequence '{}': {}", name, s.seq.name, problem));
  s.quantized_input = q;
}

template <typename T>
void ReferenceExecutor<T>::quantize_input(const Tensor<T>& x) {
  State& s = *state_;
  if (!s.seq.quantized_input)
    throw ReferenceError(fmt::format("sequence '{}' has no quantized input", s.seq.name));
  const ir::ValueId in = s.seq.inputs[0];
  const ir::QuantizerDecl& decl = s.seq.quantizers.at(size_t(s.seq.value(in).quantizer));
  std::vector<float> values(x.data.begin(), x.data.end());
  round_to_bf16(values);  // the tensor a bf16 producer would quantize
  const int64_t cols = x.shape.back(), rows = int64_t(values.size()) / cols;
  const Fp8Format format = decl.format() == ir::DType::E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  float amax = 0.0f;
  for (const float v : values) amax = std::fmax(amax, std::fabs(v));
  const auto epsilon = static_cast<float>(decl.spec.epsilon);
  const float scale =
      compute_current_scale(amax, decl.spec.fp8_max(), epsilon, decl.spec.power_of_2_scale).scale;
  set_quantized_input(quantize_tensor(values, rows, cols, format, s.boundary_layout(decl), true,
                                      decl.usages.columnwise, scale, decl.spec.power_of_2_scale,
                                      epsilon, s.boundary_hadamard()));
}

template <typename T>
QuantizedTensor ReferenceExecutor<T>::quantized_output() const {
  const State& s = *state_;
  if (!s.seq.quantized_output)
    throw ReferenceError(fmt::format("sequence '{}' has no quantized output", s.seq.name));
  if (!s.has_forward && s.values[s.seq.outputs[0].value].data.empty())
    throw ReferenceError(fmt::format("quantized output '{}' of sequence '{}' before a forward",
                                     s.seq.outputs[0].name, s.seq.name));
  const ir::ValueId row = s.seq.outputs[0].value;
  const ir::ValueId col = s.seq.quantized_output->columnwise;
  const ir::QuantizerDecl& decl = s.seq.quantizers.at(size_t(s.seq.value(row).quantizer));
  QuantizedTensor q;
  q.format = decl.format() == ir::DType::E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  q.scales = s.boundary_layout(decl);
  q.cols = s.shapes[row].back();
  q.rows = int64_t(s.values[row].data.size()) / q.cols;
  if (micro_scaled(q.scales)) {
    auto take_micro = [&](ir::ValueId v, std::vector<uint8_t>& bits, std::vector<uint8_t>& scales,
                          float& tensor_scale) {
      const MicroCopy& copy = s.micro_codes.at(v);
      bits = copy.nvfp4 ? copy.fp4.data : copy.fp8.data;
      scales = copy.nvfp4 ? copy.fp4.scales : copy.fp8.scales;
      tensor_scale = copy.nvfp4 ? copy.fp4.tensor_scale : 1.0f;
      if (copy.nvfp4 && copy.fp4.params.rht) q.hadamard = true;
    };
    take_micro(row, q.rowwise, q.block_scales, q.tensor_scale);
    if (col != ir::kNoValue && s.last_forward_training)
      take_micro(col, q.columnwise, q.columnwise_block_scales, q.columnwise_tensor_scale);
    return q;
  }
  auto take = [&](ir::ValueId v, std::vector<uint8_t>& bits, std::vector<float>& grid) {
    if (q.scales != ScaleLayout::Tensor) {
      const BlockScaled& b = s.block_scaled.at(v);
      bits = b.copy.data;
      grid = b.copy.scale_inv;
      return;
    }
    bits.resize(s.values[v].data.size());
    for (size_t i = 0; i < bits.size(); ++i)
      bits[i] = float_to_fp8(float(s.values[v].data[i]), q.format);
    grid = {s.scale_inv[v]};
  };
  take(row, q.rowwise, q.scale_inv);
  if (col != ir::kNoValue && s.last_forward_training) {
    std::vector<float> unused;
    take(col, q.columnwise, q.scales == ScaleLayout::Tensor ? unused : q.columnwise_scale_inv);
  }
  return q;
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
  for (size_t i = 0; i < state_->quantizers.size(); ++i) {
    const Quantizer& q = state_->quantizers[i];
    const plan::QuantSpec& spec = state_->seq.quantizers.at(i).spec;
    out.push_back({q.name, q.format, q.state.amax_history, q.state.scale, q.state.scale_inv,
                   std::string(plan::dtype_name(spec.format)), spec.has_tensor_scale()});
  }
  return out;
}

template <typename T>
std::vector<BlockCopySummary> ReferenceExecutor<T>::block_summaries() const {
  std::vector<BlockCopySummary> out;
  for (const auto& [key, summary] : state_->block_summaries) out.push_back(summary);
  return out;
}

template <typename T>
const std::vector<debug::TensorMoments>& ReferenceExecutor<T>::stat_records() const {
  return state_->stat_records;
}

template <typename T>
const std::vector<debug::CapturedTensor>& ReferenceExecutor<T>::captures() const {
  return state_->captures;
}

template <typename T>
void ReferenceExecutor<T>::set_quantizer_states(const std::vector<QuantizerInfo>& states) {
  for (Quantizer& q : state_->quantizers) {
    for (const QuantizerInfo& s : states) {
      if (s.name != q.name || s.format != q.format ||
          s.amax_history.size() != q.state.amax_history.size()) {
        continue;
      }
      q.state.amax_history = s.amax_history;
      q.state.scale = s.scale;
      q.state.scale_inv = s.scale_inv;
    }
  }
}

template <typename T>
void ReferenceExecutor<T>::step() {
  // Every per-tensor quantizer's amax of this step, max-reduced over the tensor-parallel ranks,
  // then over the data-parallel replicas (the max over all of them), as the GPU reduces its one
  // array of amaxes: delayed scaling derives its next scale from it; a current-scaling amax was
  // used already (over the ranks it is the reduced one anyway) and is only reported.
  for (Collectives* group : {state_->group, state_->options.amax_group}) {
    if (group == nullptr) continue;
    std::vector<double> amax;
    for (const Quantizer& q : state_->quantizers)
      if (!q.block_scaled) amax.push_back(q.state.amax_history.at(0));
    group->all_reduce(amax, ReduceKind::Max);
    size_t i = 0;
    for (Quantizer& q : state_->quantizers)
      if (!q.block_scaled) q.state.amax_history[0] = static_cast<float>(amax[i++]);
  }
  for (Quantizer& q : state_->quantizers) end_step(q);
  ++state_->step;  // dropout draws the next step's masks
}

template <typename T>
uint32_t ReferenceExecutor<T>::dropout_step() const {
  return state_->step;
}

template <typename T>
const std::vector<uint32_t>& ReferenceExecutor<T>::dropout_mask(std::string_view instance) const {
  const State& s = *state_;
  for (const ir::Operation& op : s.seq.ops) {
    if (op.kind != OpKind::Dropout || op.instance != instance) continue;
    const auto it = s.dropout_masks.find(op.results.size() > 1 ? op.results[1] : op.results[0]);
    if (it == s.dropout_masks.end()) break;
    return it->second;
  }
  throw ReferenceError(
      fmt::format("sequence '{}' has no dropout mask of '{}' (no dropout of "
                  "that name, or no training forward yet)",
                  s.seq.name, instance));
}

template class ReferenceExecutor<float>;
template class ReferenceExecutor<double>;

}  // namespace opfuse::cpu
