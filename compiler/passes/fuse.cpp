#include "passes/fuse.h"

#include "passes/fusion/patterns.h"

namespace opfuse::passes {

bool fuse_forward(ir::Program& program) {
  bool changed = false;
  for (ir::Sequence& s : program.sequences) {
    changed |= fusion::apply_patterns(s, ir::Phase::Forward, fusion::forward_patterns());
    changed |= fusion::fold_stats(s, ir::Phase::Forward);
  }
  return changed;
}

bool fuse_backward(ir::Program& program) {
  bool changed = false;
  for (ir::Sequence& s : program.sequences) {
    changed |= fusion::apply_patterns(s, ir::Phase::Backward, fusion::backward_patterns());
    changed |= fusion::fold_stats(s, ir::Phase::Backward);
  }
  return changed;
}

}  // namespace opfuse::passes
