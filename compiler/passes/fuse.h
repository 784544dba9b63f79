// fuse-forward and fuse-backward: apply the declarative fusion patterns of passes/fusion/ to the
// forward and the backward ops separately (docs/design.md, "Passes": forward and backward are fused
// apart).
#pragma once

#include "ir/graph.h"

namespace opfuse::passes {

bool fuse_forward(ir::Program& program);
bool fuse_backward(ir::Program& program);

}  // namespace opfuse::passes
