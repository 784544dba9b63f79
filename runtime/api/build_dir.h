// A `fusec build` output directory as the runtime loads it (opfuse::Program::load_build):
// DIR/plan.json, DIR/kernels/<id>.cubin (or .ptx) and DIR/kernels.json, the manifest fusec writes
// last: the plan's SHA-256, and per kernel its file, size, SHA-256 and the mangled name NVRTC
// gave its name expression (a cubin alone does not say which entry a name expression means).
// Loading verifies all of it before anything is used; no NVRTC, no kernel cache.
#pragma once

#include <string>
#include <vector>

#include "jit/nvrtc_compiler.h"
#include "opfuse/error.h"
#include "plan/plan.h"

namespace opfuse::api {

inline constexpr int kBuildManifestVersion = 1;

// The manifest's text for `plan` (whose JSON text is `plan_json`) and its compiled kernels
// (plan.kernels order).
std::string build_manifest_text(const plan::Plan& plan, const std::string& plan_json,
                                const std::vector<jit::CompiledKernel>& kernels);

struct LoadedBuild {
  plan::Plan plan;
  std::vector<jit::CompiledKernel> kernels;  // plan.kernels order
};

// Throws UsageError naming the file and what is wrong (missing, not a build, built by another
// manifest version, plan or binary changed since the build) and what to do (rebuild).
LoadedBuild load_build_dir(const std::string& dir);

}  // namespace opfuse::api
