// Note "Statistics written behind the GPU": step() ends an iteration without waiting for the GPU.
// The records of its forwards and backwards are copied to pinned memory by the stream, each copy
// followed by an event; the ended iteration (its records merged as they land, its routing, its
// captures) waits in ended_ and is logged once every copy has landed, checked without blocking at
// every later forward, backward and step(). A step() waits only for the iteration before the one
// it ends, whose work the GPU finished before starting the queued one, so the host never drains
// the stream: waiting at step() for the iteration just ended cost 0.4-0.6 ms per step on the
// large MLP (the GPU idle while the next forward is issued; bench/RESULTS.md). Logs therefore
// trail the GPU by at most one iteration, in iteration order; flush() (Session::
// flush_debug_stats) waits for all, as does the session's end.
#include "api/debug_session.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "api/program_impl.h"
#include "gpu/cuda_check.h"

namespace opfuse::api {

struct DebugSession::Variant {
  std::shared_ptr<const DebugVariant> compiled;  // null for the plain plan (the session's)
  const plan::SequencePlan* plan = nullptr;
  std::unique_ptr<gpu::PlanModules> modules;
  std::unique_ptr<gpu::SequenceExecutor> owned;
  gpu::SequenceExecutor* executor = nullptr;
};

// One run's records on their way to the host.
struct DebugSession::Pending {
  void* host = nullptr;  // pinned
  std::size_t capacity = 0;
  cudaEvent_t done = nullptr;
  const plan::SequencePlan* plan = nullptr;
  debug::RunPhase phase = debug::RunPhase::Both;

