// The standard op library (compiler/stdlib/std.fuse, docs/language.md "The standard library"):
// `import "std"` loads this text, compiled into the library, instead of a file.
#pragma once

#include <string_view>

namespace opfuse::dsl {

// The import path that names it.
inline constexpr std::string_view kStandardLibraryImport = "std";
// The name its diagnostics show.
inline constexpr std::string_view kStandardLibraryName = "<std>/std.fuse";

std::string_view standard_library_source();

}  // namespace opfuse::dsl
