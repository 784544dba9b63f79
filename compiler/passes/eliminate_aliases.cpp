#include "passes/eliminate_aliases.h"

#include "ir/rewrite.h"

namespace opfuse::passes {

namespace {

bool is_no_op(const ir::Sequence& s, const ir::Operation& op) {
  if (op.kind == ir::OpKind::Identity) return true;
  if (op.kind == ir::OpKind::Reshape)
    return s.value(op.results[0]).type == s.value(op.operands[0]).type;
  return false;
}

bool run_on(ir::Sequence& s) {
  std::vector<bool> erase(s.ops.size(), false);
  bool any = false;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    if (!is_no_op(s, s.ops[i])) continue;
    ir::replace_all_uses(s, s.ops[i].results[0], s.ops[i].operands[0]);
    erase[i] = true;
    any = true;
  }
  if (any) ir::erase_ops(s, erase);
  return any;
}

}  // namespace

bool eliminate_aliases(ir::Program& program) {
  bool changed = false;
  for (ir::Sequence& s : program.sequences) changed |= run_on(s);
  return changed;
}

}  // namespace opfuse::passes
