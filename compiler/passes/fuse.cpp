#include "passes/fuse.h"

#include "passes/fusion/patterns.h"

namespace opfuse::passes {

bool fuse_forward(ir::Program& program) {
  fusion::DeclaredPatterns storage;
  const auto forward = fusion::patterns_in_order(program, ir::Phase::Forward, storage);
  bool changed = false;
  for (ir::Sequence& s : program.sequences) {
    changed |= fusion::apply_patterns(s, ir::Phase::Forward, forward);
    changed |= fusion::fold_stats(s, ir::Phase::Forward);
  }
  return changed;
}

bool fuse_backward(ir::Program& program) {
  fusion::DeclaredPatterns storage;
  const auto backward = fusion::patterns_in_order(program, ir::Phase::Backward, storage);
  bool changed = false;
  for (ir::Sequence& s : program.sequences) {
    changed |= fusion::apply_patterns(s, ir::Phase::Backward, backward);
    changed |= fusion::fold_stats(s, ir::Phase::Backward);
  }
  return changed;
}

}  // namespace opfuse::passes
