#include "passes/gather_fp8.h"

#include <algorithm>
#include <vector>

#include "ir/rewrite.h"

namespace opfuse::passes {

namespace {

using namespace opfuse::ir;

// The ops that read `v` (a fused op counts once).
std::vector<size_t> consumers(const Sequence& s, ValueId v) {
  std::vector<size_t> found;
  for (size_t i = 0; i < s.ops.size(); ++i)
    for (ValueId operand : s.ops[i].operands)
      if (operand == v) {
        found.push_back(i);
        break;
      }
  return found;
}

bool is_output(const Sequence& s, ValueId v) {
  for (const SequenceOutput& o : s.outputs)
    if (o.value == v) return true;
  return false;
}

// The cast that alone reads the result of the all_gather at `gather`, when it can move before
// the gather: a per-tensor spec (a 1 x 128 block grid would need its column-wise blocks from
// high-precision values), the same phase; -1 otherwise.
int movable_cast(const Sequence& s, size_t gather) {
  const Operation& g = s.ops[gather];
  if (g.kind != OpKind::AllGather || g.results.size() != 1) return -1;
  const ValueId gathered = g.results[0];
  if (dtype_is_fp8(s.value(gathered).type.dtype) || is_output(s, gathered)) return -1;
  const std::vector<size_t> readers = consumers(s, gathered);
  if (readers.size() != 1) return -1;
  const Operation& cast = s.ops[readers[0]];
  if (cast.kind != OpKind::CastFp8 || cast.phase != g.phase || cast.quantizer < 0 ||
      !attr_bool(cast.attrs, "rowwise"))
    return -1;
  const QuantizerDecl& q = s.quantizers.at(size_t(cast.quantizer));
  if (!q.spec.per_tensor()) return -1;
  if (attr_bool(cast.attrs, "columnwise") && q.columnwise_layout != plan::CopyLayout::Transposed)
    return -1;
  return int(readers[0]);
}

// For   y = all_gather(x); r, c = cast_fp8(y)   the ops that replace the pair:
//       r' = cast_fp8(x) {rowwise}; r2 = all_gather(r'); c2 = fp8_transpose(r2)
// with fresh values; every use of r and c becomes a use of r2 and c2.
std::vector<Operation> cast_before_gather(Sequence& s, size_t gather, size_t cast_index) {
  const Operation g = s.ops[gather];  // copies: add_value grows s.values
  const Operation cast = s.ops[cast_index];
  const ValueId share = g.operands[0];
  const int32_t q = cast.quantizer;
  const DType format = s.quantizers.at(size_t(q)).format();
  auto fp8_value = [&](const Shape& shape) {
    const ValueId v = s.add_value(ValueKind::Result, {format, shape});
    s.values[v].quantizer = q;
    return v;
  };

  Operation local = cast;
  local.operands = {share};
  local.attrs = {{"rowwise", true}, {"columnwise", false}};
  local.results = {fp8_value(s.value(share).type.shape)};

  Operation gathered = g;
  gathered.operands = {local.results[0]};
  gathered.results = {fp8_value(s.value(cast.results[0]).type.shape)};
  replace_all_uses(s, cast.results[0], gathered.results[0]);

  std::vector<Operation> ops = {local, gathered};
  if (attr_bool(cast.attrs, "columnwise")) {
    Operation transpose;
    transpose.kind = OpKind::Fp8Transpose;
    transpose.phase = cast.phase;
    transpose.operands = {gathered.results[0]};
    transpose.results = {fp8_value(s.value(cast.results[1]).type.shape)};
    transpose.instance = cast.instance;
    transpose.loc = cast.loc;
    transpose.quantizer = q;
    replace_all_uses(s, cast.results[1], transpose.results[0]);
    ops.push_back(std::move(transpose));
  }
  s.quantizers[size_t(q)].source = share;
  return ops;
}

}  // namespace

bool gather_fp8(Program& program) {
  bool changed = false;
  for (Sequence& s : program.sequences) {
    if (!s.parallel.active() || !s.recipe.is_fp8()) continue;
    // The new ops go in before the gather; the gather and the cast are erased after.
    std::vector<std::vector<Operation>> inserted(s.ops.size());
    std::vector<bool> replaced(s.ops.size(), false);
    for (size_t i = 0; i < s.ops.size(); ++i) {
      const int cast = movable_cast(s, i);
      if (cast < 0) continue;
      inserted[i] = cast_before_gather(s, i, size_t(cast));
      replaced[i] = replaced[size_t(cast)] = true;
    }
    if (std::ranges::find(replaced, true) == replaced.end()) continue;
    std::vector<Operation> ops;
    std::vector<bool> erase;
    for (size_t i = 0; i < s.ops.size(); ++i) {
      for (Operation& op : inserted[i]) {
        ops.push_back(std::move(op));
        erase.push_back(false);
      }
      ops.push_back(std::move(s.ops[i]));
      erase.push_back(replaced[i]);
    }
    s.ops = std::move(ops);
    recompute_producers(s);
    erase_ops(s, erase);
    changed = true;
  }
  return changed;
}

}  // namespace opfuse::passes
