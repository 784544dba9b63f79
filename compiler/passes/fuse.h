// fuse-forward and fuse-backward: apply the declarative fusion patterns of passes/fusion/ to the
// forward and the backward ops separately (DESIGN.md 3: forward and backward are fused apart).
#pragma once

#include "ir/graph.h"

namespace opfuse::passes {

bool fuse_forward(ir::Program& program);
bool fuse_backward(ir::Program& program);

}  // namespace opfuse::passes