  Pending() = default;
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending() {
    // Why statuses are dropped: teardown must not throw.
    if (host != nullptr) (void)cudaFreeHost(host);
    if (done != nullptr) (void)cudaEventDestroy(done);
  }
};

namespace {

debug::StatLog open_log(const DebugSessionOptions& options) {
  if (options.precision < 0 || options.precision > 30) {
    throw UsageError(
        fmt::format("DebugSessionOptions::precision must be 0 to 30, got {}", options.precision));
  }
  if (options.rank < 0)
    throw UsageError(fmt::format("DebugSessionOptions::rank must be >= 0, got {}", options.rank));
  try {
    return debug::StatLog::open(options.log_dir, options.rank, options.precision);
  } catch (const debug::DebugLogError& e) {
    throw UsageError(e.what());
  }
}

debug::DebugRunSetup run_setup(const DebugProgram& program, const DebugSessionOptions& options,
                               debug::StatLog* log) {
  debug::DebugRunSetup setup;
  setup.bindings = program.bindings();
  setup.log = log;
  setup.sources = &program.sources();
  setup.start_iteration = options.start_iteration;
  setup.log_dir = options.log_dir;
  setup.rank = options.rank;
  if (options.on_stat) {
    setup.on_stat = [callback = options.on_stat](const debug::StatRecord& r) {
      callback(DebugStat{r.layer, r.tensor, r.gemm, r.stat, r.iteration, r.value});
    };
  }
  return setup;
}

// An unwritable dump directory (DumpTensors) is misuse reported before the first step.
debug::DebugRun make_run(const DebugProgram& program, const DebugSessionOptions& options,
                         debug::StatLog* log) {
  try {
    return debug::DebugRun(run_setup(program, options, log));
  } catch (const debug::DebugLogError& e) {
    throw UsageError(e.what());
  }
}

}  // namespace

DebugSession::DebugSession(std::shared_ptr<const DebugProgram> program, std::string sequence,
                           const DebugSessionOptions& options, gpu::GemmRunner& gemms,
                           bool auto_graph, gpu::SequenceExecutor& plain)
    : program_(std::move(program)),
      sequence_(std::move(sequence)),
      gemms_(gemms),
      auto_graph_(auto_graph),
      log_(options.log_dir.empty() ? std::nullopt
                                   : std::optional<debug::StatLog>(open_log(options))),
      run_(make_run(*program_, options, log_ ? &*log_ : nullptr)) {
  auto variant = std::make_unique<Variant>();
  variant->executor = &plain;
  current_ = &plain;
  variants_.emplace("", std::move(variant));
}

DebugSession::~DebugSession() {
  // Why errors are dropped: a destructor must not throw; Session::flush_debug_stats() reports them.
  try {
    flush();
  } catch (const std::exception&) {
    (void)cudaGetLastError();
  }
}

void DebugSession::bind(const std::map<std::string, std::int64_t>& sizes) {
  for (const auto& entry : variants_)
    if (entry.second->owned) entry.second->owned->bind(sizes);
  sizes_ = sizes;
}

void DebugSession::set_tensor(const std::string& name, const void* pointer) {
  for (const auto& entry : variants_)
    if (entry.second->owned) entry.second->owned->set_tensor(name, pointer);
  tensors_[name] = pointer;
}

void DebugSession::reset_peak() {
  for (const auto& entry : variants_)
    if (entry.second->owned) entry.second->owned->reset_peak();
}

DebugSession::Variant& DebugSession::make_variant(const std::string& key,
                                                  const debug::Routing& routing,
                                                  cudaStream_t stream) {
  auto variant = std::make_unique<Variant>();
  variant->compiled = program_->variant(routing);
  for (const plan::SequencePlan& p : variant->compiled->plan.sequences)
    if (p.name == sequence_) variant->plan = &p;
  if (variant->plan == nullptr)
    throw Error(fmt::format("the debug plan variant has no sequence '{}'", sequence_));
  variant->modules =
      std::make_unique<gpu::PlanModules>(variant->compiled->plan, variant->compiled->kernels);
  variant->owned =
      std::make_unique<gpu::SequenceExecutor>(*variant->plan, *variant->modules, gemms_, stream);
  variant->executor = variant->owned.get();
  variant->owned->set_auto_graph(auto_graph_);
  if (sizes_) variant->owned->bind(*sizes_);
  for (const auto& [name, pointer] : tensors_) variant->owned->set_tensor(name, pointer);
  return *variants_.emplace(key, std::move(variant)).first->second;
}

void DebugSession::bank_states(cudaStream_t stream) {
  const std::vector<cpu::DelayedScalingState> states = current_->download_quantizers(stream);
  const plan::SequencePlan& plan = current_->plan();
  for (std::size_t i = 0; i < states.size() && i < plan.quantizers.size(); ++i)
    bank_[plan.quantizers[i].name] = states[i];
}

gpu::SequenceExecutor& DebugSession::before_forward(cudaStream_t stream) {
  write_landed(false);
  const debug::Routing* asked = nullptr;
  try {
    asked = &run_.routing();
  } catch (const std::runtime_error& e) {
    throw UsageError(fmt::format("the debug config: {}", e.what()));
  }
  const debug::Routing& routing = *asked;
  if (run_.generation() == generation_) return *current_;
  generation_ = run_.generation();
  const std::string key = routing.variant_key();
  if (key == current_key_) return *current_;
  const auto found = variants_.find(key);
  Variant& next = found != variants_.end() ? *found->second : make_variant(key, routing, stream);
  // The quantizers continue where the last variant left them (by name); a quantizer no variant
  // had yet keeps its initial state.
  bank_states(stream);
  std::vector<cpu::DelayedScalingState> states = next.executor->download_quantizers(stream);
  const plan::SequencePlan& plan = next.executor->plan();
  for (std::size_t i = 0; i < states.size() && i < plan.quantizers.size(); ++i) {
    if (const auto it = bank_.find(plan.quantizers[i].name); it != bank_.end())
      states[i] = it->second;
  }
  next.executor->upload_quantizers(states, stream);
  // Dropout draws the masks of this step, not of the step the variant last ran.
  if (current_ != nullptr) next.executor->set_dropout_step(current_->dropout_step(), stream);
  // Its FP8 weight copies (if it ran before) are older than the parameters.
  next.executor->invalidate_weight_cache();
  current_ = next.executor;
  current_key_ = key;
  return *current_;
}

void DebugSession::after_run(debug::RunPhase phase, cudaStream_t stream) {
  write_landed(false);
  // Tensor captures (DumpTensors, C++ features' inspect_tensor) are read now: their buffers are
  // overwritten by the next run. Only iterations that capture wait here.
  if (!current_->plan().capture_slots.empty())
    run_.add_captures(current_->plan().capture_slots, current_->captures(stream), phase);
  const std::size_t bytes = current_->stat_record_bytes();
  if (bytes == 0) return;
  std::unique_ptr<Pending> pending;
  if (!free_.empty()) {
    pending = std::move(free_.back());
    free_.pop_back();
  } else {
    pending = std::make_unique<Pending>();
    OPFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&pending->done, cudaEventDisableTiming),
                      "debug statistics");
  }
  if (pending->capacity < bytes) {
    if (pending->host != nullptr) OPFUSE_CUDA_CHECK(cudaFreeHost(pending->host));
    pending->host = nullptr;
    OPFUSE_CUDA_CHECK(cudaMallocHost(&pending->host, bytes), "debug statistics");
    pending->capacity = bytes;
  }
  current_->copy_stat_records_async(pending->host, stream);
  OPFUSE_CUDA_CHECK(cudaEventRecord(pending->done, stream), "debug statistics");
  pending->plan = &current_->plan();
  pending->phase = phase;
  pending_.push_back(std::move(pending));
  // Many runs without a step() (an inference loop): merge the older ones now (their copies are
  // long done), so the pinned buffers stay few.
  if (pending_.size() > kMaxPending) merge_pending(pending_.size() - kMaxPending / 2);
}

