// The one place that owns the pass order (docs/design.md, "Passes"). pipeline.cpp explains each
// constraint.
#pragma once

#include <vector>

#include "passes/pass_manager.h"

namespace opfuse::passes {

std::vector<Pass> default_pipeline();

}  // namespace opfuse::passes
