// Small mutation helpers shared by passes; each leaves the sequence verifiable.
#pragma once

#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace opfuse::ir {

// Every use of `from` (op operands and sequence outputs) becomes a use of `to`.
void replace_all_uses(Sequence& seq, ValueId from, ValueId to);
// Removes the ops marked in `erase` (their results must be unused by then), drops the values
// they defined, and renumbers values and producers densely.
void erase_ops(Sequence& seq, const std::vector<bool>& erase);
// Sets every result's producer to the index of the top-level op that makes it (a fused op's
// parts' results belong to the fused op), after a pass rebuilt Sequence::ops.
void recompute_producers(Sequence& seq);
// The index of the op of `kind` and `phase` whose instance (layer name) is `instance`; -1 if none.
int find_layer_op(const Sequence& seq, OpKind kind, Phase phase, std::string_view instance);
// Transposed shape of a row-major [rows..., cols] tensor: [cols, rows...] (FP8 column-wise copies).
Shape transposed_shape(const Shape& shape);

}  // namespace opfuse::ir
