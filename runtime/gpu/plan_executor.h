// Runs one sequence of a codegen plan (docs/codegen.md) on the GPU: the plan's steps in order on
// the caller's stream (generated-kernel launches and cuBLASLt GEMMs), its buffers placed
// at bind() in one device allocation by their lifetimes (buffers never live at the same time
// share memory), quantizer state on the device, FP8 weight copies cast once per step and reused,
// and no host synchronization between bind() and the results. The public API
// (runtime/include/opfuse/) wraps it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cpu/quantizer_math.h"
#include "debug/capture.h"
#include "gpu/block_summaries.h"
#include "gpu/gemm.h"
#include "gpu/module.h"
#include "jit/nvrtc_compiler.h"
#include "plan/plan.h"

namespace opfuse::comm {
class Communicator;
}

namespace opfuse::gpu {

// The generated kernels of a plan, loaded on the current device.
class PlanModules {
 public:
  // `compiled[i]` is plan.kernels[i] compiled (fusec build's cubins, or the JIT cache's). Throws
  // UsageError when the counts differ or a binary is for another arch than the current device,
  // CudaError when a module does not load.
  PlanModules(const plan::Plan& plan, const std::vector<jit::CompiledKernel>& compiled);
  // The entry of kernel `id` (plan::Kernel::id). Throws UsageError for an unknown id.
  const Kernel& kernel(std::string_view id) const;

 private:
  std::vector<Module> modules_;
  std::map<std::string, Kernel, std::less<>> kernels_;
};

enum class RunMode : uint8_t {
  Training,   // keeps what backward needs
  Inference,  // reuses every intermediate's memory after its last forward reader; runs the
              // steps' inference variants (no FP8 transposed copies for backward)
};

// Where an interface tensor lives and what it is, with its sizes evaluated under the bindings.
struct TensorInfo {
  std::string name;  // IR name without '%': "x", "fc1.weight", "dy", "y"
  plan::BufferRole role = plan::BufferRole::Input;
  // Results: "output", "input_grad" or "param_grad" (an input and its gradient share a name);
  // empty for the caller's tensors.
  std::string result_kind;
  plan::DType dtype = plan::DType::BF16;
  std::vector<std::int64_t> shape;
  std::size_t bytes = 0;
};

struct ExecutorMemory {
  std::size_t live_bytes = 0;      // bytes of the buffers holding values now (not the caller's)
  std::size_t peak_bytes = 0;      // most at once since construction or reset_peak()
  std::size_t reserved_bytes = 0;  // the device allocation they are placed in
};

// What one plan step does under the current bindings, for benchmarks (fusec bench): its kind,
// what it moves (the step's reads and writes lists at their bound sizes) and, for a GEMM, its
// problem, so a report can give TFLOP/s for GEMMs and GB/s for memory-bound kernels.
struct StepProfile {
  enum class Kind : std::uint8_t { Kernel, Gemm, Collective };
  int index = 0;
  plan::Phase phase = plan::Phase::Forward;
  Kind kind = Kind::Kernel;
  std::string what;       // the plan's one-line description
  std::string kernel;     // Kernel: plan::Kernel::id
  std::string pattern;    // the fusion pattern, empty for an unfused op
  GemmDesc gemm;          // Gemm only
  std::string gemm_role;  // Gemm: "fprop", "dgrad" or "wgrad"
  double flops = 0;       // Gemm: 2 m n k
  std::size_t bytes_read = 0;
  std::size_t bytes_written = 0;
  bool end_of_step = false;  // the scale update end_step() runs
  bool weight_cast = false;  // in a weight-cast group: skipped while the FP8 weights are cached
  // Inference: folded into another step's GEMM (note "Fused GEMM epilogues"), so never run.
  bool folded = false;
};

// Called around every step the executor enqueues (forward, backward, end_step), on the stream it
// enqueues on, e.g. to record CUDA events. Never called for steps that are skipped (cached weight
// casts, launches with an empty grid). The calls pair up one step at a time: after(step) comes
// before the next before(). A pipelined GEMM and collective (note "Pipelined collectives" in
// executor_run.cpp) are observed as the GEMM's pieces and the collective's last stage. The calls
// happen during a graph capture too: an observer must not be set then.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void before(int step, cudaStream_t stream) = 0;
  virtual void after(int step, cudaStream_t stream) = 0;
};

// Bytes of one statistics record (debug::TensorMoments: 11 eight-byte fields).
inline constexpr std::size_t kStatRecordBytes = 88;

