// build-backward: appends each sequence's backward ops (phase Backward) after its forward ops,
// by calling every op's backward rule (ir/backward_rules.h) in reverse order, and records the
// gradients of inputs and parameters. Norms gain their saved statistics as results.
#pragma once

#include "ir/graph.h"

namespace opfuse::passes {

bool build_backward(ir::Program& program);

}  // namespace opfuse::passes