void DebugSession::merge(std::unique_ptr<Pending> pending, debug::IterationRecords* into) {
  const std::vector<plan::StatSlot>& slots = pending->plan->stat_slots;
  std::vector<debug::TensorMoments> records(slots.size());
  static_assert(sizeof(debug::TensorMoments) == gpu::kStatRecordBytes);
  std::memcpy(records.data(), pending->host, slots.size() * gpu::kStatRecordBytes);
  if (into != nullptr) {
    into->add_run(slots, records, pending->phase);
  } else {
    run_.add_run(slots, records, pending->phase);
  }
  free_.push_back(std::move(pending));
}

void DebugSession::merge_pending(std::size_t count) {
  count = std::min(count, pending_.size());
  for (std::size_t i = 0; i < count; ++i) {
    OPFUSE_CUDA_CHECK(cudaEventSynchronize(pending_[i]->done), "debug statistics");
    merge(std::move(pending_[i]), nullptr);
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(count));
}

void DebugSession::write_landed(bool wait) {
  while (!ended_.empty()) {
    Ended& oldest = ended_.front();
    while (!oldest.pending.empty()) {
      Pending& next = *oldest.pending.front();
      if (wait) {
        OPFUSE_CUDA_CHECK(cudaEventSynchronize(next.done), "debug statistics");
      } else {
        const cudaError_t status = cudaEventQuery(next.done);
        if (status == cudaErrorNotReady) return;
        OPFUSE_CUDA_CHECK(status, "debug statistics");
      }
      merge(std::move(oldest.pending.front()), &oldest.records);
      oldest.pending.erase(oldest.pending.begin());
    }
    try {
      run_.write(oldest.records);
    } catch (const debug::DebugLogError& e) {
      ended_.pop_front();
      throw Error(e.what());
    }
    ended_.pop_front();
  }
}

void DebugSession::end_step() {
  ended_.push_back(Ended{run_.close_iteration(), std::move(pending_)});
  pending_.clear();
  write_landed(false);
  // At most one iteration behind: wait for the older ones (the GPU finished them before the one
  // just ended, whose work is queued behind them).
  while (ended_.size() > 1) {
    Ended& oldest = ended_.front();
    for (const std::unique_ptr<Pending>& pending : oldest.pending)
      OPFUSE_CUDA_CHECK(cudaEventSynchronize(pending->done), "debug statistics");
    write_landed(false);
  }
}

void DebugSession::flush() { write_landed(true); }

std::map<std::string, cpu::DelayedScalingState> DebugSession::quantizer_states(
    cudaStream_t stream) const {
  std::map<std::string, cpu::DelayedScalingState> states = bank_;
  const std::vector<cpu::DelayedScalingState> current = current_->download_quantizers(stream);
  const plan::SequencePlan& plan = current_->plan();
  for (std::size_t i = 0; i < current.size() && i < plan.quantizers.size(); ++i)
    states[plan.quantizers[i].name] = current[i];
  return states;
}

void DebugSession::set_quantizer_states(
    const std::map<std::string, cpu::DelayedScalingState>& states, cudaStream_t stream) {
  bank_ = states;
  std::vector<cpu::DelayedScalingState> current = current_->download_quantizers(stream);
  const plan::SequencePlan& plan = current_->plan();
  for (std::size_t i = 0; i < current.size() && i < plan.quantizers.size(); ++i) {
    if (const auto it = states.find(plan.quantizers[i].name); it != states.end())
      current[i] = it->second;
  }
  current_->upload_quantizers(current, stream);
}

}  // namespace opfuse::api
