// Structural invariants of the IR, checked after the builder and after every pass in tests and
// debug builds. Problems here are opfuse bugs (internal errors), never user errors.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace opfuse::ir {

// Returns one line per broken invariant; empty when the sequence is well formed.
std::vector<std::string> verify_sequence(const Sequence& seq);
// Verifies every sequence and throws InternalError (support/assert.h) listing the problems.
void verify_program_or_throw(const Program& program, const char* after_what);

}  // namespace opfuse::ir
