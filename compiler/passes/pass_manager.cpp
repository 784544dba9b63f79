#include "passes/pass_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "ir/verifier.h"
#include "support/assert.h"

namespace opfuse::passes {

namespace {

bool provides(const Pass& pass, std::string_view what) {
  return std::find(pass.provided.begin(), pass.provided.end(), what) != pass.provided.end();
}

}  // namespace

PassManager::PassManager(std::vector<Pass> passes) : passes_(std::move(passes)) {
  for (size_t i = 0; i < passes_.size(); ++i) {
    for (std::string_view what : passes_[i].required) {
      const bool earlier = std::any_of(passes_.begin(), passes_.begin() + std::ptrdiff_t(i),
                                       [&](const Pass& p) { return provides(p, what); });
      OPFUSE_ASSERT(earlier, "pass '{}' requires '{}', which no earlier pass provides",
                    passes_[i].name, what);
    }
  }
}

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

std::string PassManager::broken_requirement(const PassOptions& options) const {
  auto enabled = [&](const Pass& p) { return options.disabled.count(std::string(p.name)) == 0; };
  for (size_t i = 0; i < passes_.size(); ++i) {
    const Pass& pass = passes_[i];
    if (enabled(pass)) {
      for (std::string_view what : pass.required) {
        const Pass* disabled_provider = nullptr;
        bool provided = false;
        for (size_t j = 0; j < i && !provided; ++j) {
          if (!provides(passes_[j], what)) continue;
          if (enabled(passes_[j])) {
            provided = true;
          } else {
            disabled_provider = &passes_[j];
          }
        }
        if (!provided) {
          // The constructor checked that some earlier pass provides it: that one is disabled.
          OPFUSE_ASSERT(disabled_provider != nullptr, "'{}' has no provider", what);
          return fmt::format(
              "pass '{0}' is disabled, but pass '{1}' requires the '{2}' that '{0}' provides; "
              "disable '{1}' as well, or keep '{0}'",
              disabled_provider->name, pass.name, what);
        }
      }
    }
    if (pass.name == options.stop_after) break;
  }
  return {};
}

std::vector<PassTiming> PassManager::run(
    ir::Program& program, const PassOptions& options,
    const std::function<void(std::string_view, const ir::Program&)>& print) const {
  if (std::string broken = broken_requirement(options); !broken.empty())
    throw PassRequirementError(broken);
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