class SequenceExecutor {
 public:
  // Builds the quantizer state of `plan` on `stream` (delayed: scale 1, history zero) and keeps
  // references to `plan`, `modules` and `gemms`, which must outlive it. Nothing else is
  // allocated until the first forward.
  SequenceExecutor(const plan::SequencePlan& plan, const PlanModules& modules, GemmRunner& gemms,
                   cudaStream_t stream);
  ~SequenceExecutor();
  SequenceExecutor(const SequenceExecutor&) = delete;
  SequenceExecutor& operator=(const SequenceExecutor&) = delete;

  const plan::SequencePlan& plan() const;

  // A tensor-parallel plan (plan.parallel.tp > 1) runs its collective steps, and reduces its
  // delayed-scaling amaxes before each scale update, over this communicator (runtime/comm),
  // which must outlive the executor and have plan.parallel.tp ranks. A one-rank plan needs none
  // (its collectives are copies); given a one-rank communicator it makes NCCL's calls instead.
  void set_communicator(comm::Communicator* communicator);
  // The data-parallel group (TE's amax reduction group): replicas of this plan (of this rank of
  // a tensor-parallel one) training on other data. end_step() max-reduces the delayed-scaling
  // amaxes over it too, after the tensor-parallel ranks', so every replica updates the same
  // scales (note "Amax reduction"). Must outlive the executor; null: none.
  void set_amax_communicator(comm::Communicator* communicator);
  // How this executor runs its collectives beside the other steps (note "Pipelined collectives"
  // in executor_run.cpp), one line each for reports: the SMs a GEMM leaves a collective in
  // flight, and each GEMM pipelined with a collective, in how many stages. Empty without a
  // communicator over more than one rank.
  std::vector<std::string> collective_overlap() const;

  // Sets the run-time sizes (every symbol of plan.symbols but num_sms, which comes from the
  // device) and places the buffers for them. Throws UsageError, launching nothing, for a missing
  // or unknown symbol, a size < 1, or a GEMM dimension cuBLASLt FP8 cannot take (FP8: every m, n,
  // k a multiple of 16; bf16: a multiple of 8), naming the symbol, the GEMM and the .fuse line.
  // The device allocation is made (stream-ordered) by the first forward that needs it: the
  // inference layout's size for inference forwards, the training layout's for training.
  void bind(const std::map<std::string, std::int64_t>& symbols);

  // Inputs, parameters, output gradients (what the caller provides) and outputs, input and
  // parameter gradients (what the executor writes), evaluated under the current bindings.
  // Throws UsageError before bind().
  std::vector<TensorInfo> tensors() const;
  TensorInfo tensor(std::string_view name) const;  // UsageError for an unknown name

  // The caller's device memory for an input, parameter or output gradient, by IR name. Throws
  // UsageError for an unknown name, a null or not 16-byte aligned pointer. Pointers stay the
  // caller's; changing a parameter pointer invalidates the FP8 weight copies.
  void set_tensor(std::string_view name, const void* device_ptr);

  // Runs the forward steps on `stream`. Throws UsageError, launching nothing, when a tensor the
  // forward reads was not set or bind() was not called.
  void forward(cudaStream_t stream, RunMode mode = RunMode::Training);
  // Runs the backward steps (all but the end-of-step scale update). Needs a Training forward
  // since the last backward and every output gradient set; UsageError otherwise.
  void backward(cudaStream_t stream);
  // Ends a training step: the one update_scales launch over every quantizer, then the FP8
  // weight copies are marked stale (the next forward casts the weights again), except under
  // `with fp8_weights`, where they stay until invalidate_weight_cache() or a new parameter
  // pointer (note "Weight cache" in plan_executor.cpp).
  void end_step(cudaStream_t stream);
  // The training step dropout's Philox counter reads (0 at the first; each end_step() adds one,
  // on the device; replays of a recorded step are not counted here), and setting it (resuming
  // from a checkpoint, or after replays), copied to the device on `stream`.
  std::uint32_t dropout_step() const;
  void set_dropout_step(std::uint32_t step, cudaStream_t stream);
  // The parameters changed behind the executor's back (an optimizer step, a checkpoint load).
  void invalidate_weight_cache();
  // Casts the stale FP8 weight copies now, on `stream` (the next forward would otherwise), e.g.
  // before recording a graph that should not contain the casts. UsageError, launching nothing,
  // before bind() or when a parameter they read was not set.
  void cast_weights(cudaStream_t stream);

  // For CUDA graphs: pin_memory() makes the device allocation for both run modes now (on
  // `stream`, outside any capture) and keeps it until unpin_memory(), so a captured forward or
  // backward holds no allocation or free nodes and its pointers stay valid across replays.
  // unpin_memory() frees it; results are unavailable until the next forward/backward.
  void pin_memory(cudaStream_t stream);
  void unpin_memory(cudaStream_t stream);

