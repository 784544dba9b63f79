// Runs named IR passes in the order passes/pipeline.cpp gives, with --disable-pass,
// --print-after and per-pass timings (DESIGN.md 3, "Passes").
#pragma once

#include <functional>
#include <set>
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

class PassManager {
 public:
  explicit PassManager(std::vector<Pass> passes) : passes_(std::move(passes)) {}

  const std::vector<Pass>& passes() const { return passes_; }
  // Names in `options` that are not passes of this pipeline (callers report them as usage errors).
  std::vector<std::string> unknown_names(const PassOptions& options) const;
  // Runs every enabled pass. `print(pass_name, program)` is called after a pass named in
  // print_after when that pass changed the program (DESIGN.md: print only when changed).
  std::vector<PassTiming> run(
      ir::Program& program, const PassOptions& options,
      const std::function<void(std::string_view, const ir::Program&)>& print) const;

 private:
  std::vector<Pass> passes_;
};

}  // namespace opfuse::passes
