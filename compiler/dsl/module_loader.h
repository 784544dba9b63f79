// Loads a .fuse file and, transitively, the files it imports.
//
// Import paths are relative to the importing file's directory (absolute paths are allowed). Each
// file is loaded once, identified by std::filesystem::weakly_canonical, so diamonds are fine. An
// import that closes a cycle, names a missing, unreadable or non-regular file, or nests deeper
// than kMaxImportDepth is reported at its path string and not followed; loading goes on.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "dsl/ast.h"
#include "support/diagnostics.h"
#include "support/source_manager.h"

namespace opfuse::dsl {

// The root file is at depth 0; a chain of imports below it may be this long.
inline constexpr size_t kMaxImportDepth = 32;

struct LoadedModules {
  // Dependency order: every module comes after the modules it imports; the root file is last.
  // When the root itself cannot be read this is empty.
  std::vector<std::unique_ptr<Module>> modules;
};

// Loads the file at `root_path`. A root that cannot be read is an error without a location:
// "cannot open 'path': reason".
LoadedModules load_modules(const std::string& root_path, SourceManager& sources,
                           DiagnosticEngine& diags);

// Loads source text held in memory under the display name `name`; its imports are resolved
// relative to the current working directory.
LoadedModules load_modules_from_source(std::string name, std::string text, SourceManager& sources,
                                       DiagnosticEngine& diags);

}  // namespace opfuse::dsl
