// Deterministic text form of the IR (stable value names, no pointers): golden tests compare it.
#pragma once

#include <string>

#include "ir/graph.h"
#include "support/source_manager.h"

namespace opfuse::ir {

// `sources` turns locations into `mlp.fuse:12` comments; pass nullptr to omit them.
std::string print_sequence(const Sequence& seq, const SourceManager* sources);
std::string print_program(const Program& program, const SourceManager* sources);
// `fusion NAME(phase = ..., priority = N) { op; op?; ... }`, as the language writes it.
std::string print_fusion(const DeclaredFusion& fusion);

}  // namespace opfuse::ir
