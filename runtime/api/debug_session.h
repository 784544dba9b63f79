// The precision-debug side of an opfuse::Session (docs/debugging.md, "Sessions"): one executor per
// plan variant the run has needed, the switch between them at the first forward of an iteration
// whose routing asks for another variant, the statistics records of each forward and backward
// copied to pinned host memory as they run, and step(), which ends the iteration and logs it once
// its records have landed (compiler/debug_config/debug_run.h; note "Statistics written behind
// the GPU" in debug_session.cpp). Internal to the runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/debug_program.h"
#include "cpu/quantizer_math.h"
#include "debug/stat_log.h"
#include "debug_config/debug_run.h"
#include "gpu/plan_executor.h"
#include "opfuse/program.h"

namespace opfuse::api {

class DebugSession {
 public:
  // `plain` is the session's executor of the plain plan (variant key ""), which it keeps owning.
  // Opens the log files: an unwritable log directory is a UsageError here.
  DebugSession(std::shared_ptr<const DebugProgram> program, std::string sequence,
               const DebugSessionOptions& options, gpu::GemmRunner& gemms, bool auto_graph,
               gpu::SequenceExecutor& plain);
  ~DebugSession();
  DebugSession(const DebugSession&) = delete;
  DebugSession& operator=(const DebugSession&) = delete;

  // What the session does to its executor, repeated for every variant's (and remembered for the
  // variants made later).
  void bind(const std::map<std::string, std::int64_t>& sizes);
  void set_tensor(const std::string& name, const void* pointer);
  void reset_peak();

  // The executor the next forward runs on: the current iteration's variant. Switching carries
  // the quantizer state by name (one wait for `stream`) and recasts the FP8 weights.
  gpu::SequenceExecutor& before_forward(cudaStream_t stream);
  // The executor of the variant that ran last (forward's, until the next forward).
  gpu::SequenceExecutor& current() const { return *current_; }
  // After a forward or backward of current(): its statistics records, copied without waiting.
  void after_run(debug::RunPhase phase, cudaStream_t stream);
  // Ends the iteration: the next forward belongs to the next one. Its records are merged and
  // logged (the callback called) once they have landed: now, at a later call, or at the next
  // end_step() at the latest, which waits for them.
  void end_step();
  // Waits for the records of every ended iteration and logs them.
  void flush();
  std::int64_t iteration() const { return run_.iteration(); }

  // Every quantizer's state by name: those of the current variant, and the last known state of
  // quantizers only other variants have.
  std::map<std::string, cpu::DelayedScalingState> quantizer_states(cudaStream_t stream) const;
  // Replaces them (a checkpoint load): the current executor's now, the others' at their switch.
  void set_quantizer_states(const std::map<std::string, cpu::DelayedScalingState>& states,
                            cudaStream_t stream);

 private:
  struct Variant;
  struct Pending;
  Variant& make_variant(const std::string& key, const debug::Routing& routing, cudaStream_t stream);
  // The current executor's quantizer states into bank_.
  void bank_states(cudaStream_t stream);
  // Waits for the oldest `count` pending runs' records and adds them to the iteration.
  void merge_pending(std::size_t count);
  // Adds one run's landed records to `into` (or, when null, to the current iteration) and
  // recycles its buffer.
  void merge(std::unique_ptr<Pending> pending, debug::IterationRecords* into);
  // Logs the ended iterations whose records have landed, oldest first, stopping at the first
  // that has not; with `wait`, waits for each instead.
  void write_landed(bool wait);
  static constexpr std::size_t kMaxPending = 16;

  std::shared_ptr<const DebugProgram> program_;
  std::string sequence_;
  gpu::GemmRunner& gemms_;
  bool auto_graph_ = true;
  std::optional<debug::StatLog> log_;
  debug::DebugRun run_;
  std::map<std::string, std::unique_ptr<Variant>> variants_;  // by variant key
  gpu::SequenceExecutor* current_ = nullptr;
  std::string current_key_;
  std::uint64_t generation_ = 0;  // of run_'s routing, when the variant was last chosen
  std::optional<std::map<std::string, std::int64_t>> sizes_;
  std::map<std::string, const void*> tensors_;
  std::map<std::string, cpu::DelayedScalingState> bank_;
  std::vector<std::unique_ptr<Pending>> pending_, free_;
  // Ended iterations, oldest first, with the runs whose records have not landed yet.
  struct Ended {
    debug::IterationRecords records;
    std::vector<std::unique_ptr<Pending>> pending;
  };
  std::deque<Ended> ended_;
};

}  // namespace opfuse::api
