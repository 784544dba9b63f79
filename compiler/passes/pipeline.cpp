#include "passes/pipeline.h"

#include "passes/eliminate_aliases.h"

namespace opfuse::passes {

std::vector<Pass> default_pipeline() {
  return {
      // First: later fusion patterns match op windows, and an identity between two ops would
      // hide a pattern (norm, identity, linear must fuse like norm, linear).
      {"eliminate-aliases", "remove identity ops and reshapes to the same shape",
       eliminate_aliases},
  };
}

}  // namespace opfuse::passes
