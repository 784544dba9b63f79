// Note "Executor buffers": the caller's tensors (inputs, parameters, output gradients) are used in
// place. Every other buffer that is not a view (alias_of) is live from the first step that
// touches it to the last step of the run mode that touches it: its last use for Training, its
// last forward use for Inference (where the steps' inference variants decide what is touched).
// Two kinds live longer: interface results (to the end of the run, so the caller can read them
// until the next forward or backward), and the outputs of weight-cast groups (note "Weight
// cache"), which live as long as the executor. bind() places every buffer in one device
// allocation by those lifetimes (gpu/memory_plan.h), once per run mode: the weight copies first,
// at the same offsets in both modes, then each mode's layout. Why one allocation placed ahead of
// time instead of a pool allocation per buffer per step: a stream-ordered malloc and free cost
// about 2 us of host time each, several per step, and a forward of a small model is tens of
// launches; placing ahead of time costs nothing per step and takes no more memory than the live
// peak (the pool kept its peak anyway). The allocation is made by the first forward that needs
// it (its mode's size; a training forward after inference ones grows it once).
//
// Note "Automatic graphs": an inference forward whose inputs are small (kAutoGraphInputBytes) is
// bound by host time, not the GPU: each cuBLASLt call costs 5-9 us of host time and each launch
// 2-4 (H100 host, bench/RESULTS.md). So the second such forward with the same parameter
// pointers and weight-cache state is recorded into a CUDA graph with its inputs read from
// executor-owned staging buffers, and every later one copies the inputs there and replays the
// graph: two or three calls instead of one per step. Only inputs are copied (parameters are
// keyed by pointer; a change of either, of the weight cache, or of the allocation records the
// graph again). Never during the application's own capture, with memory pinned, or with an
// observer (benchmarks time the eager steps).
//
// Note "Weight cache": a forward group whose steps read nothing but parameters (the FP8 cast of a
// weight, with its amax step under current scaling) is skipped when it ran
// since the last end_step() / invalidate_weight_cache() with the same parameter pointers.
// Under `with fp8_weights` (TE's quantized_model_init) end_step() keeps the copies: the FP8
// weight is the parameter, cast once when the application says it changed (its quantizer
// records the weight's amax then, not at every forward), as the CPU reference does. The copy
// keeps the scale_inv it was cast with (cast_scale_inv, copied after each cast): end_step()
// moves the quantizer's scale on for the next cast, and GEMMs on the copy read the kept one.
#include "gpu/plan_executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/device_memory.h"
#include "gpu/kernel_params.h"
#include "gpu/memory_plan.h"
#include "gpu/plan_gemm.h"
#include "gpu/quantizer_state.h"
#include "opfuse/error.h"
#include "plan/gemm_caps.h"

namespace opfuse::gpu {
namespace {

using plan::BufferRole;
using plan::GemmStep;
using plan::LaunchStep;
using plan::ParamBinding;
using plan::SequencePlan;
using plan::Step;

bool is_callers(BufferRole role) {
  return role == BufferRole::Input || role == BufferRole::Param || role == BufferRole::OutputGrad;
}

std::string ir_name(const std::string& name) {
  return name.starts_with('%') ? name.substr(1) : name;
}

// "fprop GEMM of fc1 (...) (mlp.fuse:15)": what a step is and where the .fuse file asks for it.
std::string describe_step(const Step& step) {
  std::vector<std::string> locations;
  for (const plan::OpRef& op : step.ops) {
    if (!op.location.empty() &&
        std::find(locations.begin(), locations.end(), op.location) == locations.end()) {
      locations.push_back(op.location);
    }
  }
  if (locations.empty()) return fmt::format("step {} ({})", step.index, step.what);
  return fmt::format("step {} ({}, {})", step.index, step.what, fmt::join(locations, ", "));
}

QuantizerSettings settings_of(const plan::QuantizerPlan& quantizer) {
  return quantizer_settings(quantizer.name, quantizer.spec);
}

constexpr int kModes = 2;
// Inputs up to this size (all together) make an inference forward replay a graph (note
// "Automatic graphs"). Why 4 MiB: copying them costs at most a few us of device time, which
// the forward of a model that size saves in host time many times over.
constexpr std::size_t kAutoGraphInputBytes = 4u << 20;
constexpr int mode_index(RunMode mode) { return static_cast<int>(mode); }
// Why 256: what cudaMalloc gives, so every placed buffer is as aligned as a pool allocation.
constexpr std::size_t kBufferAlignment = 256;

// The launch a step runs in `mode`: its inference variant's in Inference mode where it has one.
const LaunchStep* launch_of(const Step& step, RunMode mode) {
  if (mode == RunMode::Inference && step.inference) return &step.inference->launch;
  return std::get_if<LaunchStep>(&step.body);
}

// Every buffer a step names as `mode` runs it (plan/plan.h).
std::vector<int> buffers_named_by(const Step& step, RunMode mode) {
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
};

}  // namespace

// ---- PlanModules -------------------------------------------------------------------------------

PlanModules::PlanModules(const plan::Plan& plan, const std::vector<jit::CompiledKernel>& compiled) {
  if (compiled.size() != plan.kernels.size()) {
    throw UsageError(fmt::format(
        "the plan of {} has {} kernels but {} compiled binaries were given: compile every "
        "plan.kernels[i] in order",
        plan.source, plan.kernels.size(), compiled.size()));
  }
  const std::string device_arch = current_device().arch;
  modules_.reserve(compiled.size());
  for (std::size_t i = 0; i < compiled.size(); ++i) {
    const plan::Kernel& kernel = plan.kernels[i];
    if (!compiled[i].is_ptx && compiled[i].arch != device_arch) {
      throw UsageError(fmt::format(
          "kernel '{}' was compiled for {} but this GPU runs {}: rebuild with --arch {}", kernel.id,
          compiled[i].arch, device_arch, device_arch));
    }
    modules_.emplace_back(compiled[i]);
    kernels_.emplace(kernel.id, modules_.back().kernel(kernel.name_expression));
  }
}

const Kernel& PlanModules::kernel(std::string_view id) const {
  const auto found = kernels_.find(id);
  if (found == kernels_.end()) {
    throw UsageError(fmt::format("the plan's modules have no kernel '{}'", id));
  }
  return found->second;
}

// ---- SequenceExecutor --------------------------------------------------------------------------

struct SequenceExecutor::Impl {
  Impl(const SequencePlan& plan_in, const PlanModules& modules_in, GemmRunner& gemms_in,
       cudaStream_t stream);

  // ---- construction ----
  void check_plan() const;
  void check_launch(const Step& step, const LaunchStep& launch) const;
  void learn_buffers();
  void find_weight_cache_groups();
  const void* state_pointer(const ParamBinding& param) const;

