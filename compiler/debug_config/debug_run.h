// The iteration loop of a precision-debug run, shared by the CPU reference's training loop
// (reference/run_driver.cpp) and opfuse::Session on the GPU (runtime/api/session.cpp), so that
// both ask the routing, pick plan variants, merge micro-batches and log alike
// (docs/debugging.md, "Plan variants" and "Log files").
//
// Per iteration: variant() answers which plan variant runs (asking the routing calls again only
// at the iteration their last answers named); each run of the variant (a forward, a backward)
// hands its statistics records to add_run(); end_step() logs the merged statistics of the
// iteration (log files and the application's callback) and moves to the next iteration. The GPU
// session splits end_step() in two (note "Statistics written behind the GPU" in
// runtime/api/debug_session.cpp): close_iteration() moves on at once, and the closed iteration
// takes the records its runs' copies bring once they land, then write() logs it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "debug/stat_log.h"
#include "debug_config/captures.h"
#include "debug_config/instrument.h"
#include "debug_config/routing.h"

namespace opfuse::debug {

// Which records a run wrote: a forward writes those of the activation, weight and output; a
// backward those of the gradient, dgrad and wgrad (the others keep an earlier run's values).
enum class RunPhase : uint8_t { Forward, Backward, Both };

// Whether the record of `tensor` (a TensorKind name) is written by a run of `phase`.
bool written_by(std::string_view tensor, RunPhase phase);

struct DebugRunSetup {
  std::vector<LayerBinding> bindings;
  StatLog* log = nullptr;                  // null: no files (the callback only)
  const SourceManager* sources = nullptr;  // names the config file in the debug log
  int64_t start_iteration = 0;
  std::function<void(const StatRecord&)> on_stat;  // every logged statistic, in log order
  // Where DumpTensors writes ({log_dir}/tensor_dumps/rank_{rank}/...).
  std::filesystem::path log_dir;
  int rank = 0;
};

// One iteration's records and captures, merged over its runs, with the routing that decides what
// is logged.
class IterationRecords {
 public:
  IterationRecords() = default;
  explicit IterationRecords(int64_t iteration) : iteration_(iteration) {}

  int64_t iteration() const { return iteration_; }
  // As DebugRun::add_run / add_captures.
  void add_run(std::span<const plan::StatSlot> slots, std::span<const TensorMoments> records,
               RunPhase phase);
  void add_captures(std::span<const plan::CaptureSlot> slots,
                    std::span<const CapturedTensor> captures, RunPhase phase);

 private:
  friend class DebugRun;
  int64_t iteration_ = 0;
  std::optional<Routing> routing_;  // set when the iteration is closed
  IterationStats stats_;
  IterationCaptures captures_;
  // The tensors of the iteration's records in plan slot order: the order they are logged in,
  // whichever run gave them first.
  std::vector<std::pair<std::string, std::string>> order_;
};

class DebugRun {
 public:
  // A config with DumpTensors needs a writable log directory: DebugLogError here otherwise,
  // before the first step.
  explicit DebugRun(DebugRunSetup setup);

  int64_t iteration() const { return iteration_; }
  // The routing of the current iteration: asked again only when the last answers may have
  // changed. Throws std::runtime_error (the message names both features) when two features modify
  // one GEMM operand. A variant other than the last one returned is written to the debug log.
  const Routing& routing();
  // Increases each time routing() asked the routing calls again: the variant needs looking up
  // (by Routing::variant_key) only when it changed.
  uint64_t generation() const { return generation_; }
  // Adds the records of one run of the current iteration's variant (`records[i]` for `slots[i]`,
  // every slot of its plan): only those `phase` wrote are taken. Statistics are logged in slot
  // order, as the CPU reference (one run per step) gives them.
  void add_run(std::span<const plan::StatSlot> slots, std::span<const TensorMoments> records,
               RunPhase phase);
  // The same for tensor captures (plan capture slots): a forward (or Both) starts a micro-batch, a
  // backward adds to the last one.
  void add_captures(std::span<const plan::CaptureSlot> slots,
                    std::span<const CapturedTensor> captures, RunPhase phase);
  // Logs the iteration's statistics (log files, flushed, and the callback), writes its dumps, and
  // advances to the next iteration. Throws DebugLogError when the files cannot be written.
  // The same as write(close_iteration()).
  void end_step();
  // Advances to the next iteration and returns the one that ended, with its routing, for records
  // still to come (IterationRecords::add_run) and write().
  IterationRecords close_iteration();
  // Logs a closed iteration as end_step() does (closed iterations are written in order) and
  // empties it.
  void write(IterationRecords& closed);

 private:
  DebugRunSetup setup_;
  int64_t iteration_ = 0;
  std::optional<Routing> routing_;
  uint64_t generation_ = 0;
  std::string logged_key_ = "-";  // the variant key last written to the debug log
  IterationRecords current_;
};

}  // namespace opfuse::debug