  // An output ("y") or gradient ("x", "fc1.weight" as named in the plan's interface lists:
  // "output y", "input_grad x", "param_grad fc1.weight"): device memory the executor owns.
  // Outputs stay valid until the next forward, gradients until the next forward/backward.
  // UsageError when that result was not computed yet.
  const void* output(std::string_view name) const;
  const void* input_grad(std::string_view name) const;
  const void* param_grad(std::string_view name) const;
  // Any plan buffer's device memory by id (plan::Buffer::id), intermediates included, for tests
  // and debugging: the caller's pointer, the live allocation, or nullptr where none is live now.
  // Throws UsageError for an id the plan does not have.
  const void* debug_buffer(int buffer_id) const;

  // The statistics records of an instrumented plan variant (plan::SequencePlan::stat_slots), as
  // the last run left them: kStatRecordBytes per slot in debug::TensorMoments' layout (debug/
  // stats.h), copied to the host after waiting for `stream`. Empty for a plan without slots.
  std::vector<unsigned char> stat_records(cudaStream_t stream) const;
  // The same without waiting: stat_record_bytes() bytes enqueued on `stream` into `host` (pinned
  // memory, so the copy is asynchronous), valid once `stream` reaches this point.
  std::size_t stat_record_bytes() const;
  void copy_stat_records_async(void* host, cudaStream_t stream) const;
  // The tensor captures of an instrumented plan variant (plan::SequencePlan::capture_slots), as
  // the last run left them: per slot its shape and float32 values, copied to the host after
  // waiting for `stream`. Empty for a plan without slots; zeros for a slot not run since bind().
  std::vector<debug::CapturedTensor> captures(cudaStream_t stream) const;

  // Note "Block summaries" (gpu/block_summaries.h): from now on every copy of a block-scaled or
  // micro-scaled quantizer is summarized right after the step that makes it (one small launch
  // each). Compiles the summary kernels now (NVRTC). Throws UsageError for a tensor-parallel plan.
  void enable_block_summaries(cudaStream_t stream);
  bool block_summaries_enabled() const;
  // The summaries of every copy made since enable_block_summaries(), each its latest cast's, in
  // quantizer order (the row-wise copy first), after waiting for `stream`. UsageError unless
  // enabled.
  std::vector<CopySummary> block_summaries(cudaStream_t stream) const;

  // Quantizer state (plan order), copied to the host after waiting for `stream`, and replaced
  // (checkpoint load). upload throws UsageError, copying nothing, on a count/length mismatch.
  std::vector<cpu::DelayedScalingState> download_quantizers(cudaStream_t stream) const;
  // A per-tensor quantizer's scale_inv in device memory (a quantized output's, note "Quantized
  // boundaries" in docs/architecture.md); UsageError for another quantizer. And whether the
  // outputs are a training forward's (an inference forward makes no column-wise copies).
  const float* quantizer_scale_inv(int index) const;
  // A per-tensor or NVFP4 quantizer's scale (NVFP4: S_enc) in device memory; UsageError else.
  const float* quantizer_scale(int index) const;
  bool outputs_from_training() const;
  void upload_quantizers(const std::vector<cpu::DelayedScalingState>& states, cudaStream_t stream);

  ExecutorMemory memory() const;
  void reset_peak();

  // Benchmark hooks. set_observer(nullptr) (the default) removes it; the observer must outlive
  // its use. step_profiles() is per plan step (Step::index order) as `mode` runs it (Inference:
  // the inference variants), and in Training mode of a plan with a communicator and delayed
  // scaling one more, index plan.steps.size(): end_step()'s amax all-reduce, which the observer
  // sees under that index; UsageError before bind().
  void set_observer(StepObserver* observer);
  std::vector<StepProfile> step_profiles(RunMode mode = RunMode::Training) const;

  // Inference forwards with small inputs replay a CUDA graph the executor records itself (note
  // "Automatic graphs" in plan_executor.cpp): on by default; off runs every forward eagerly.
  // graph_replays() counts the forwards that replayed one.
  void set_auto_graph(bool enabled);
  std::size_t graph_replays() const;

  // Note "Fused GEMM epilogues" (executor_fused.cpp): forwards run an FP8 GEMM with the gated
  // activation after it in its epilogue where the plan allows it and this GPU has the kernel (the
  // same values up to the GEMM's FP32 summation order). set_fused_epilogues: inference forwards;
  // set_fused_training_epilogues: training forwards too (it needs set_fused_epilogues). Both off
  // by default: on the H200 both kernels are slower than the planned pair so far
  // (bench/RESULTS.md). fused_gemm_refusals() says, per planned pair bind() did not fuse in some
  // mode, why.
  void set_fused_epilogues(bool enabled);
  void set_fused_training_epilogues(bool enabled);
  std::map<int, std::string> fused_gemm_refusals() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace opfuse::gpu
