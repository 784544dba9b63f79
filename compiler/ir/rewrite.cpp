#include "ir/rewrite.h"

#include "support/assert.h"

namespace opfuse::ir {

namespace {

void replace_in(Operation& op, ValueId from, ValueId to) {
  for (ValueId& v : op.operands)
    if (v == from) v = to;
  for (Operation& part : op.parts) replace_in(part, from, to);
}

}  // namespace

void replace_all_uses(Sequence& seq, ValueId from, ValueId to) {
  for (Operation& op : seq.ops) replace_in(op, from, to);
  for (SequenceOutput& o : seq.outputs)
    if (o.value == from) o.value = to;
  if (seq.quantized_output && seq.quantized_output->columnwise == from)
    seq.quantized_output->columnwise = to;
  for (ValueId& v : seq.input_grads)
    if (v == from) v = to;
  for (ValueId& v : seq.param_grads)
    if (v == from) v = to;
}

void erase_ops(Sequence& seq, const std::vector<bool>& erase) {
  OPFUSE_ASSERT_EQ(erase.size(), seq.ops.size());
  std::vector<bool> dead(seq.values.size(), false);
  for (size_t i = 0; i < seq.ops.size(); ++i)
    if (erase[i])
      for (ValueId r : seq.ops[i].results) dead[r] = true;

  std::vector<ValueId> remap(seq.values.size(), ValueId(-1));
  std::vector<Value> values;
  for (const Value& v : seq.values) {
    if (dead[v.id]) continue;
    remap[v.id] = static_cast<ValueId>(values.size());
    values.push_back(v);
    values.back().id = remap[v.id];
  }
  std::vector<Operation> ops;
  std::vector<int32_t> op_remap(seq.ops.size(), -1);
  for (size_t i = 0; i < seq.ops.size(); ++i) {
    if (erase[i]) continue;
    op_remap[i] = static_cast<int32_t>(ops.size());
    ops.push_back(std::move(seq.ops[i]));
  }
  auto map_value = [&](ValueId v) {
    if (v == kNoValue) return v;
    OPFUSE_ASSERT(remap.at(v) != ValueId(-1), "value {} is used after its op was erased", v);
    return remap[v];
  };
  auto map_op = [&](auto& self, Operation& op) -> void {
    for (ValueId& v : op.operands) v = map_value(v);
    for (ValueId& v : op.results) v = map_value(v);
    for (Operation& part : op.parts) self(self, part);
  };
  for (Operation& op : ops) map_op(map_op, op);
  for (ValueId& v : seq.output_grads) v = map_value(v);
  for (ValueId& v : seq.input_grads) v = map_value(v);
  for (ValueId& v : seq.param_grads) v = map_value(v);
  for (QuantizerDecl& q : seq.quantizers) q.source = map_value(q.source);
  for (Value& v : values)
    if (v.producer >= 0) v.producer = op_remap.at(v.producer);
  for (ValueId& v : seq.inputs) v = map_value(v);
  for (ValueId& v : seq.params) v = map_value(v);
  for (SequenceOutput& o : seq.outputs) o.value = map_value(o.value);
  for (std::optional<QuantizedBoundary>* b : {&seq.quantized_input, &seq.quantized_output})
    if (b->has_value()) (*b)->columnwise = map_value((*b)->columnwise);
  seq.values = std::move(values);
  seq.ops = std::move(ops);
}

void recompute_producers(Sequence& seq) {
  for (size_t i = 0; i < seq.ops.size(); ++i) {
    for (ValueId r : seq.ops[i].results) seq.values.at(r).producer = int32_t(i);
    for (const Operation& part : seq.ops[i].parts)
      for (ValueId r : part.results) seq.values.at(r).producer = int32_t(i);
  }
}

Shape transposed_shape(const Shape& shape) {
  if (shape.empty()) return shape;
  Shape out{shape.back()};
  out.insert(out.end(), shape.begin(), shape.end() - 1);
  return out;
}

int find_layer_op(const Sequence& seq, OpKind kind, Phase phase, std::string_view instance) {
  for (size_t i = 0; i < seq.ops.size(); ++i) {
    const Operation& op = seq.ops[i];
    if (op.kind == kind && op.phase == phase && op.instance == instance) return int(i);
  }
  return -1;
}

}  // namespace opfuse::ir