  // ---- bind ----
  std::map<std::string, std::int64_t> checked_symbols(
      const std::map<std::string, std::int64_t>& given) const;
  BoundStep bind_launch(const Step& step, const LaunchStep& launch,
                        const std::map<std::string, std::int64_t>& values) const;
  BoundStep bind_step(const Step& step, const std::map<std::string, std::int64_t>& values) const;
  void place_buffers();

  // ---- running ----
  void* pointer(int buffer) const;
  void require_set(int begin, int end, const char* call) const;
  void ensure_memory(std::size_t bytes, cudaStream_t stream);
  void free_memory(cudaStream_t stream);
  // `enqueue` false only updates what running them would (liveness, the weight cache): for a
  // graph replay that ran them.
  void run_steps(int begin, int end, cudaStream_t stream, RunMode mode, bool enqueue = true);
  bool graph_forward(cudaStream_t stream);
  void record_graph(cudaStream_t stream);
  void drop_graph();
  void run_step(int index, cudaStream_t stream);
  void observed_step(int index, cudaStream_t stream);
  // One step of run mode `m`: its buffers marked live, enqueued (unless `enqueue` is false: a
  // graph replay ran it), a finished weight cast's scale_inv kept, its last uses marked dead.
  void run_listed_step(int index, int m, cudaStream_t stream, bool enqueue);
  void mark_cast(WeightCacheGroup& group);  // valid, with the parameter pointers it read
  void keep_cast_scale_inv(const WeightCacheGroup& group, cudaStream_t stream);
  float* cast_scale_inv_slot(int quantizer) const;
  void mark_live(int root);
  void mark_dead(int root);
  void mark_all_dead(bool keep_weight_cache);
  bool cache_valid(const WeightCacheGroup& group) const;
  const void* result(const std::map<std::string, int, std::less<>>& names, std::string_view name,
                     bool computed, const char* kind) const;

  const SequencePlan& plan;
  const PlanModules& modules;
  GemmRunner& gemms;
  std::optional<QuantizerState> quantizers;
  int num_sms = 0;
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
  std::map<std::string, int, std::less<>> callers_by_name, outputs, input_grads, param_grads;

  // After bind().
  bool bound = false;
  std::map<std::string, std::int64_t> symbols;
  std::vector<std::size_t> bytes;  // per buffer
  std::vector<BoundStep> steps;
  std::vector<std::optional<BoundStep>> inference_steps;  // per step: its bound variant
  // Per run mode, per buffer id: the root's offset in `memory`, and the bytes each mode needs.
  std::vector<std::size_t> offsets[kModes];
  std::size_t needed_bytes[kModes] = {0, 0};

