// Internal to the executor (runtime/gpu/plan_executor.h is its API): SequenceExecutor::Impl,
// the state one sequence runs with, and the small types and helpers its member functions share.
// The definitions are split by concern: construction and the public API (plan_executor.cpp, which
// holds the design notes "Executor buffers", "Automatic graphs" and "Weight cache"), the plan
// checks (executor_checks.cpp), bind and memory (executor_bind.cpp), running steps
// (executor_run.cpp), the automatic graph (executor_graph.cpp) and the communicators with the
// amax reduction (executor_comm.cpp). Included by those files only.
#pragma once

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "comm/communicator.h"
#include "gpu/binding_check.h"
#include "gpu/block_summaries.h"
#include "gpu/collective_overlap.h"
#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/device_memory.h"
#include "gpu/kernel_params.h"
#include "gpu/memory_plan.h"
#include "gpu/plan_executor.h"
#include "gpu/plan_gemm.h"
#include "gpu/pointer_check.h"
#include "gpu/quantizer_state.h"
#include "opfuse/error.h"
#include "plan/gemm_caps.h"

namespace opfuse::gpu {

using plan::BufferRole;
using plan::GemmStep;
using plan::LaunchStep;
using plan::ParamBinding;
using plan::SequencePlan;
using plan::Step;

inline QuantizerSettings settings_of(const plan::QuantizerPlan& quantizer) {
  return quantizer_settings(quantizer.name, quantizer.spec);
}

inline constexpr int kModes = 2;
// Inputs up to this size (all together) make an inference forward replay a graph (note
// "Automatic graphs"). Why 4 MiB: copying them costs at most a few us of device time, which
// the forward of a model that size saves in host time many times over.
inline constexpr std::size_t kAutoGraphInputBytes = 4u << 20;
constexpr int mode_index(RunMode mode) { return static_cast<int>(mode); }
// Why 256: what cudaMalloc gives, so every placed buffer is as aligned as a pool allocation.
inline constexpr std::size_t kBufferAlignment = 256;

// The launch a step runs in `mode`: its inference variant's in Inference mode where it has one.
inline const LaunchStep* launch_of(const Step& step, RunMode mode) {
  if (mode == RunMode::Inference && step.inference) return &step.inference->launch;
  return std::get_if<LaunchStep>(&step.body);
}

// Every buffer a step names as `mode` runs it (plan/plan.h).
inline std::vector<int> buffers_named_by(const Step& step, RunMode mode) {
  return plan::buffers_named_by(step, mode == RunMode::Inference);
}

// A step's kernel launch or GEMM with the sizes of the current bind().
struct BoundStep {
  const Kernel* kernel = nullptr;  // launches
  bool skip = false;               // a zero-sized grid
  dim3 grid, block;
  std::size_t dynamic_smem = 0;
  PackedParams params;
  GemmDesc gemm;
  std::int64_t collective_count = 0;  // collectives: elements this rank sends
  // Tensor-parallel launches that measure a current-scaling amax: their quantizers, whose scale
  // is derived after the amax is max-reduced over the ranks (note "Current scaling over ranks").
  std::vector<int> finish_current;
};

// What construction learns about one buffer (note "Executor buffers").
struct BufferFacts {
  int root = -1;  // the buffer whose memory it is (itself unless a view)
  bool callers = false;
  bool forward_result = false;   // root of an "output" interface buffer
  bool backward_result = false;  // root of an "input_grad" / "param_grad" interface buffer
  bool weight_cache = false;     // root written by a weight-cast group
  // Per run mode: the first and last step touching it (-1: none); Inference counts forward
  // steps only.
  int first_touch[kModes] = {-1, -1}, last_touch[kModes] = {-1, -1};
};

struct WeightCacheGroup {
  std::vector<int> steps;
  std::vector<int> params;      // the parameter buffers it reads
  std::vector<int> quantizers;  // the quantizers of the FP8 copies it writes
  bool valid = false;
  std::vector<const void*> cast_from;  // their pointers when it last ran
  std::uint64_t casts = 0;             // times it was enqueued (fused GEMMs' interleaved copies)
};

// Note "Fused GEMM epilogues" (executor_fused.cpp): a forward's FP8 GEMM that runs the plan's
// gated epilogue for that run mode (plan::GatedEpilogue) through runtime/cutlass/fused_gemm.h, so
// that the activation step it folds in runs nothing. Chosen per mode by bind() where
// gated_gemm_refusal accepts the bound product on this GPU and B is a cached weight copy.
struct FusedGemm {
  int step = -1;    // the GEMM
  int folded = -1;  // the activation step
  std::string activation;
  std::int64_t m = 0, n = 0, k = 0;
  int output = -1;         // the activation's E4M3 output buffer
  int output_t = -1;       // its transposed copy (training forwards)
  bool inference = false;  // whether inference forwards run it fused
  bool training = false;   // whether training forwards do (also writing D and output_t)
  int cache_group = -1;    // the weight-cast group writing B
  const float* out_scale = nullptr;
  float* amax = nullptr;
  DeviceBuffer interleaved;  // B with gate and linear rows interleaved, made while fusing is on
  std::size_t interleaved_bytes = 0;
  std::uint64_t interleaved_at = 0;  // cache_groups[cache_group].casts when it was made
  bool fresh(const std::vector<WeightCacheGroup>& groups) const {
    return interleaved_at == groups[static_cast<std::size_t>(cache_group)].casts &&
           interleaved_at != 0;
  }
  bool runs_in(RunMode mode) const { return mode == RunMode::Inference ? inference : training; }
};

// ---- SequenceExecutor::Impl ---------------------------------------------------------------------

// Note "Overlapped collectives" (executor_run.cpp): the stream a tensor-parallel plan's
// collectives run on, beside the session's, and per collective step the events that fork it from
// and join it back to the session's stream. Made by set_communicator() on the executor's device.
class CollectiveStream {
 public:
  explicit CollectiveStream(std::size_t steps);  // a high-priority non-blocking stream
  ~CollectiveStream();  // waits for nothing: the executor joined every fork
  CollectiveStream(const CollectiveStream&) = delete;
  CollectiveStream& operator=(const CollectiveStream&) = delete;
  cudaStream_t stream() const { return stream_; }
  cudaEvent_t ready(std::size_t step);  // made on first use
  cudaEvent_t done(std::size_t step);
  // Note "Pipelined collectives": the event forking stage `stage` of a pipelined pair.
  cudaEvent_t stage(std::size_t stage);

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> ready_, done_, stage_;
};

// The SMs a GEMM beside a collective in flight leaves to it, unless OPFUSE_COLLECTIVE_SMS says.
inline constexpr int kCollectiveSms = 16;
// Note "Pipelined collectives": the stages a pipelined GEMM and collective run in, unless
// OPFUSE_COLLECTIVE_CHUNKS says (1: none pipelined).
inline constexpr int kCollectiveChunks = 2;

// A collective enqueued on the CollectiveStream that the session's stream has not waited for
// yet, with the address ranges [begin, end) of its input and output.
struct PendingCollective {
  int step = 0;
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
};

struct SequenceExecutor::Impl {
  Impl(const SequencePlan& plan_in, const PlanModules& modules_in, GemmRunner& gemms_in,
       cudaStream_t stream);

