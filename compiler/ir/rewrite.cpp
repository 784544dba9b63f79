#include "ir/rewrite.h"

#include "support/assert.h"

namespace opfuse::ir {

void replace_all_uses(Sequence& seq, ValueId from, ValueId to) {
  for (Operation& op : seq.ops)
    for (ValueId& v : op.operands)
      if (v == from) v = to;
  for (SequenceOutput& o : seq.outputs)
    if (o.value == from) o.value = to;
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
    OPFUSE_ASSERT(remap.at(v) != ValueId(-1), "value {} is used after its op was erased", v);
    return remap[v];
  };
  for (Operation& op : ops) {
    for (ValueId& v : op.operands) v = map_value(v);
    for (ValueId& v : op.results) v = map_value(v);
  }
  for (Value& v : values)
    if (v.producer >= 0) v.producer = op_remap.at(v.producer);
  for (ValueId& v : seq.inputs) v = map_value(v);
  for (ValueId& v : seq.params) v = map_value(v);
  for (SequenceOutput& o : seq.outputs) o.value = map_value(o.value);
  seq.values = std::move(values);
  seq.ops = std::move(ops);
}

}  // namespace opfuse::ir