  // Running state.
  std::vector<const void*> caller_pointers;  // per buffer id (caller roots)
  DeviceBuffer memory;                       // every owned buffer (note "Executor buffers")
  RunMode layout = RunMode::Training;        // whose offsets the buffers have now
  std::vector<char> live;                    // per root: holds values now
  std::vector<char> skip_group;              // per weight-cast group, during run_steps
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

SequenceExecutor::Impl::Impl(const SequencePlan& plan_in, const PlanModules& modules_in,
                             GemmRunner& gemms_in, cudaStream_t stream)
    : plan(plan_in), modules(modules_in), gemms(gemms_in), last_stream(stream) {
  num_sms = current_device().sm_count;
  first_backward = static_cast<int>(plan.steps.size());
  for (const Step& step : plan.steps) {
    if (step.phase == plan::Phase::Backward && step.group >= 0) {
      first_backward = step.index;
      break;
    }
  }
  check_plan();
  learn_buffers();
  find_weight_cache_groups();
  if (!plan.quantizers.empty()) {
    std::vector<QuantizerSettings> settings;
    for (const plan::QuantizerPlan& quantizer : plan.quantizers) {
      settings.push_back(settings_of(quantizer));
    }
    quantizers.emplace(std::move(settings), stream);
    if (plan.fp8_weights) cast_scale_inv = DeviceBuffer(16 * plan.quantizers.size(), stream);
  }
  caller_pointers.assign(plan.buffers.size(), nullptr);
  live.assign(plan.buffers.size(), 0);
  skip_group.assign(cache_groups.size(), 0);
  // Why here: the pool otherwise returns freed memory to the driver at every synchronization.
  retain_pool_memory();
}

void SequenceExecutor::Impl::check_plan() const {
  const int buffer_count = static_cast<int>(plan.buffers.size());
  for (std::size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& step = plan.steps[i];
    if (step.index != static_cast<int>(i)) {
      throw UsageError(fmt::format("plan step {} has index {}: rebuild the plan", i, step.index));
    }
    for (const RunMode mode : {RunMode::Training, RunMode::Inference}) {
      for (int id : buffers_named_by(step, mode)) {
        if (id >= buffer_count) {
          throw UsageError(fmt::format("{} names buffer {}, but the plan has {}",
                                       describe_step(step), id, buffer_count));
        }
      }
    }
    if (step.inference) {
      const auto& writes = step.inference->writes;
      const bool subset = std::all_of(writes.begin(), writes.end(), [&](int id) {
        return std::find(step.writes.begin(), step.writes.end(), id) != step.writes.end();
      });
      if (!std::holds_alternative<LaunchStep>(step.body) || step.phase != plan::Phase::Forward ||
          !subset) {
        throw UsageError(fmt::format(
            "{} has an inference variant, but only forward launches can, writing a subset of "
            "what the step writes: rebuild the plan",
            describe_step(step)));
      }
      check_launch(step, step.inference->launch);
    }
    if (const auto* launch = std::get_if<LaunchStep>(&step.body)) {
      check_launch(step, *launch);
      continue;
    }
    // An FP8 operand's scale-inverse: a quantizer's scalar (block-scale grids are not run here).
    const GemmStep& gemm = std::get<GemmStep>(step.body);
    for (const plan::GemmOperand* operand : {&gemm.a, &gemm.b}) {
      if (!plan::dtype_is_fp8(operand->dtype)) continue;
      const int q = operand->scale_inv.quantizer;
      if (q < 0 || q >= static_cast<int>(plan.quantizers.size())) {
        throw UsageError(fmt::format(
            "{} reads an FP8 operand without a per-tensor scale_inv this runtime can pass "
            "(quantizer {}, scale grid buffer {}): rebuild the plan",
            describe_step(step), q, operand->scale_inv.buffer));
      }
    }
  }
}

void SequenceExecutor::Impl::check_launch(const Step& step, const LaunchStep& launch) const {
  const int quantizer_count = static_cast<int>(plan.quantizers.size());
  (void)modules.kernel(launch.kernel);
  (void)param_layout(launch.params);
  for (const ParamBinding& param : launch.params) {
    if (param.kind == plan::ParamKind::Quantizer &&
        (param.quantizer < 0 || param.quantizer >= quantizer_count)) {
      throw UsageError(fmt::format("{} binds '{}' to quantizer {} of {}", describe_step(step),
                                   param.field, param.quantizer, quantizer_count));
    }
    if (param.kind == plan::ParamKind::Quantizer &&
        param.quantizer_value == plan::QuantizerValue::RunningAmax &&
        plan.quantizers[static_cast<std::size_t>(param.quantizer)].spec.scaling !=
            plan::ScalingKind::Current) {
      throw UsageError(fmt::format(
          "{} binds '{}' to the running amax of quantizer {}, which only current scaling has",
          describe_step(step), param.field, param.quantizer));
    }
    if (param.kind != plan::ParamKind::Records) continue;
    // Why contiguous: the kernel gets one pointer to the first record and a count.
    bool contiguous = !param.records.empty();
    for (std::size_t r = 0; r < param.records.size(); ++r) {
      contiguous = contiguous && param.records[r] == param.records[0] + static_cast<int>(r) &&
                   param.records[r] < quantizer_count && param.records[0] >= 0;
    }
    if (!contiguous) {
      throw UsageError(
          fmt::format("{} binds the quantizer records [{}]: they must be ascending and contiguous "
                      "indices of the {} quantizers",
                      describe_step(step), fmt::join(param.records, ", "), quantizer_count));
    }
  }
}

void SequenceExecutor::Impl::learn_buffers() {
  const std::size_t count = plan.buffers.size();
  facts.assign(count, {});
  const int step_count = static_cast<int>(plan.steps.size());
  auto bad_lifetime = [&](const plan::Lifetime& life, int end) {
    return life.first < -1 || life.last >= end || life.last < life.first ||
           (life.first < 0) != (life.last < 0);
  };
  for (std::size_t id = 0; id < count; ++id) {
    // Codegen computed the root and its lifetimes (note "Executor buffers"); a plan.json that
    // disagrees with its own views or steps is refused rather than trusted.
    const int root = plan.buffers[id].root;
    const int alias = plan.buffers[id].alias_of;
    if (root < 0 || root >= static_cast<int>(count) ||
        plan.buffers[static_cast<std::size_t>(root)].alias_of >= 0 ||
        (alias < 0 ? root != static_cast<int>(id)
                   : alias >= static_cast<int>(count) ||
                         plan.buffers[static_cast<std::size_t>(alias)].root != root)) {
      throw UsageError(
          fmt::format("buffer {} names root {}, which is not where its views lead: rebuild the "
                      "plan",
                      id, root));
    }
    const plan::Buffer& root_buffer = plan.buffers[static_cast<std::size_t>(root)];
    if (bad_lifetime(root_buffer.training, step_count) ||
        bad_lifetime(root_buffer.inference, first_backward)) {
      throw UsageError(
          fmt::format("buffer {} has lifetimes outside the plan's steps: rebuild the "
                      "plan",
                      root));
    }
    BufferFacts& fact = facts[id];
    fact.root = root;
    fact.first_touch[mode_index(RunMode::Training)] = root_buffer.training.first;
    fact.last_touch[mode_index(RunMode::Training)] = root_buffer.training.last;
    fact.first_touch[mode_index(RunMode::Inference)] = root_buffer.inference.first;
    fact.last_touch[mode_index(RunMode::Inference)] = root_buffer.inference.last;
    fact.weight_cache = root_buffer.weight_cache;
    fact.callers = is_callers(plan.buffers[static_cast<std::size_t>(root)].role);
    const plan::Buffer& buffer = plan.buffers[id];
    if (is_callers(buffer.role) && buffer.alias_of < 0) {
      callers_by_name.emplace(ir_name(buffer.name), static_cast<int>(id));
    }
    for (const plan::InterfaceTag& tag : buffer.interface) {
      switch (tag.kind) {
        case plan::InterfaceKind::Output:
          outputs.emplace(tag.name, static_cast<int>(id));
          break;
        case plan::InterfaceKind::InputGrad:
          input_grads.emplace(tag.name, static_cast<int>(id));
          break;
        case plan::InterfaceKind::ParamGrad:
          param_grads.emplace(tag.name, static_cast<int>(id));
          break;
      }
    }
  }
  for (std::size_t id = 0; id < count; ++id) {
    BufferFacts& root = facts[static_cast<std::size_t>(facts[id].root)];
    for (const plan::InterfaceTag& tag : plan.buffers[id].interface) {
      (tag.kind == plan::InterfaceKind::Output ? root.forward_result : root.backward_result) = true;
    }
  }
  callers_read.assign(plan.steps.size(), {});
  for (const RunMode mode : {RunMode::Training, RunMode::Inference}) {
    const int m = mode_index(mode);
    touched[m].assign(plan.steps.size(), {});
    for (const Step& step : plan.steps) {
      if (mode == RunMode::Inference && step.index >= first_backward) break;
      std::set<int> roots;
      for (int id : buffers_named_by(step, mode))
        roots.insert(facts[static_cast<std::size_t>(id)].root);
      for (int root : roots) {
        const BufferFacts& fact = facts[static_cast<std::size_t>(root)];
        if (fact.callers && mode == RunMode::Training && step.group >= 0) {
          callers_read[static_cast<std::size_t>(step.index)].push_back(root);
          const bool input = plan.buffers[static_cast<std::size_t>(root)].role == BufferRole::Input;
          std::vector<int>& roots = input ? input_roots : keyed_roots;
          if (step.index < first_backward &&
              std::find(roots.begin(), roots.end(), root) == roots.end()) {
            roots.push_back(root);
          }
        }
      }
      touched[m][static_cast<std::size_t>(step.index)].assign(roots.begin(), roots.end());
    }
  }
}

void SequenceExecutor::Impl::find_weight_cache_groups() {
  // Codegen found the groups (note "Weight cache"); checked against the steps they name.
  cache_group_of_step.assign(plan.steps.size(), -1);
  for (const plan::WeightCacheGroup& group : plan.weight_cache_groups) {
    const int index = static_cast<int>(cache_groups.size());
    WeightCacheGroup cache;
    cache.steps = group.steps;
    cache.params = group.params;
    cache.quantizers = group.quantizers;
    for (int step : group.steps) {
      if (step < 0 || step >= first_backward ||
          plan.steps[static_cast<std::size_t>(step)].weight_cache_group != index) {
        throw UsageError(fmt::format(
            "weight-cache group {} names step {}, which is not one of its forward steps: rebuild "
            "the plan",
            index, step));
      }
      cache_group_of_step[static_cast<std::size_t>(step)] = index;
    }
    for (int param : group.params) {
      if (param < 0 || param >= static_cast<int>(plan.buffers.size()) ||
          plan.buffers[static_cast<std::size_t>(param)].role != BufferRole::Param) {
        throw UsageError(fmt::format(
            "weight-cache group {} reads buffer {}, which is not a parameter: rebuild the plan",
            index, param));
      }
    }
    for (int q : group.quantizers) {
      if (q < 0 || q >= static_cast<int>(plan.quantizers.size())) {
        throw UsageError(fmt::format("weight-cache group {} names quantizer {} of {}", index, q,
                                     plan.quantizers.size()));
      }
    }
    cache_groups.push_back(std::move(cache));
  }
  for (const Step& step : plan.steps) {
    if (step.weight_cache_group >= 0 &&
        cache_group_of_step[static_cast<std::size_t>(step.index)] != step.weight_cache_group) {
      throw UsageError(fmt::format("{} claims weight-cache group {}, which does not list it",
                                   describe_step(step), step.weight_cache_group));
    }
  }
  // Last uses, now that the kept buffers are known (note "Executor buffers").
  for (auto& lists : free_after) lists.assign(plan.steps.size(), {});
  for (std::size_t id = 0; id < facts.size(); ++id) {
    const BufferFacts& fact = facts[id];
    if (fact.root != static_cast<int>(id) || fact.callers || fact.weight_cache ||
        fact.forward_result || fact.backward_result) {
      continue;
    }
    for (int m = 0; m < kModes; ++m) {
      if (fact.last_touch[m] >= 0) {
        free_after[m][static_cast<std::size_t>(fact.last_touch[m])].push_back(static_cast<int>(id));
      }
    }
  }
}

const void* SequenceExecutor::Impl::state_pointer(const ParamBinding& param) const {
  if (param.kind == plan::ParamKind::Records) {
    return quantizers->records() + param.records.at(0);
  }
  switch (param.quantizer_value) {
    case plan::QuantizerValue::Scale:
      return quantizers->scale(param.quantizer);
    case plan::QuantizerValue::ScaleInv:
      return quantizers->scale_inv(param.quantizer);
    case plan::QuantizerValue::Amax:
      return quantizers->amax(param.quantizer);
    case plan::QuantizerValue::RunningAmax:
      return quantizers->running_amax(param.quantizer);
  }
  throw UsageError(fmt::format("params field '{}' binds an unknown quantizer value", param.field));
}

std::map<std::string, std::int64_t> SequenceExecutor::Impl::checked_symbols(
    const std::map<std::string, std::int64_t>& given) const {
  std::map<std::string, std::int64_t> values;
  for (const std::string& symbol : plan.symbols) {
    if (symbol == plan::kNumSmsSymbol) continue;
    const auto found = given.find(symbol);
    if (found == given.end()) {
      throw UsageError(fmt::format("sequence '{}' needs a size for '{}': bind every one of [{}]",
                                   plan.name, symbol, fmt::join(plan.symbols, ", ")));
    }
    if (found->second < 1) {
      throw UsageError(fmt::format("'{}' = {} for sequence '{}': sizes must be at least 1", symbol,
                                   found->second, plan.name));
    }
    values.emplace(symbol, found->second);
  }
  for (const auto& [symbol, value] : given) {
    if (values.count(symbol) == 0) {
      throw UsageError(fmt::format(
          "sequence '{}' has no size '{}'{}: its sizes are [{}]", plan.name, symbol,
          symbol == plan::kNumSmsSymbol ? " to bind (num_sms comes from the device)" : "",
          fmt::join(plan.symbols, ", ")));
    }
  }
  values[plan::kNumSmsSymbol] = num_sms;
  return values;
}

BoundStep SequenceExecutor::Impl::bind_launch(
    const Step& step, const LaunchStep& launch,
    const std::map<std::string, std::int64_t>& values) const {
  BoundStep bound_step;
  const std::int64_t x = evaluate_expr(launch.grid.x, values);
  const std::int64_t y = evaluate_expr(launch.grid.y, values);
  if (x < 0 || y < 0 || x > std::numeric_limits<int>::max() || y > 65535) {
    throw UsageError(
        fmt::format("{}: its grid ({}, {}) is outside CUDA's limits: bind smaller sizes",
                    describe_step(step), x, y));
  }
  bound_step.kernel = &modules.kernel(launch.kernel);
  bound_step.skip = x == 0 || y == 0;
  bound_step.grid = dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
  bound_step.block = dim3(static_cast<unsigned>(launch.block_threads));
  bound_step.dynamic_smem = static_cast<std::size_t>(launch.dynamic_smem_bytes);
  bound_step.params = pack_params(launch.params, values,
                                  [this](const ParamBinding& p) { return state_pointer(p); });
  return bound_step;
}

BoundStep SequenceExecutor::Impl::bind_step(
    const Step& step, const std::map<std::string, std::int64_t>& values) const {
  if (const auto* launch = std::get_if<LaunchStep>(&step.body)) {
    return bind_launch(step, *launch, values);
  }
  BoundStep bound_step;
  const auto* gemm = std::get_if<GemmStep>(&step.body);
  if (gemm == nullptr) return bound_step;
  bound_step.gemm = gemm_desc(*gemm, values);
  const bool fp8 = is_fp8(gemm->a.dtype) || is_fp8(gemm->b.dtype);
  const std::int64_t multiple =
      plan::gemm_dim_multiple(plan::gemm_caps(current_device().arch), fp8);
  const std::pair<const char*, const plan::SymExpr*> dims[] = {
      {"m", &gemm->m}, {"n", &gemm->n}, {"k", &gemm->k}};
  for (const auto& [dim, expr] : dims) {
    const std::int64_t value = evaluate_expr(*expr, values);
    if (value % multiple == 0) continue;
    throw UsageError(fmt::format(
        "{}: {} = {} = {} is not a multiple of {}, which cuBLASLt needs for {} GEMMs: bind the "
        "sizes in '{}' so that it is",
        describe_step(step), dim, expr->text(), value, multiple, fp8 ? "FP8" : "16-bit",
        expr->text()));
  }
  const std::vector<std::string> reasons = check_gemm(bound_step.gemm);
  if (!reasons.empty()) {
    throw UsageError(fmt::format("{}: cuBLASLt cannot run {}: {}", describe_step(step),
                                 describe(bound_step.gemm), fmt::join(reasons, "; ")));
  }
  return bound_step;
}

void SequenceExecutor::Impl::place_buffers() {
  const auto count = plan.buffers.size();
  const int end[kModes] = {static_cast<int>(plan.steps.size()), first_backward};
  // The weight copies first: they keep their values across runs of either mode.
  std::vector<BufferLifetime> weights(count);
  for (std::size_t id = 0; id < count; ++id) {
    if (facts[id].root == static_cast<int>(id) && facts[id].weight_cache)
      weights[id] = {bytes[id], 0, 0};
  }
  const MemoryPlan weight_plan = plan_memory(weights, kBufferAlignment);
  for (int m = 0; m < kModes; ++m) {
    std::vector<BufferLifetime> lifetimes(count);
    for (std::size_t id = 0; id < count; ++id) {
      const BufferFacts& fact = facts[id];
      if (fact.root != static_cast<int>(id) || fact.callers || fact.weight_cache ||
          fact.first_touch[m] < 0) {
        continue;
      }
      const bool result = fact.forward_result || fact.backward_result;
      lifetimes[id] = {bytes[id], fact.first_touch[m], result ? end[m] : fact.last_touch[m]};
    }
    const MemoryPlan mode_plan = plan_memory(lifetimes, kBufferAlignment);
    offsets[m].assign(count, 0);
    for (std::size_t id = 0; id < count; ++id) {
      offsets[m][id] = facts[id].weight_cache ? weight_plan.offsets[id]
                                              : weight_plan.bytes + mode_plan.offsets[id];
    }
    needed_bytes[m] = weight_plan.bytes + mode_plan.bytes;
  }
}

void* SequenceExecutor::Impl::pointer(int buffer) const {
  const auto root = static_cast<std::size_t>(facts[static_cast<std::size_t>(buffer)].root);
  if (facts[root].callers) {
    // Why const_cast: the caller's tensors are only read, but GemmArgs and params structs hold
    // plain pointers.
    return const_cast<void*>(caller_pointers[root]);
  }
  if (memory.data() == nullptr || bytes[root] == 0) return nullptr;
  return static_cast<char*>(memory.data()) + offsets[mode_index(layout)][root];
}

void SequenceExecutor::Impl::require_set(int begin, int end, const char* call) const {
  if (!bound) {
    throw UsageError(fmt::format("{}() of sequence '{}' before bind(): bind the sizes [{}] first",
                                 call, plan.name, fmt::join(plan.symbols, ", ")));
  }
  bool all_set = true;
  for (int index = begin; index < end && all_set; ++index) {
    for (int root : callers_read[static_cast<std::size_t>(index)])
      all_set = all_set && caller_pointers[static_cast<std::size_t>(root)] != nullptr;
  }
  if (all_set) return;
  std::vector<std::string> missing;
  for (int index = begin; index < end; ++index) {
    for (int root : callers_read[static_cast<std::size_t>(index)]) {
      const auto r = static_cast<std::size_t>(root);
      const std::string name = ir_name(plan.buffers[r].name);
      if (caller_pointers[r] == nullptr &&
          std::find(missing.begin(), missing.end(), name) == missing.end()) {
        missing.push_back(name);
      }
    }
  }
  throw UsageError(fmt::format(
      "{}() of sequence '{}' reads [{}], which were not set: call set_tensor() for each", call,
      plan.name, fmt::join(missing, ", ")));
}

void SequenceExecutor::Impl::ensure_memory(std::size_t needed, cudaStream_t stream) {
  if (memory.size() >= needed) return;
  // Growing moves every buffer: the cached weight copies go with the old allocation.
  free_memory(stream);
  memory = DeviceBuffer(needed, stream);
}

void SequenceExecutor::Impl::free_memory(cudaStream_t stream) {
  drop_graph();
  mark_all_dead(false);
  for (WeightCacheGroup& group : cache_groups) group.valid = false;
  if (memory.data() == nullptr) return;
  memory.set_stream(stream);
  memory.reset();
}

void SequenceExecutor::Impl::drop_graph() {
  // Why the status is dropped: this runs in destructors; the exec holds only its own resources.
  if (graph != nullptr) (void)cudaGraphExecDestroy(graph);
  graph = nullptr;
  graph_key.clear();
  graph_skips.clear();
  eager_run_seen = false;
}

// Note "Automatic graphs". Returns false when this forward must run eagerly.
bool SequenceExecutor::Impl::graph_forward(cudaStream_t stream) {
  if (!auto_graph || pinned || observer != nullptr || input_bytes > kAutoGraphInputBytes) {
    return false;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  OPFUSE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture), "an inference forward");
  if (capture != cudaStreamCaptureStatusNone) return false;  // the application's own graph
  std::vector<const void*> key;
  key.reserve(keyed_roots.size());
  for (int root : keyed_roots) key.push_back(caller_pointers[static_cast<std::size_t>(root)]);
  std::vector<char> skips(cache_groups.size());
  for (std::size_t g = 0; g < cache_groups.size(); ++g)
    skips[g] = cache_valid(cache_groups[g]) ? 1 : 0;
  const bool allocated = memory.size() >= needed_bytes[mode_index(RunMode::Inference)];
  if (graph == nullptr || key != graph_key || skips != graph_skips || !allocated) {
    const bool seen =
        eager_run_seen && graph == nullptr && key == graph_key && skips == graph_skips && allocated;
    drop_graph();
    graph_key = std::move(key);
    graph_skips = std::move(skips);
    // Why one eager run first: it makes the cuBLASLt plans and kernel attributes outside the
    // recording, and a forward run once with these parameters is not worth a recording.
    if (!seen) {
      eager_run_seen = true;
      return false;
    }
    record_graph(stream);
  }
  for (std::size_t i = 0; i < input_roots.size(); ++i) {
    const auto root = static_cast<std::size_t>(input_roots[i]);
    OPFUSE_CUDA_CHECK(cudaMemcpyAsync(staging[i].data(), caller_pointers[root], bytes[root],
                                      cudaMemcpyDeviceToDevice, stream),
                      "copying an input into the recorded inference forward");
  }
  OPFUSE_CUDA_CHECK(cudaGraphLaunch(graph, stream), "replaying the recorded inference forward");
  layout = RunMode::Inference;
  run_steps(0, first_backward, stream, RunMode::Inference, false);
  ++graph_replays;
  return true;
}

void SequenceExecutor::Impl::record_graph(cudaStream_t stream) {
  ensure_memory(needed_bytes[mode_index(RunMode::Inference)], stream);
  if (staging.size() != input_roots.size()) {
    staging.clear();
    for (int root : input_roots)
      staging.emplace_back(bytes[static_cast<std::size_t>(root)], stream);
  }
  layout = RunMode::Inference;
  // The recording reads the staging buffers where the caller's inputs would be.
  std::vector<const void*> callers_inputs;
  for (std::size_t i = 0; i < input_roots.size(); ++i) {
    const auto root = static_cast<std::size_t>(input_roots[i]);
    callers_inputs.push_back(caller_pointers[root]);
    caller_pointers[root] = staging[i].data();
  }
  const auto restore = [&] {
    for (std::size_t i = 0; i < input_roots.size(); ++i)
      caller_pointers[static_cast<std::size_t>(input_roots[i])] = callers_inputs[i];
  };
  // Why the weight cache is saved: recording marks its groups cast, which only the replay does.
  std::vector<WeightCacheGroup> cache_before = cache_groups;
  cudaGraph_t recorded = nullptr;
  OPFUSE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                    "recording an inference forward");
  try {
    run_steps(0, first_backward, stream, RunMode::Inference);
  } catch (...) {
    (void)cudaStreamEndCapture(stream, &recorded);
    if (recorded != nullptr) (void)cudaGraphDestroy(recorded);
    restore();
    cache_groups = std::move(cache_before);
    throw;
  }
  restore();
  cache_groups = std::move(cache_before);
  mark_all_dead(true);
  OPFUSE_CUDA_CHECK(cudaStreamEndCapture(stream, &recorded), "recording an inference forward");
  const cudaError_t instantiated = cudaGraphInstantiate(&graph, recorded, 0);
  (void)cudaGraphDestroy(recorded);
  OPFUSE_CUDA_CHECK(instantiated, "instantiating the recorded inference forward");
}

