#pragma once

#include "ir/graph.h"

namespace opfuse::passes {

// Removes ops that move no data and change nothing: `identity`, and `reshape` to the shape the
// tensor already has. Their uses read the op's input instead. Returns true when it removed any.
bool eliminate_aliases(ir::Program& program);

}  // namespace opfuse::passes
