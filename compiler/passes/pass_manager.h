// Runs named IR passes in the order passes/pipeline.cpp gives, with --disable-pass,
// --print-after and per-pass timings (docs/design.md, "Passes").
//
// Each pass names what it requires of the program and what it provides ("backward",
// "quantizers"): the manager checks at construction that every requirement is provided by an
// earlier pass (the pipeline's order), and broken_requirement() reports a set of disabled passes
// that would leave a pass that runs without what it requires.
#pragma once

#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace opfuse::passes {

struct Pass {
  std::string_view name;
  std::string_view description;
  // Rewrites the program; returns true when it changed anything.
  bool (*run)(ir::Program& program);
  std::vector<std::string_view> required = {};  // what earlier passes must have provided
  std::vector<std::string_view> provided = {};  // what this pass establishes
};

struct PassTiming {
  std::string name;
  double milliseconds = 0.0;
  bool changed = false;
  bool skipped = false;  // disabled by the user
};

struct PassOptions {
  std::set<std::string> disabled;     // pass names
  std::set<std::string> print_after;  // pass names, or "all"
  std::string stop_after;             // when set, no pass after this one runs
  bool verify_each = true;            // run the IR verifier after every pass
};

// Thrown by PassManager::run for options that broken_requirement() rejects.
struct PassRequirementError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class PassManager {
 public:
  // Throws InternalError when a pass requires what no earlier pass provides.
  explicit PassManager(std::vector<Pass> passes);

  const std::vector<Pass>& passes() const { return passes_; }
  // Names in `options` that are not passes of this pipeline (callers report them as usage errors).
  std::vector<std::string> unknown_names(const PassOptions& options) const;
  // "" when every pass that runs under `options` has its requirements provided by an earlier pass
  // that runs; else a usage message naming the disabled pass and the pass that requires it.
  std::string broken_requirement(const PassOptions& options) const;
  // Runs every enabled pass. `print(pass_name, program)` is called after a pass named in
  // print_after when that pass changed the program (docs/design.md, "Passes": print only when
  // changed). Throws PassRequirementError when broken_requirement(options) is not empty.
  std::vector<PassTiming> run(
      ir::Program& program, const PassOptions& options,
      const std::function<void(std::string_view, const ir::Program&)>& print) const;

 private:
  std::vector<Pass> passes_;
};

}  // namespace opfuse::passes