void SequenceExecutor::Impl::mark_live(int root) {
  const auto r = static_cast<std::size_t>(root);
  if (live[r] != 0) return;
  live[r] = 1;
  live_bytes += bytes[r];
  peak_bytes = std::max(peak_bytes, live_bytes);
}

void SequenceExecutor::Impl::mark_dead(int root) {
  const auto r = static_cast<std::size_t>(root);
  if (live[r] == 0) return;
  live[r] = 0;
  live_bytes -= bytes[r];
}

void SequenceExecutor::Impl::mark_all_dead(bool keep_weight_cache) {
  for (std::size_t id = 0; id < live.size(); ++id) {
    if (keep_weight_cache && facts[id].weight_cache) continue;
    mark_dead(static_cast<int>(id));
  }
}

bool SequenceExecutor::Impl::cache_valid(const WeightCacheGroup& group) const {
  if (!group.valid) return false;
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    if (caller_pointers[static_cast<std::size_t>(group.params[i])] != group.cast_from[i]) {
      return false;
    }
  }
  return true;
}

void SequenceExecutor::Impl::run_steps(int begin, int end, cudaStream_t stream, RunMode mode,
                                       bool enqueue) {
  last_stream = stream;
  for (std::size_t g = 0; g < cache_groups.size(); ++g)
    skip_group[g] = cache_valid(cache_groups[g]) ? 1 : 0;
  const int m = mode_index(mode);
  for (int index = begin; index < end; ++index) {
    const auto i = static_cast<std::size_t>(index);
    if (plan.steps[i].group < 0) continue;  // the end-of-step scale update: end_step() runs it
    const int group = cache_group_of_step[i];
    if (group >= 0 && skip_group[static_cast<std::size_t>(group)] != 0) continue;
    run_listed_step(index, m, stream, enqueue);
  }
  for (WeightCacheGroup& group : cache_groups) {
    if (group.steps.front() < begin || group.steps.back() >= end) continue;
    mark_cast(group);
  }
}

