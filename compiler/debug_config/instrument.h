// From routing answers to a plan variant and back (docs/debugging.md, "Plan variants"):
// apply_routing writes what one iteration's routing asks for into the program before its passes
// run (overrides that take GEMMs out of quantization or rescale an operand, statistics records
// that debug-instrument places); log_statistics turns the records a run of that variant filled
// into log lines.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "debug/stat_log.h"
#include "debug/stats.h"
#include "debug_config/routing.h"
#include "ir/graph.h"

namespace opfuse::debug {

// Applies `routing` to `program` (every sequence holding a routed layer). Returns one message per
// routed decision opfuse cannot execute yet; the caller must refuse to run with any.
std::vector<std::string> apply_routing(ir::Program& program, const Routing& routing);

// The records of one iteration: per slot of a sequence's plan (plan::SequencePlan::stat_slots),
// merged over the iteration's runs (micro-batches; a weight's record from the first run only).
class IterationStats {
 public:
  // Adds one run's records, `records[i]` for `slots[i]`.
  void add_run(std::span<const plan::StatSlot> slots, std::span<const TensorMoments> records);
  // Every statistic the routing's features asked for, in log order.
  std::vector<StatRecord> records(const Routing& routing, int64_t iteration) const;
  // Writes records() to `log` (not flushed).
  void log(const Routing& routing, int64_t iteration, StatLog& log) const;
  bool empty() const { return merged_.empty(); }

 private:
  std::vector<std::pair<plan::StatSlot, TensorMoments>> merged_;  // in slot order of first run
};

}  // namespace opfuse::debug
