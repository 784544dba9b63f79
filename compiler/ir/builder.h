// Builds the IR of a program from parsed modules: resolves names and constants, checks recipes,
// types and shapes (the op table's shape rules), and reports user errors with locations.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dsl/ast.h"
#include "ir/graph.h"
#include "support/diagnostics.h"

namespace opfuse::ir {

struct BuildOptions {
  // When set, every sequence uses this declared recipe (or "bf16") instead of its own `uses`.
  std::string recipe_override;
};

// `modules` in dependency order (imports first). Returns the program, or nullopt when any error
// was reported to `diags`.
std::optional<Program> build_program(const std::vector<const dsl::Module*>& modules,
                                     DiagnosticEngine& diags, const BuildOptions& options = {});

}  // namespace opfuse::ir
