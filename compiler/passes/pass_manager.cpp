#include "passes/pass_manager.h"

#include <chrono>

#include "ir/verifier.h"

namespace opfuse::passes {

std::vector<std::string> PassManager::unknown_names(const PassOptions& options) const {
  std::vector<std::string> unknown;
  auto known = [&](const std::string& n) {
    for (const Pass& p : passes_)
      if (p.name == n) return true;
    return false;
  };
  for (const std::string& n : options.disabled)
    if (!known(n)) unknown.push_back(n);
  for (const std::string& n : options.print_after)
    if (n != "all" && !known(n)) unknown.push_back(n);
  if (!options.stop_after.empty() && !known(options.stop_after))
    unknown.push_back(options.stop_after);
  return unknown;
}

std::vector<PassTiming> PassManager::run(
    ir::Program& program, const PassOptions& options,
    const std::function<void(std::string_view, const ir::Program&)>& print) const {
  std::vector<PassTiming> timings;
  for (const Pass& pass : passes_) {
    PassTiming t{std::string(pass.name), 0.0, false,
                 options.disabled.count(std::string(pass.name)) > 0};
    if (!t.skipped) {
      const auto start = std::chrono::steady_clock::now();
      t.changed = pass.run(program);
      t.milliseconds =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      if (options.verify_each) ir::verify_program_or_throw(program, std::string(pass.name).c_str());
      const bool wanted =
          options.print_after.count("all") || options.print_after.count(std::string(pass.name));
      if (wanted && t.changed && print) print(pass.name, program);
    }
    timings.push_back(std::move(t));
    if (pass.name == options.stop_after) break;
  }
  return timings;
}

}  // namespace opfuse::passes