  // ---- construction ----
  void check_plan() const;
  void check_launch(const Step& step, const LaunchStep& launch) const;
  void learn_buffers();
  void find_weight_cache_groups();
  const void* state_pointer(const ParamBinding& param) const;

  // ---- fused GEMM epilogues (executor_fused.cpp) ----
  void bind_fused_gemms(const std::map<std::string, std::int64_t>& values);
  void allocate_fused_gemms();
  // Whether a forward of the current layout runs step `index` as a fused GEMM / skips it as
  // folded in.
  bool runs_fused(int index) const;
  bool folded(int index) const;
  // The FusedGemm a forward of `mode` runs as step `index` (as_gemm) or folds step `index` into;
  // nullptr when it runs the step as planned.
  const FusedGemm* fused_at(int index, RunMode mode, bool as_gemm) const;
  void run_fused(int index, const GemmArgs& args, cudaStream_t stream);

  // ---- bind ----
  BoundStep bind_launch(const LaunchStep& launch,
                        const std::map<std::string, std::int64_t>& values) const;
  BoundStep bind_step(const Step& step, const std::map<std::string, std::int64_t>& values) const;
  void place_buffers();

  // ---- running ----
  void* pointer(int buffer) const;
  void require_set(int begin, int end, const char* call) const;
  // The UsageError for caller tensor `root` at `pointer`, which is `problem`.
  UsageError pointer_error(int root, const void* pointer, std::string_view problem) const;
  void ensure_memory(std::size_t bytes, cudaStream_t stream);
  void free_memory(cudaStream_t stream);
  // `enqueue` false only updates what running them would (liveness, the weight cache): for a
  // graph replay that ran them.
  void run_steps(int begin, int end, cudaStream_t stream, RunMode mode, bool enqueue = true);
  bool graph_forward(cudaStream_t stream);
  void record_graph(cudaStream_t stream);
  void drop_graph();
  void run_step(int index, cudaStream_t stream);
  void run_collective(const plan::CollectiveStep& collective, std::int64_t count,
                      cudaStream_t stream);
  // The collective's NCCL call (or one rank's copy) on `count` elements this rank sends from `in`
  // into `out`.
  void enqueue_collective(const plan::CollectiveStep& collective, const void* in, void* out,
                          std::int64_t count, cudaStream_t stream);
  // Step `index`'s GEMM arguments under the current binding (the cached weight copies' scales).
  GemmArgs bound_gemm_args(int index) const;
  // The bound step `index` of the current layout (a launch's inference variant in an inference
  // layout).
  const BoundStep& bound_at(int index) const;
  // Note "Pipelined collectives": runs `pair` of run mode `m` in row pieces and stages, both
  // steps' liveness included; false, with nothing done, where the bound pair cannot be.
  bool run_overlapped(const OverlapPair& pair, int m, cudaStream_t stream);
  void run_gemm_piece(int index, const GemmDesc& desc, const GemmArgs& args, const GemmPiece& piece,
                      const void* a_base, cudaStream_t stream);
  // Note "Overlapped collectives": collective step `index` of run mode `m` forked onto the
  // collective stream; the session's stream waits for a pending collective before the first
  // step whose memory overlaps its input or output (join_overlapping), and for all of them at
  // the end of every run (join_all).
  void fork_collective(int index, int m, cudaStream_t stream);
  void finish_current_scales(const BoundStep& bound_step, cudaStream_t stream);
  // `except`: a collective step not to wait for (the gather a pipelined GEMM runs beside).
  void join_overlapping(int index, int m, cudaStream_t stream, int except = -1);
  void join_all(cudaStream_t stream);
  std::pair<std::uintptr_t, std::uintptr_t> range_of(int root) const;
  // Tensor-parallel delayed scaling: the max of every delayed quantizer's amax over the ranks,
  // in place, before the scale update (one NCCL group).
  bool reduces_amaxes() const;  // a communicator or an amax group, and delayed-scaling quantizers
  void reduce_amaxes(cudaStream_t stream);
  // OPFUSE_CHECK_EACH_STEP=1: waits for step `index` (which ran `work`) and reports a fault as
  // that step's (note "Faulted context", gpu/cuda_check.h). Nothing while `stream` is capturing.
  void synchronize_after(int index, std::string_view work, cudaStream_t stream) const;
  void observed_step(int index, cudaStream_t stream);
  // One step of run mode `m`: its buffers marked live, enqueued (unless `enqueue` is false: a
  // graph replay ran it), a finished weight cast's scale_inv kept, its last uses marked dead.
  void run_listed_step(int index, int m, cudaStream_t stream, bool enqueue);
  void mark_cast(WeightCacheGroup& group);  // valid, with the parameter pointers it read
  void keep_cast_scale_inv(const WeightCacheGroup& group, cudaStream_t stream);
  float* cast_scale_inv_slot(int quantizer) const;
  void mark_live(int root);
  void mark_dead(int root);
  // Step `index` of run mode `m`: the owned roots it uses marked live; those it uses last dead.
  void mark_step_live(int index, int m);
  void mark_step_done(int index, int m);
  void mark_all_dead(bool keep_weight_cache);
  bool cache_valid(const WeightCacheGroup& group) const;
  const void* result(const std::map<std::string, int, std::less<>>& names, std::string_view name,
                     bool computed, const char* kind) const;