void SequenceExecutor::Impl::run_listed_step(int index, int m, cudaStream_t stream, bool enqueue) {
  const auto i = static_cast<std::size_t>(index);
  for (int root : touched[m][i]) {
    if (!facts[static_cast<std::size_t>(root)].callers) mark_live(root);
  }
  if (enqueue) {
    observed_step(index, stream);
    const int group = cache_group_of_step[i];
    if (group >= 0 && cache_groups[static_cast<std::size_t>(group)].steps.back() == index)
      keep_cast_scale_inv(cache_groups[static_cast<std::size_t>(group)], stream);
  }
  for (int root : free_after[m][i]) mark_dead(root);
}

void SequenceExecutor::Impl::mark_cast(WeightCacheGroup& group) {
  group.valid = true;
  group.cast_from.clear();
  for (int param : group.params) {
    group.cast_from.push_back(caller_pointers[static_cast<std::size_t>(param)]);
  }
}

void SequenceExecutor::Impl::run_step(int index, cudaStream_t stream) {
  const auto i = static_cast<std::size_t>(index);
  const Step& step = plan.steps[i];
  BoundStep& bound_step =
      layout == RunMode::Inference && inference_steps[i] ? *inference_steps[i] : steps[i];
  if (std::holds_alternative<LaunchStep>(step.body)) {
    if (bound_step.skip) return;
    bound_step.params.set_buffers([this](int buffer) { return pointer(buffer); });
    gpu::launch(*bound_step.kernel, bound_step.grid, bound_step.block, bound_step.dynamic_smem,
                stream, bound_step.params.bytes.data(), bound_step.params.bytes.size());
  } else {
    const GemmStep& gemm = std::get<GemmStep>(step.body);
    GemmArgs args = gemm_args(
        gemm, bound_step.gemm, [this](int buffer) { return pointer(buffer); },
        quantizers ? &*quantizers : nullptr);
    if (cast_scale_inv.data() != nullptr) {  // fp8_weights: the scale the copy was cast with
      const auto cached = [this](const plan::GemmOperand& operand) {
        return operand.scale_inv.quantizer >= 0 &&
               facts[static_cast<std::size_t>(facts[static_cast<std::size_t>(operand.buffer)].root)]
                   .weight_cache;
      };
      if (args.a_scale_inv != nullptr && cached(gemm.a))
        args.a_scale_inv = cast_scale_inv_slot(gemm.a.scale_inv.quantizer);
      if (args.b_scale_inv != nullptr && cached(gemm.b))
        args.b_scale_inv = cast_scale_inv_slot(gemm.b.scale_inv.quantizer);
    }
    gemms.run(bound_step.gemm, args, stream);
  }
}

