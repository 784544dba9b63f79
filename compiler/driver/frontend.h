// The front end in one call: load a .fuse file and its imports, parse, build and verify the IR.
#pragma once

#include <optional>
#include <string>

#include "ir/builder.h"
#include "ir/graph.h"
#include "support/diagnostics.h"

namespace opfuse {

// Returns the program, or nullopt when user errors were reported to `diags`.
std::optional<ir::Program> load_program(const std::string& path, SourceManager& sources,
                                        DiagnosticEngine& diags,
                                        const ir::BuildOptions& options = {});
// Same, from text in memory (tests, fuzzing); `name` is shown in diagnostics.
std::optional<ir::Program> load_program_from_source(std::string name, std::string text,
                                                    SourceManager& sources, DiagnosticEngine& diags,
                                                    const ir::BuildOptions& options = {});

}  // namespace opfuse
