// The front end in one call: load a .fuse file and its imports, parse, build and verify the IR.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ir/builder.h"
#include "ir/graph.h"
#include "support/diagnostics.h"

namespace opfuse {

// More source text compiled with a program, after its modules: (name shown in diagnostics, text).
// The embedding API's declared fusions (opfuse::CompileOptions::fusions) come this way.
using ExtraSources = std::vector<std::pair<std::string, std::string>>;

// Returns the program, or nullopt when user errors were reported to `diags`.
std::optional<ir::Program> load_program(const std::string& path, SourceManager& sources,
                                        DiagnosticEngine& diags,
                                        const ir::BuildOptions& options = {},
                                        const ExtraSources& extra = {});
// Same, from text in memory (tests, fuzzing); `name` is shown in diagnostics.
std::optional<ir::Program> load_program_from_source(std::string name, std::string text,
                                                    SourceManager& sources, DiagnosticEngine& diags,
                                                    const ir::BuildOptions& options = {},
                                                    const ExtraSources& extra = {});

}  // namespace opfuse
