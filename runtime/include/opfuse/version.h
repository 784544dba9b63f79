// opfuse version and the codegen version that kernel-cache keys include.
#pragma once

namespace opfuse {

// The release version, e.g. "0.1.0".
const char* version();
// Bumped whenever generated code can change for the same input; part of every kernel-cache key.
inline constexpr int kCodegenVersion = 1;

}  // namespace opfuse