  const SequencePlan& plan;
  const PlanModules& modules;
  GemmRunner& gemms;
  comm::Communicator* communicator = nullptr;  // tensor-parallel plans (set_communicator)
  comm::Communicator* amax_communicator =
      nullptr;  // the data-parallel group (note "Amax reduction")
  std::unique_ptr<CollectiveStream> collective_stream;  // with a communicator
  std::vector<PendingCollective> pending_collectives;
  int collective_sms = 0;  // SMs a GEMM leaves to a collective in flight
  // Note "Pipelined collectives": the plan's pairs (set_communicator, with a communicator over
  // more than one rank and collective_chunks > 1), and per step the pair it heads (-1: none).
  int collective_chunks = 0;
  std::vector<OverlapPair> overlap_pairs;
  std::vector<int> overlap_at;
  std::optional<QuantizerState> quantizers;
  // Note "Block summaries" (gpu/block_summaries.h): made by enable_block_summaries() only.
  std::unique_ptr<BlockSummaries> block_summaries;
  int device = 0;  // the CUDA device the executor was made on
  // Whether the outputs are a training forward's (kept through backward, unlike
  // training_forward_done): a quantized output's column-wise copy exists only then.
  bool outputs_from_training = false;
  int num_sms = 0;
  int sm = 0;                                 // compute capability, major * 10 + minor
  const plan::GemmCaps* gemm_caps = nullptr;  // the device's row of plan/gemm_caps (bind checks)
  int first_backward = 0;  // index of the first backward step (steps.size() without backward)

