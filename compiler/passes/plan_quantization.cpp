#include "passes/plan_quantization.h"

#include <fmt/format.h>

#include <map>

#include "ir/rewrite.h"
#include "support/assert.h"

namespace opfuse::passes {

namespace {

using namespace opfuse::ir;

DType format_for(const Recipe& r, QuantizerRole role) {
  const bool gradient = role == QuantizerRole::GradOutput || role == QuantizerRole::GradInput;
  return gradient && r.format == Fp8Format::Hybrid ? DType::E5M2 : DType::E4M3;
}

class Planner {
 public:
  explicit Planner(Sequence& s) : s_(s), before_(s.ops.size()) {}

  void run() {
    for (size_t i = 0; i < s_.ops.size(); ++i) {
      const Operation& op = s_.ops[i];
      if (op.phase != Phase::Forward) continue;
      if (op.kind == OpKind::Linear) plan_linear(i);
      if (op.kind == OpKind::Quantize) plan_quantize(i);
    }
    std::vector<Operation> ops;
    for (size_t i = 0; i < s_.ops.size(); ++i) {
      for (Operation& cast : before_[i]) ops.push_back(std::move(cast));
      ops.push_back(std::move(s_.ops[i]));
    }
    s_.ops = std::move(ops);
    recompute_producers(s_);
  }

 private:
  // Index of the backward op of `kind` made for forward layer `instance`; -1 if none.
  int find_backward(OpKind kind, const std::string& instance) const {
    for (size_t i = 0; i < s_.ops.size(); ++i)
      if (s_.ops[i].phase == Phase::Backward && s_.ops[i].kind == kind &&
          s_.ops[i].instance == instance)
        return int(i);
    return -1;
  }

  // A quantizer for `source` and the cast_fp8 (placed before op `position`) that makes its
  // row-wise and/or column-wise copies; returns {rowwise, columnwise} (kNoValue where not made).
  std::pair<ValueId, ValueId> add_cast(const Operation& consumer, QuantizerRole role,
                                       ValueId source, bool rowwise, bool columnwise,
                                       size_t position) {
    QuantizerDecl q;
    q.name = fmt::format("{}.{}", consumer.instance, quantizer_role_name(role));
    q.role = role;
    q.format = format_for(s_.recipe, role);
    q.source = source;
    q.rowwise = rowwise;
    q.columnwise = columnwise;
    const int32_t index = int32_t(s_.quantizers.size());
    s_.quantizers.push_back(q);

    Operation cast;
    cast.kind = OpKind::CastFp8;
    cast.phase = s_.ops[position].phase;
    cast.operands = {source};
    cast.attrs = {{"rowwise", rowwise}, {"columnwise", columnwise}};
    cast.instance = q.name;
    cast.loc = consumer.loc;
    cast.quantizer = index;
    const TensorType type = s_.value(source).type;  // a copy: add_value grows s_.values
    ValueId row = kNoValue, col = kNoValue;
    if (rowwise) {
      row = s_.add_value(ValueKind::Result, TensorType{q.format, type.shape});
      s_.values[row].quantizer = index;
      cast.results.push_back(row);
    }
    if (columnwise) {
      col = s_.add_value(ValueKind::Result, TensorType{q.format, transposed_shape(type.shape)});
      s_.values[col].quantizer = index;
      cast.results.push_back(col);
    }
    before_[position].push_back(std::move(cast));
    return {row, col};
  }

  void plan_linear(size_t i) {
    const Operation fprop = s_.ops[i];  // a copy: add_cast grows s_.values, not s_.ops
    const int dgrad = find_backward(OpKind::LinearDgrad, fprop.instance);
    const int wgrad = find_backward(OpKind::LinearWgrad, fprop.instance);
    const ValueId x = fprop.operands[0], w = fprop.operands[1];
    // wgrad (dW = dy^T x) reads x and dy column-wise; dgrad (dx = dy W) reads W column-wise.
    const auto [xq, xq_t] = add_cast(fprop, QuantizerRole::Input, x, true, wgrad >= 0, i);
    const auto [wq, wq_t] = add_cast(fprop, QuantizerRole::Weight, w, true, dgrad >= 0, i);
    s_.ops[i].operands[0] = xq;
    s_.ops[i].operands[1] = wq;
    if (dgrad < 0 && wgrad < 0) return;
    const int first = dgrad >= 0 && (wgrad < 0 || dgrad < wgrad) ? dgrad : wgrad;
    const ValueId dy = s_.ops[size_t(first)].operands[0];
    const auto [dyq, dyq_t] =
        add_cast(fprop, QuantizerRole::GradOutput, dy, dgrad >= 0, wgrad >= 0, size_t(first));
    if (dgrad >= 0) s_.ops[size_t(dgrad)].operands = {dyq, wq_t};
    if (wgrad >= 0) s_.ops[size_t(wgrad)].operands = {dyq_t, xq_t};
  }

  // TE's Quantize op keeps its dtype: the executor casts and dequantizes with these quantizers.
  void plan_quantize(size_t i) {
    Operation& op = s_.ops[i];
    auto add = [&](Operation& target, QuantizerRole role) {
      QuantizerDecl q;
      q.name = fmt::format("{}.{}", op.instance, quantizer_role_name(role));
      q.role = role;
      q.format = format_for(s_.recipe, role);
      q.source = target.operands[0];
      q.rowwise = true;
      target.quantizer = int32_t(s_.quantizers.size());
      s_.quantizers.push_back(q);
    };
    if (attr_bool(op.attrs, "forward")) add(op, QuantizerRole::Output);
    if (attr_bool(op.attrs, "backward")) {
      for (Operation& b : s_.ops)
        if (b.phase == Phase::Backward && b.kind == OpKind::Quantize && b.instance == op.instance)
          add(b, QuantizerRole::GradInput);
    }
  }

  Sequence& s_;
  std::vector<std::vector<Operation>> before_;  // casts to insert before each op
};

}  // namespace

bool plan_quantization(Program& program) {
  bool changed = false;
  for (Sequence& s : program.sequences) {
    if (!s.recipe.is_fp8() || !s.quantizers.empty()) continue;
    Planner(s).run();
    changed |= !s.quantizers.empty();
  }
  return changed;
}

}  // namespace opfuse::passes
