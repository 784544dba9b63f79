// Automatic fusion of pointwise chains (note "Pointwise chains" in docs/architecture.md).
#pragma once

#include "ir/graph.h"

namespace opfuse::passes {

// Composes every chain of forward pointwise ops (built-in activations and user-defined ops)
// whose intermediate values have no other use into one user-defined op (ir::user_pointwise_def)
// whose expression is the composition, with its gradients derived through the chain (each op's
// own derivative forms kept as hints). The chain then runs as one kernel forward and one
// backward (which recomputes the intermediates instead of saving them), and fuses with the
// casts around it like any activation. At most one gated op per chain; a chain grows while its
// expression stays within what the carriers hold. Before build-backward. Returns true when it
// composed any.
bool compose_pointwise(ir::Program& program);

}  // namespace opfuse::passes