  std::vector<BufferFacts> facts;  // per buffer id
  // Per run mode, per step: the roots it uses and the roots whose last use it is.
  std::vector<std::vector<int>> touched[kModes];
  std::vector<std::vector<int>> free_after[kModes];
  // Per step, the caller's roots it reads (require_set checks them before anything runs).
  std::vector<std::vector<int>> callers_read;
  std::vector<WeightCacheGroup> cache_groups;
  std::vector<int> cache_group_of_step;  // -1: not part of a weight-cast group
  // `with fp8_weights`: per quantizer a 16-byte slot holding the scale_inv its weight was cast
  // with (note "Weight cache"); GEMMs reading the cached copies take it instead of the
  // quantizer's, which end_step() moves on. Empty otherwise.
  DeviceBuffer cast_scale_inv;
  // The training-step counter dropout kernels read (ParamKind::DropoutStep; an unsigned int in a
  // 16-byte slot), made with the executor where the plan binds it. The plan's end-of-step
  // dropout_advance_step launch adds one on the device, so kernels read it at run time and a
  // recorded training step draws a fresh mask at every replay (note "Dropout" in
  // docs/language.md); the host copy follows eager end_step() calls (set_dropout_step sets both).
  DeviceBuffer dropout_step;
  std::uint32_t dropout_step_host = 0;
  // One statistics record per plan.stat_slots entry (tensor_stats kernels write them).
  DeviceBuffer stat_records;
  // One float32 buffer per plan.capture_slots entry, sized by bind() (tensor_capture kernels
  // write them), with its element count.
  std::vector<DeviceBuffer> captures;
  std::vector<std::int64_t> capture_counts;
  std::map<std::string, int, std::less<>> callers_by_name, outputs, input_grads, param_grads;

  // After bind().
  bool bound = false;
  std::map<std::string, std::int64_t> symbols;
  std::vector<std::size_t> bytes;  // per buffer
  std::vector<BoundStep> steps;
  std::vector<std::optional<BoundStep>> inference_steps;  // per step: its bound variant
  // Note "Fused GEMM epilogues": per binding; per step, its FusedGemm as a GEMM (fused_of_step)
  // or as the activation it folds in (folded_by_step), -1 otherwise; and per GEMM step with a
  // plan epilogue that does not run fused, why.
  std::vector<FusedGemm> fused_gemms;
  std::vector<int> fused_of_step, folded_by_step;
  std::map<int, std::string> fused_refusals;
  bool fused_epilogues = false;           // set_fused_epilogues()
  bool fused_training_epilogues = false;  // set_fused_training_epilogues()
  // Whether a forward in `mode` runs the fused GEMMs those switches allow.
  bool fusing_in(RunMode mode) const {
    return fused_epilogues && (mode == RunMode::Inference || fused_training_epilogues);
  }
  // Per run mode, per buffer id: the root's offset in `memory`, and the bytes each mode needs.
  std::vector<std::size_t> offsets[kModes];
  std::size_t needed_bytes[kModes] = {0, 0};

  // Running state.
  std::vector<const void*> caller_pointers;  // per buffer id (caller roots)
  std::vector<PointerFacts> caller_facts;    // per buffer id: what set_tensor() found there
  // Per step, a description for fault messages (OperationScope): describe_step() and its phase.
  std::vector<std::string> step_labels;
  DeviceBuffer memory;                 // every owned buffer (note "Executor buffers")
  RunMode layout = RunMode::Training;  // whose offsets the buffers have now
  std::vector<char> live;              // per root: holds values now
  std::vector<char> skip_group;        // per weight-cast group, during run_steps
  bool training_forward_done = false;
  bool outputs_valid = false;
  bool grads_valid = false;
  std::size_t live_bytes = 0, peak_bytes = 0;
  cudaStream_t last_stream = nullptr;
  bool pinned = false;  // pin_memory(): the allocation serves both modes until unpin_memory()
  StepObserver* observer = nullptr;  // set_observer(): benchmarks time each step

  // Note "Automatic graphs".
  bool auto_graph = true;
  std::vector<int> input_roots;        // the caller's inputs the forward reads
  std::vector<int> keyed_roots;        // the other caller roots the forward reads (parameters)
  std::size_t input_bytes = 0;         // of input_roots, under the binding
  std::vector<DeviceBuffer> staging;   // per input_roots entry
  cudaGraphExec_t graph = nullptr;     // the recorded inference forward
  std::vector<const void*> graph_key;  // keyed_roots' pointers when it was recorded
  std::vector<char> graph_skips;       // the weight-cast groups it skips
  bool eager_run_seen = false;         // an eager inference forward ran with the current key
  std::size_t graph_replays = 0;
};

}  // namespace opfuse::gpu
