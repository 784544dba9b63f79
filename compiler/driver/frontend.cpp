#include "driver/frontend.h"

#include "dsl/module_loader.h"
#include "ir/verifier.h"

namespace opfuse {

namespace {

std::optional<ir::Program> build(const dsl::LoadedModules& loaded, SourceManager& sources,
                                 DiagnosticEngine& diags, const ir::BuildOptions& options,
                                 const ExtraSources& extra) {
  std::vector<dsl::LoadedModules> more;
  for (const auto& [name, text] : extra)
    more.push_back(dsl::load_modules_from_source(name, text, sources, diags));
  // Name resolution after parse errors would mostly report echoes of them.
  if (diags.has_errors()) return std::nullopt;
  std::vector<const dsl::Module*> modules;
  for (const auto& m : loaded.modules) modules.push_back(m.get());
  for (const dsl::LoadedModules& l : more)
    for (const auto& m : l.modules) modules.push_back(m.get());
  auto program = ir::build_program(modules, diags, options);
  if (program) ir::verify_program_or_throw(*program, "the IR builder");
  return program;
}

}  // namespace

std::optional<ir::Program> load_program(const std::string& path, SourceManager& sources,
                                        DiagnosticEngine& diags, const ir::BuildOptions& options,
                                        const ExtraSources& extra) {
  return build(dsl::load_modules(path, sources, diags), sources, diags, options, extra);
}

std::optional<ir::Program> load_program_from_source(std::string name, std::string text,
                                                    SourceManager& sources, DiagnosticEngine& diags,
                                                    const ir::BuildOptions& options,
                                                    const ExtraSources& extra) {
  return build(dsl::load_modules_from_source(std::move(name), std::move(text), sources, diags),
               sources, diags, options, extra);
}

}  // namespace opfuse
