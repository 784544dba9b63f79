#include "ir/backward_rules.h"

#include <fmt/format.h>

#include "support/assert.h"

namespace opfuse::ir {

namespace {

const TensorType& type_of(BackwardBuilder& b, ValueId v) { return b.sequence().value(v).type; }

// [rows..., cols] -> fp32[rows...]: one statistic per row.
TensorType row_stat_type(const TensorType& x) {
  Shape rows(x.shape.begin(), x.shape.end() - 1);
  return TensorType{DType::FP32, std::move(rows)};
}

// One backward op of `kind` reading dy, x and the op's learned parameters (its operands after x),
// giving dx and each parameter's gradient, which accumulate into them.
void input_and_param_grads(BackwardBuilder& b, const Operation& f, ValueId dy, OpKind kind) {
  const ValueId x = f.operands[0];
  std::vector<ValueId> operands = {dy, x};
  std::vector<TensorType> types = {type_of(b, x)};
  for (size_t i = 1; i < f.operands.size(); ++i) {
    operands.push_back(f.operands[i]);
    types.push_back(type_of(b, f.operands[i]));
  }
  const std::vector<ValueId> grads =
      b.emit(f, kind, std::move(operands), std::move(types), f.attrs);
  b.accumulate(x, grads[0]);
  for (size_t i = 1; i < f.operands.size(); ++i) b.accumulate(f.operands[i], grads[i]);
}

}  // namespace

namespace backward {

void layernorm(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId x = f.operands[0], gamma = f.operands[1], beta = f.operands[2];
  const TensorType stat = row_stat_type(type_of(b, x));
  const std::vector<ValueId> saved = b.save_forward_results(f, {stat, stat});
  const auto r = b.emit(f, OpKind::LayerNormBackward, {dy, x, gamma, saved[0], saved[1]},
                        {type_of(b, x), type_of(b, gamma), type_of(b, beta)}, f.attrs);
  b.accumulate(x, r[0]);
  b.accumulate(gamma, r[1]);
  b.accumulate(beta, r[2]);
}

void rmsnorm(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId x = f.operands[0], gamma = f.operands[1];
  const std::vector<ValueId> saved = b.save_forward_results(f, {row_stat_type(type_of(b, x))});
  const auto r = b.emit(f, OpKind::RMSNormBackward, {dy, x, gamma, saved[0]},
                        {type_of(b, x), type_of(b, gamma)}, f.attrs);
  b.accumulate(x, r[0]);
  b.accumulate(gamma, r[1]);
}

void linear(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId x = f.operands[0], weight = f.operands[1];
  // Bias first: TE takes dbias from the high-precision gradient, before any FP8 cast of dy.
  if (attr_bool(f.attrs, "bias")) {
    const ValueId bias_param = f.operands[2];
    AttrList attrs{{"size", attr_int(f.attrs, "out")}};
    b.accumulate(bias_param, b.emit(f, OpKind::BiasGrad, {dy}, {type_of(b, bias_param)}, attrs)[0]);
  }
  ValueId dx = b.emit(f, OpKind::LinearDgrad, {dy, weight}, {type_of(b, x)}, f.attrs)[0];
  // A column-parallel rank's dx is its part of the sum over the output features: the ranks'
  // parts are summed, unless x came from an all_gather, whose backward (reduce_scatter) sums them
  // (TE's column-parallel Linear: all-reduce of dgrad, or reduce-scatter under sequence
  // parallelism).
  if (linear_parallel(f.attrs) == LinearParallel::Column && b.sequence().parallel.active()) {
    const int32_t producer = b.sequence().value(x).producer;
    const bool gathered =
        producer >= 0 && b.sequence().ops[size_t(producer)].kind == OpKind::AllGather;
    if (!gathered) dx = b.emit(f, OpKind::AllReduce, {dx}, {type_of(b, x)}, {})[0];
  }
  b.accumulate(x, dx);
  b.accumulate(weight, b.emit(f, OpKind::LinearWgrad, {dy, x}, {type_of(b, weight)}, f.attrs)[0]);
}

void bias(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId bias_param = f.operands[1];
  b.accumulate(bias_param, b.emit(f, OpKind::BiasGrad, {dy}, {type_of(b, bias_param)}, f.attrs)[0]);
  b.accumulate(f.operands[0], dy);
}

// Every pointwise op: its backward kind names the definition (compiler/ir/pointwise_ops.h); the
// attributes are the forward's (the constants the expression bakes in). A user-defined op's
// learned parameters (operands after x) are read by its backward too, which also gives their
// gradients, each summed over the rows (as a bias's).
void pointwise(BackwardBuilder& b, const Operation& f, ValueId dy) {
  input_and_param_grads(b, f, dy, pointwise_backward_kind(*pointwise_def(f.kind)));
}

// A norm-like user-defined op (compiler/ir/row_expr.h): one backward op reads dy, x and the
// learned parameters, recomputes the reductions (nothing is saved: the statistics are the op's
// own, any number of them) and gives dx and each parameter's gradient summed over the rows.
void user_norm(BackwardBuilder& b, const Operation& f, ValueId dy) {
  input_and_param_grads(b, f, dy, OpKind::UserNormBackward);
}

// A residual add: both the stream and the extra input receive the gradient unchanged.
void add_extra_input(BackwardBuilder& b, const Operation& f, ValueId dy) {
  b.accumulate(f.operands[0], dy);
  b.accumulate(f.operands.back(), dy);
}

void pass_through(BackwardBuilder& b, const Operation& f, ValueId dy) {
  b.accumulate(f.operands[0], dy);
}

void constant_scale(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId x = f.operands[0];
  b.accumulate(x, b.emit(f, OpKind::ConstantScale, {dy}, {type_of(b, x)}, f.attrs)[0]);
}

void reshape(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId x = f.operands[0];
  AttrList attrs{{"shape", type_of(b, x).shape}};
  b.accumulate(x, b.emit(f, OpKind::Reshape, {dy}, {type_of(b, x)}, std::move(attrs))[0]);
}

// TE's Quantize op: in backward the gradient is cast too when `backward = true` (its quantizer
// comes from plan-quantization); otherwise the cast is the identity for the gradient.
void quantize(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId x = f.operands[0];
  if (!attr_bool(f.attrs, "backward")) {
    b.accumulate(x, dy);
    return;
  }
  b.accumulate(x, b.emit(f, OpKind::Quantize, {dy}, {type_of(b, x)}, f.attrs)[0]);
}

// all_reduce sums partial tensors into one every rank holds: each rank's gradient of its part
// is the whole gradient (Megatron's g operator).
void all_reduce(BackwardBuilder& b, const Operation& f, ValueId dy) {
  b.accumulate(f.operands[0], dy);
}

void all_gather(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId x = f.operands[0];
  b.accumulate(x, b.emit(f, OpKind::ReduceScatter, {dy}, {type_of(b, x)}, f.attrs)[0]);
}

void reduce_scatter(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId x = f.operands[0];
  b.accumulate(x, b.emit(f, OpKind::AllGather, {dy}, {type_of(b, x)}, f.attrs)[0]);
}

// Dropout: backward reads the mask the forward saved as bits (never redraws it).
void dropout(BackwardBuilder& b, const Operation& f, ValueId dy) {
  const ValueId x = f.operands[0];
  const std::vector<ValueId> saved = b.save_forward_results(f, {dropout_mask_type(type_of(b, x))});
  b.accumulate(x, b.emit(f, OpKind::DropoutBackward, {dy, saved[0]}, {type_of(b, x)}, f.attrs)[0]);
}

}  // namespace backward

TensorType dropout_mask_type(const TensorType& x) {
  Shape shape = x.shape;
  OPFUSE_ASSERT(!shape.empty() && !shape.back().is_symbolic(),
                "dropout's mask needs a known last dimension");
  shape.back() = Dim::known((shape.back().size + 31) / 32);
  return TensorType{DType::FP32, std::move(shape)};
}

BackwardRule backward_rule(OpKind kind) {
  const OpInfo& info = op_info(kind);
  if (info.backward == nullptr) {
    internal_failure(__FILE__, __LINE__,
                     fmt::format("op '{}' has no backward rule (its entry in "
                                 "compiler/ir/op_table.cpp names none)",
                                 info.name));
  }
  return info.backward;
}

}  // namespace opfuse::ir
