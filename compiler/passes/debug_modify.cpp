#include "passes/debug_modify.h"

#include <fmt/format.h>

#include <map>

#include "ir/rewrite.h"

namespace opfuse::passes {

namespace {

using namespace opfuse::ir;

// The GEMM op of `m`'s layer and the index of the operand it modifies; {-1, 0} if the sequence
// has no such GEMM or operand.
std::pair<int, size_t> find_operand(const Sequence& s, const TensorModification& m) {
  OpKind kind = OpKind::Linear;
  Phase phase = Phase::Forward;
  size_t operand = 0;
  switch (m.gemm) {
    case plan::GemmRole::Fprop:  // (x, W)
      if (m.tensor == QuantizerRole::GradOutput) return {-1, 0};
      operand = m.tensor == QuantizerRole::Weight ? 1 : 0;
      break;
    case plan::GemmRole::Dgrad:  // (dy, W)
      kind = OpKind::LinearDgrad;
      phase = Phase::Backward;
      if (m.tensor == QuantizerRole::Input) return {-1, 0};
      operand = m.tensor == QuantizerRole::Weight ? 1 : 0;
      break;
    case plan::GemmRole::Wgrad:  // (dy, x)
      kind = OpKind::LinearWgrad;
      phase = Phase::Backward;
      if (m.tensor == QuantizerRole::Weight) return {-1, 0};
      operand = m.tensor == QuantizerRole::Input ? 1 : 0;
      break;
  }
  const int gemm = find_layer_op(s, kind, phase, m.layer);
  if (gemm < 0 || operand >= s.ops[size_t(gemm)].operands.size()) return {-1, 0};
  return {gemm, operand};
}

// TE's FakeQuant: scale = fp8_max / amax with no epsilon (amax 0, Inf or NaN: scale 1).
plan::QuantSpec fake_quant_spec(DType format) {
  plan::QuantSpec spec;
  spec.scaling = plan::ScalingKind::Current;
  spec.format = format;
  spec.epsilon = 0.0;
  spec.power_of_2_scale = false;
  return spec;
}

bool modify(Sequence& s) {
  if (s.modifications.empty()) return false;
  std::map<int, std::vector<Operation>> before;  // by GEMM op index
  for (const TensorModification& m : s.modifications) {
    const auto [gemm_index, operand] = find_operand(s, m);
    if (gemm_index < 0) continue;
    Operation& gemm = s.ops[size_t(gemm_index)];
    const ValueId x = gemm.operands[operand];
    const TensorType type = s.value(x).type;  // a copy: add_value grows s.values
    const ValueId y = s.add_value(ValueKind::Result, type);
    Operation op;
    op.kind = OpKind::ModifyTensor;
    op.phase = gemm.phase;
    op.operands = {x};
    op.results = {y};
    op.attrs = {{"feature", m.feature}, {"expression", m.expression}};
    op.instance =
        fmt::format("{}.{}.{}", m.layer, plan::name(m.gemm), quantizer_role_name(m.tensor));
    op.loc = gemm.loc;
    if (m.fake_quant) {
      QuantizerDecl q;
      q.name = fmt::format("{}.{}.fake_quant_{}", m.layer, quantizer_role_name(m.tensor),
                           plan::name(m.gemm));
      q.role = m.tensor;
      q.spec = fake_quant_spec(*m.fake_quant);
      q.usages.rowwise = true;
      q.source = x;
      op.quantizer = int32_t(s.quantizers.size());
      s.quantizers.push_back(std::move(q));
    }
    gemm.operands[operand] = y;
    before[gemm_index].push_back(std::move(op));
  }
  s.modifications.clear();
  if (before.empty()) return false;
  std::vector<Operation> ops;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    for (Operation& op : before[int(i)]) ops.push_back(std::move(op));
    ops.push_back(std::move(s.ops[i]));
  }
  s.ops = std::move(ops);
  recompute_producers(s);
  return true;
}

}  // namespace

bool debug_modify(Program& program) {
  bool changed = false;
  for (Sequence& s : program.sequences) changed |= modify(s);
  return changed;
}

}  // namespace opfuse::passes
