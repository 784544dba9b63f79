// Small mutation helpers shared by passes; each leaves the sequence verifiable.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace opfuse::ir {

// Every use of `from` (op operands and sequence outputs) becomes a use of `to`.
void replace_all_uses(Sequence& seq, ValueId from, ValueId to);
// Removes the ops marked in `erase` (their results must be unused by then), drops the values
// they defined, and renumbers values and producers densely.
void erase_ops(Sequence& seq, const std::vector<bool>& erase);

}  // namespace opfuse::ir