void SequenceExecutor::Impl::keep_cast_scale_inv(const WeightCacheGroup& group,
                                                 cudaStream_t stream) {
  if (cast_scale_inv.data() == nullptr) return;
  for (const int q : group.quantizers) {
    OPFUSE_CUDA_CHECK(cudaMemcpyAsync(cast_scale_inv_slot(q), quantizers->scale_inv(q),
                                      sizeof(float), cudaMemcpyDeviceToDevice, stream),
                      "keeping an FP8 weight's scale_inv");
  }
}

float* SequenceExecutor::Impl::cast_scale_inv_slot(int quantizer) const {
  return static_cast<float*>(cast_scale_inv.data()) + 4 * static_cast<std::size_t>(quantizer);
}

void SequenceExecutor::Impl::observed_step(int index, cudaStream_t stream) {
  if (observer != nullptr) observer->before(index, stream);
  run_step(index, stream);
  if (observer != nullptr) observer->after(index, stream);
}

const void* SequenceExecutor::Impl::result(const std::map<std::string, int, std::less<>>& names,
                                           std::string_view name, bool computed,
                                           const char* kind) const {
  const auto found = names.find(name);
  if (found == names.end()) {
    std::vector<std::string> known;
    known.reserve(names.size());
    for (const auto& [known_name, id] : names) known.push_back(known_name);
    throw UsageError(fmt::format("sequence '{}' has no {} '{}': its {}s are [{}]", plan.name, kind,
                                 name, kind, fmt::join(known, ", ")));
  }
  const void* data = pointer(found->second);
  if (!computed || data == nullptr) {
    throw UsageError(fmt::format(
        "{} '{}' of sequence '{}' is not computed: results live from the forward (outputs) or "
        "backward (gradients) that makes them until the next forward() or backward()",
        kind, name, plan.name));
  }
  return data;
}

