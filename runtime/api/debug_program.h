// What a Program compiled with a debug config keeps to compile its plan variants later
// (docs/debugging.md, "Plan variants"): the program's IR as the front end built it, the config
// bound to its layers, and the variants compiled so far by key. Internal to the runtime.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "debug_config/config.h"
#include "debug_config/routing.h"
#include "driver/compile.h"
#include "jit/nvrtc_compiler.h"
#include "opfuse/program.h"
#include "plan/plan.h"
#include "support/source_manager.h"

namespace opfuse::api {

// One compiled plan variant: the plan of every sequence and its kernels (plan.kernels order).
struct DebugVariant {
  plan::Plan plan;
  std::vector<jit::CompiledKernel> kernels;
};

class DebugProgram {
 public:
  // Reads the config (into `sources`, which holds the program's text) and binds it to the layers
  // of `ir`. Errors and warnings go to `diags` (over `sources`); returns null on an error.
  static std::shared_ptr<DebugProgram> create(const DebugConfigSource& source, ir::Program ir,
                                              std::shared_ptr<SourceManager> sources,
                                              DiagnosticEngine& diags,
                                              driver::CompileOptions compile,
                                              const CompileOptions& options);

  const std::vector<debug::LayerBinding>& bindings() const { return bindings_; }
  const SourceManager& sources() const { return *sources_; }

  // The variant of `routing` (one whose key is empty is the plain plan: the caller has it). The
  // first request of a key compiles it (passes, plan, NVRTC through the kernel cache); later ones
  // share it. Thread-safe. Throws CompileError or JitError.
  std::shared_ptr<const DebugVariant> variant(const debug::Routing& routing) const;

 private:
  DebugProgram() = default;
  std::shared_ptr<SourceManager> sources_;
  debug::DebugConfig config_;
  std::vector<debug::LayerBinding> bindings_;  // point into config_.sections
  ir::Program ir_;
  driver::CompileOptions compile_;
  std::string cache_dir_;  // empty: no kernel cache
  int compile_threads_ = 0;
  mutable std::mutex mutex_;
  mutable std::map<std::string, std::shared_ptr<const DebugVariant>> variants_;
};

}  // namespace opfuse::api
