#include "api/debug_program.h"

#include <fmt/format.h>

#include "api/debug_features.h"
#include "api/program_impl.h"
#include "jit/kernel_cache.h"

namespace opfuse::api {

std::shared_ptr<DebugProgram> DebugProgram::create(const DebugConfigSource& source, ir::Program ir,
                                                   std::shared_ptr<SourceManager> sources,
                                                   DiagnosticEngine& diags,
                                                   driver::CompileOptions compile,
                                                   const CompileOptions& options) {
  const std::shared_ptr<const debug::FeatureRegistry> registry =
      feature_registry(options.debug_features);
  std::optional<debug::DebugConfig> config;
  if (!source.path.empty()) {
    config = debug::load_debug_config(source.path, *sources, registry, diags);
  } else {
    const FileId file = sources->add_buffer(source.name, source.text);
    config = debug::read_debug_config(*sources, file, registry, diags);
  }
  if (!config) return nullptr;
  std::shared_ptr<DebugProgram> debug(new DebugProgram());
  debug->sources_ = std::move(sources);
  debug->config_ = std::move(*config);
  // Bound after the move: the bindings point into the config's sections.
  debug->bindings_ = debug::bind_layers(debug->config_, debug::program_layers(ir), diags);
  if (diags.has_errors()) return nullptr;
  debug->ir_ = std::move(ir);
  debug->compile_ = std::move(compile);
  debug->compile_.last_stage = driver::Stage::KernelRequests;
  if (options.use_cache) {
    debug->cache_dir_ =
        options.cache_dir.empty() ? jit::KernelCache::default_directory() : options.cache_dir;
  }
  debug->compile_threads_ = options.compile_threads;
  return debug;
}

std::shared_ptr<const DebugVariant> DebugProgram::variant(const debug::Routing& routing) const {
  const std::string key = routing.variant_key();
  const std::lock_guard<std::mutex> lock(mutex_);
  if (const auto it = variants_.find(key); it != variants_.end()) return it->second;
  DiagnosticEngine diags(*sources_);
  driver::CompileOptions options = compile_;
  options.debug_routing = &routing;
  driver::CompileResult result = driver::compile_ir(ir_, sources_.get(), &diags, options);
  if (!result.ok()) {
    throw CompileError(fmt::format("compiling the plan variant of debug iteration {}: {}",
                                   routing.iteration,
                                   result.error.empty() ? diags.format_all() : result.error));
  }
  auto variant = std::make_shared<DebugVariant>();
  variant->plan = std::move(result.plan);
  std::unique_ptr<jit::KernelCache> cache;
  if (!cache_dir_.empty()) cache = std::make_unique<jit::KernelCache>(cache_dir_);
  variant->kernels =
      jit::compile_all(compile_requests(result.kernels), cache.get(), compile_threads_).kernels;
  variants_.emplace(key, variant);
  return variant;
}

}  // namespace opfuse::api