SequenceExecutor::SequenceExecutor(const SequencePlan& plan, const PlanModules& modules,
                                   GemmRunner& gemms, cudaStream_t stream)
    : impl_(std::make_unique<Impl>(plan, modules, gemms, stream)) {}

SequenceExecutor::~SequenceExecutor() {
  if (impl_) impl_->free_memory(impl_->last_stream);
}

void SequenceExecutor::bind(const std::map<std::string, std::int64_t>& symbols) {
  Impl& s = *impl_;
  std::map<std::string, std::int64_t> values = s.checked_symbols(symbols);
  std::vector<std::size_t> bytes;
  for (const plan::Buffer& buffer : s.plan.buffers) {
    bytes.push_back(static_cast<std::size_t>(evaluate_expr(buffer.bytes, values)));
  }
  std::vector<BoundStep> steps;
  std::vector<std::optional<BoundStep>> inference_steps;
  for (const Step& step : s.plan.steps) {
    steps.push_back(s.bind_step(step, values));
    inference_steps.emplace_back();
    if (step.inference)
      inference_steps.back() = s.bind_launch(step, step.inference->launch, values);
  }
  // Everything checked: replace the old binding (its buffers may have other sizes).
  if (s.pinned) {
    throw UsageError(fmt::format(
        "bind() of sequence '{}' while its memory is pinned for a CUDA graph: release the graph "
        "first",
        s.plan.name));
  }
  s.free_memory(s.last_stream);
  s.symbols = std::move(values);
  s.bytes = std::move(bytes);
  s.steps = std::move(steps);
  s.inference_steps = std::move(inference_steps);
  s.place_buffers();
  s.staging.clear();
  s.input_bytes = 0;
  for (int root : s.input_roots) s.input_bytes += s.bytes[static_cast<std::size_t>(root)];
  s.bound = true;
  s.training_forward_done = s.outputs_valid = s.grads_valid = false;
}

std::vector<TensorInfo> SequenceExecutor::tensors() const {
  const Impl& s = *impl_;
  if (!s.bound) {
    throw UsageError(fmt::format(
        "tensors() of sequence '{}' before bind(): their sizes are not known yet", s.plan.name));
  }
  std::vector<TensorInfo> infos;
  auto add = [&](int id, std::string name, BufferRole role, std::string_view result_kind) {
    const plan::Buffer& buffer = s.plan.buffers[static_cast<std::size_t>(id)];
    TensorInfo info;
    info.name = std::move(name);
    info.role = role;
    info.result_kind = std::string(result_kind);
    info.dtype = buffer.dtype;
    for (const plan::SymExpr& dim : buffer.shape) {
      info.shape.push_back(evaluate_expr(dim, s.symbols));
    }
    info.bytes = s.bytes[static_cast<std::size_t>(id)];
    infos.push_back(std::move(info));
  };
  for (const plan::Buffer& buffer : s.plan.buffers) {
    if (is_callers(buffer.role) && buffer.alias_of < 0)
      add(buffer.id, ir_name(buffer.name), buffer.role, "");
  }
  for (const auto& [name, id] : s.outputs) add(id, name, BufferRole::Result, "output");
  for (const auto& [name, id] : s.input_grads) add(id, name, BufferRole::Result, "input_grad");
  for (const auto& [name, id] : s.param_grads) add(id, name, BufferRole::Result, "param_grad");
  return infos;
}

TensorInfo SequenceExecutor::tensor(std::string_view name) const {
  // The caller's tensor first: an input and its gradient share a name.
  std::vector<TensorInfo> infos = tensors();
  for (TensorInfo& info : infos) {
    if (info.name == name) return std::move(info);
  }
  std::vector<std::string> names;
  names.reserve(infos.size());
  for (const TensorInfo& info : infos) names.push_back(info.name);
  throw UsageError(fmt::format("sequence '{}' has no tensor '{}': its tensors are [{}]",
                               impl_->plan.name, name, fmt::join(names, ", ")));
}

void SequenceExecutor::set_tensor(std::string_view name, const void* device_ptr) {
  Impl& s = *impl_;
  const auto found = s.callers_by_name.find(name);
  if (found == s.callers_by_name.end()) {
    std::vector<std::string> names;
    for (const auto& [known, id] : s.callers_by_name) names.push_back(known);
    throw UsageError(fmt::format(
        "sequence '{}' takes no tensor '{}' from the caller: it takes [{}] (inputs, parameters "
        "and output gradients)",
        s.plan.name, name, fmt::join(names, ", ")));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(device_ptr);
  if (device_ptr == nullptr || address % 16 != 0) {
    throw UsageError(fmt::format(
        "tensor '{}' of sequence '{}' at {:#x} is {}: pass device memory that starts 16-byte "
        "aligned (cudaMallocAsync gives 256)",
        name, s.plan.name, address, device_ptr == nullptr ? "null" : "not 16-byte aligned"));
  }
  s.caller_pointers[static_cast<std::size_t>(found->second)] = device_ptr;
}

void SequenceExecutor::forward(cudaStream_t stream, RunMode mode) {
  Impl& s = *impl_;
  s.require_set(0, s.first_backward, "forward");
  s.mark_all_dead(true);
  s.outputs_valid = s.grads_valid = s.training_forward_done = false;
  if (mode == RunMode::Inference && s.graph_forward(stream)) {
    s.outputs_valid = true;
    return;
  }
  s.ensure_memory(s.pinned ? s.memory.size() : s.needed_bytes[mode_index(mode)], stream);
  s.layout = mode;
  s.run_steps(0, s.first_backward, stream, mode);
  s.outputs_valid = true;
  s.training_forward_done = mode == RunMode::Training;
}

void SequenceExecutor::backward(cudaStream_t stream) {
  Impl& s = *impl_;
  if (!s.training_forward_done) {
    throw UsageError(fmt::format(
        "backward() of sequence '{}' needs a forward(stream, RunMode::Training) since the last "
        "backward",
        s.plan.name));
  }
  const int end = static_cast<int>(s.plan.steps.size());
  s.require_set(s.first_backward, end, "backward");
  // The outputs stay readable (the application computes its loss from them) until the next
  // forward releases them.
  s.training_forward_done = false;
  s.run_steps(s.first_backward, end, stream, RunMode::Training);
  s.grads_valid = true;
}

void SequenceExecutor::end_step(cudaStream_t stream) {
  Impl& s = *impl_;
  if (!s.bound) {
    throw UsageError(fmt::format("end_step() of sequence '{}' before bind()", s.plan.name));
  }
  for (const Step& step : s.plan.steps) {
    if (step.group < 0) s.observed_step(step.index, stream);
  }
  s.last_stream = stream;
  if (!s.plan.fp8_weights) invalidate_weight_cache();  // note "Weight cache"
}

void SequenceExecutor::cast_weights(cudaStream_t stream) {
  Impl& s = *impl_;
  s.require_set(0, 0, "cast_weights");  // bound
  std::vector<std::size_t> stale;
  for (std::size_t g = 0; g < s.cache_groups.size(); ++g) {
    if (!s.cache_valid(s.cache_groups[g])) stale.push_back(g);
  }
  for (const std::size_t g : stale) {
    for (const int index : s.cache_groups[g].steps) s.require_set(index, index + 1, "cast_weights");
  }
  if (stale.empty()) return;
  s.ensure_memory(s.pinned ? s.memory.size() : s.needed_bytes[mode_index(s.layout)], stream);
  s.last_stream = stream;
  const int m = mode_index(s.layout);
  for (const std::size_t g : stale) {
    WeightCacheGroup& group = s.cache_groups[g];
    for (const int index : group.steps) s.run_listed_step(index, m, stream, true);
    s.mark_cast(group);
  }
}

void SequenceExecutor::pin_memory(cudaStream_t stream) {
  Impl& s = *impl_;
  if (!s.bound) {
    throw UsageError(fmt::format("pin_memory() of sequence '{}' before bind()", s.plan.name));
  }
  s.ensure_memory(std::max(s.needed_bytes[0], s.needed_bytes[1]), stream);
  s.pinned = true;
}

void SequenceExecutor::unpin_memory(cudaStream_t stream) {
  Impl& s = *impl_;
  s.pinned = false;
  s.free_memory(stream);
  s.training_forward_done = s.outputs_valid = s.grads_valid = false;
}

void SequenceExecutor::invalidate_weight_cache() {
  for (WeightCacheGroup& group : impl_->cache_groups) group.valid = false;
}

const void* SequenceExecutor::output(std::string_view name) const {
  return impl_->result(impl_->outputs, name, impl_->outputs_valid, "output");
}

const void* SequenceExecutor::input_grad(std::string_view name) const {
  return impl_->result(impl_->input_grads, name, impl_->grads_valid, "input_grad");
}

const void* SequenceExecutor::param_grad(std::string_view name) const {
  return impl_->result(impl_->param_grads, name, impl_->grads_valid, "param_grad");
}

const void* SequenceExecutor::debug_buffer(int buffer_id) const {
  const Impl& s = *impl_;
  if (buffer_id < 0 || buffer_id >= static_cast<int>(s.plan.buffers.size())) {
    throw UsageError(fmt::format("sequence '{}' has no buffer {}", s.plan.name, buffer_id));
  }
  const int root = s.facts[static_cast<std::size_t>(buffer_id)].root;
  if (!s.facts[static_cast<std::size_t>(root)].callers &&
      s.live[static_cast<std::size_t>(root)] == 0) {
    return nullptr;
  }
  return s.pointer(buffer_id);
}

std::vector<cpu::DelayedScalingState> SequenceExecutor::download_quantizers(
    cudaStream_t stream) const {
  if (!impl_->quantizers) return {};
  return impl_->quantizers->download(stream);
}

void SequenceExecutor::upload_quantizers(const std::vector<cpu::DelayedScalingState>& states,
                                         cudaStream_t stream) {
  if (!impl_->quantizers) {
    if (states.empty()) return;
    throw UsageError(fmt::format("sequence '{}' has no quantizers, but {} states were given",
                                 impl_->plan.name, states.size()));
  }
  impl_->quantizers->upload(states, stream);
  invalidate_weight_cache();  // the FP8 weight copies were cast with the old scales
}

ExecutorMemory SequenceExecutor::memory() const {
  return {impl_->live_bytes, impl_->peak_bytes, impl_->memory.size()};
}

void SequenceExecutor::reset_peak() { impl_->peak_bytes = impl_->live_bytes; }

void SequenceExecutor::set_observer(StepObserver* observer) { impl_->observer = observer; }

void SequenceExecutor::set_auto_graph(bool enabled) {
  impl_->auto_graph = enabled;
  if (!enabled) impl_->drop_graph();
}

std::size_t SequenceExecutor::graph_replays() const { return impl_->graph_replays; }

std::vector<StepProfile> SequenceExecutor::step_profiles(RunMode mode) const {
  const Impl& s = *impl_;
  if (!s.bound) {
    throw UsageError(fmt::format("step_profiles() of sequence '{}' before bind()", s.plan.name));
  }
  std::vector<StepProfile> profiles;
  profiles.reserve(s.plan.steps.size());
  for (const Step& step : s.plan.steps) {
    StepProfile profile;
    profile.index = step.index;
    profile.phase = step.phase;
    profile.what = step.what;
    profile.pattern = step.pattern;
    profile.end_of_step = step.group < 0;
    profile.weight_cast = s.cache_group_of_step[static_cast<std::size_t>(step.index)] >= 0;
    const bool variant = mode == RunMode::Inference && step.inference.has_value();
    if (variant) {
      // "layernorm bf16 -> e4m3 + transposed copy" names what the training launch writes.
      const auto copy = profile.what.find(" + transposed copy");
      if (copy != std::string::npos) profile.what.erase(copy, std::strlen(" + transposed copy"));
      profile.what += " (inference variant: no transposed copy)";
    }
    for (int id : step.reads) profile.bytes_read += s.bytes[static_cast<std::size_t>(id)];
    for (int id : variant ? step.inference->writes : step.writes)
      profile.bytes_written += s.bytes[static_cast<std::size_t>(id)];
    if (const LaunchStep* launch = launch_of(step, mode)) {
      profile.kind = StepProfile::Kind::Kernel;
      profile.kernel = launch->kernel;
    } else {
      const GemmDesc& desc = s.steps[static_cast<std::size_t>(step.index)].gemm;
      profile.kind = StepProfile::Kind::Gemm;
      profile.gemm = desc;
      profile.gemm_role = std::string(plan::name(std::get<GemmStep>(step.body).role));
      profile.flops = 2.0 * double(desc.m) * double(desc.n) * double(desc.k);
    }
    profiles.push_back(std::move(profile));
  }
  return profiles;
}

}  // namespace opfuse::gpu
