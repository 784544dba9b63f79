// SequenceExecutor's construction and public API (runtime/gpu/plan_executor.h), with PlanModules;
// the API forwards to SequenceExecutor::Impl (runtime/gpu/executor_impl.h), whose member functions
// are split by concern over executor_checks.cpp, executor_bind.cpp, executor_run.cpp and
// executor_graph.cpp. The executor's design notes are here, cited by name elsewhere.
//
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

#include <cstdlib>

#include "gpu/executor_impl.h"

namespace opfuse::gpu {

namespace {

// Whether a launch of the plan reads dropout's step counter.
bool binds_dropout_step(const plan::SequencePlan& plan) {
  for (const plan::Step& step : plan.steps) {
    const auto* launch = std::get_if<plan::LaunchStep>(&step.body);
    if (launch == nullptr) continue;
    for (const plan::ParamBinding& param : launch->params)
      if (param.kind == plan::ParamKind::DropoutStep) return true;
  }
  return false;
}

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

SequenceExecutor::Impl::Impl(const SequencePlan& plan_in, const PlanModules& modules_in,
                             GemmRunner& gemms_in, cudaStream_t stream)
    : plan(plan_in), modules(modules_in), gemms(gemms_in), last_stream(stream) {
  const DeviceInfo info = current_device();
  device = info.ordinal;
  num_sms = info.sm_count;
  sm = info.major * 10 + info.minor;
  gemm_caps = &plan::gemm_caps(info.arch);
  first_backward = static_cast<int>(plan.steps.size());
  for (const Step& step : plan.steps) {
    if (step.phase == plan::Phase::Backward && step.group >= 0) {
      first_backward = step.index;
      break;
    }
  }
  check_plan();
  callers_by_name = caller_tensors(plan);
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
  // Dropout's step counter, 0 for the first step (ParamKind::DropoutStep).
  if (binds_dropout_step(plan)) {
    dropout_step = DeviceBuffer(16, stream);
    OPFUSE_CUDA_CHECK(cudaMemsetAsync(dropout_step.data(), 0, dropout_step.size(), stream));
  }
  if (!plan.stat_slots.empty()) {
    stat_records = DeviceBuffer(kStatRecordBytes * plan.stat_slots.size(), stream);
    OPFUSE_CUDA_CHECK(cudaMemsetAsync(stat_records.data(), 0, stat_records.size(), stream));
  }
  caller_pointers.assign(plan.buffers.size(), nullptr);
  caller_facts.assign(plan.buffers.size(), PointerFacts{});
  for (const Step& step : plan.steps) {
    step_labels.push_back(
        fmt::format("{} {} of sequence '{}'", describe_step(step),
                    step.index < first_backward ? "in the forward" : "in the backward", plan.name));
  }
  // OPFUSE_CHECK_EACH_STEP=1 synchronizes after every step: automatic graphs would hide them.
  if (check_each_step()) auto_graph = false;
  live.assign(plan.buffers.size(), 0);
  skip_group.assign(cache_groups.size(), 0);
  // Why here: the pool otherwise returns freed memory to the driver at every synchronization.
  retain_pool_memory();
}

SequenceExecutor::SequenceExecutor(const SequencePlan& plan, const PlanModules& modules,
                                   GemmRunner& gemms, cudaStream_t stream)
    : impl_(std::make_unique<Impl>(plan, modules, gemms, stream)) {}

SequenceExecutor::~SequenceExecutor() {
  if (impl_) impl_->free_memory(impl_->last_stream);
}

void SequenceExecutor::bind(const std::map<std::string, std::int64_t>& symbols) {
  Impl& s = *impl_;
  std::map<std::string, std::int64_t> values =
      check_binding(s.plan, symbols, *s.gemm_caps, s.num_sms);
  std::vector<std::size_t> bytes;
  for (const plan::Buffer& buffer : s.plan.buffers) {
    bytes.push_back(static_cast<std::size_t>(evaluate_expr(buffer.bytes, values)));
  }
  // The captures first: the steps' params point into them. Kept where the size is unchanged.
  s.captures.resize(s.plan.capture_slots.size());
  s.capture_counts.resize(s.plan.capture_slots.size());
  for (std::size_t i = 0; i < s.plan.capture_slots.size(); ++i) {
    std::int64_t count = 1;
    std::vector<std::int64_t> shape;
    for (const plan::SymExpr& d : s.plan.capture_slots[i].shape) {
      shape.push_back(evaluate_expr(d, values));
      count *= shape.back();
    }
    // A quantized capture keeps the copy's scale_inv (a scalar or a grid) after its values.
    const std::int64_t floats = count + s.plan.capture_slots[i].scale_count(shape);
    const auto bytes = static_cast<std::size_t>(floats) * sizeof(float);
    if (s.captures[i].size() != bytes) {
      // A pinned graph holds the old pointers (the check below would come too late for them).
      if (s.pinned) {
        throw UsageError(fmt::format(
            "bind() of sequence '{}' to other sizes while its memory is pinned for a CUDA graph: "
            "release the graph first",
            s.plan.name));
      }
      s.captures[i] = DeviceBuffer();
      s.captures[i] = DeviceBuffer(bytes, s.last_stream);
    }
    s.capture_counts[i] = count;
  }
  std::vector<BoundStep> steps;
  std::vector<std::optional<BoundStep>> inference_steps;
  for (const Step& step : s.plan.steps) {
    steps.push_back(s.bind_step(step, values));
    inference_steps.emplace_back();
    if (step.inference) inference_steps.back() = s.bind_launch(step.inference->launch, values);
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
  s.bind_fused_gemms(s.symbols);
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
  const auto address = reinterpret_cast<std::uintptr_t>(device_ptr);
  const int root = caller_tensor(s.plan, s.callers_by_name, name);
  if (device_ptr == nullptr || address % 16 != 0) {
    throw s.pointer_error(root, device_ptr,
                          device_ptr == nullptr ? "null"
                                                : "not 16-byte aligned (cudaMallocAsync "
                                                  "gives 256-byte aligned memory)");
  }
  const auto r = static_cast<std::size_t>(root);
  // Asked only for a new pointer: applications set their tensors before every forward.
  if (device_ptr != s.caller_pointers[r]) {
    const PointerFacts facts = pointer_facts(device_ptr);
    const std::optional<std::size_t> bytes =
        s.bound ? std::optional<std::size_t>(s.bytes[r]) : std::nullopt;
    if (const std::string problem = pointer_problem(facts, s.device, bytes); !problem.empty())
      throw s.pointer_error(root, device_ptr, problem);
    s.caller_facts[r] = facts;
  }
  s.caller_pointers[r] = device_ptr;
}

void SequenceExecutor::forward(cudaStream_t stream, RunMode mode) {
  Impl& s = *impl_;
  s.require_set(0, s.first_backward, "forward");
  s.mark_all_dead(true);
  s.outputs_valid = s.grads_valid = s.training_forward_done = false;
  s.outputs_from_training = false;
  if (mode == RunMode::Inference && s.graph_forward(stream)) {
    s.outputs_valid = true;
    return;
  }
  s.ensure_memory(s.pinned ? s.memory.size() : s.needed_bytes[mode_index(mode)], stream);
  s.layout = mode;
  s.run_steps(0, s.first_backward, stream, mode);
  s.outputs_valid = true;
  s.outputs_from_training = mode == RunMode::Training;
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
  s.reduce_amaxes(stream);
  for (const Step& step : s.plan.steps) {
    if (step.group < 0) s.observed_step(step.index, stream);
  }
  s.last_stream = stream;
  if (!s.plan.fp8_weights) invalidate_weight_cache();  // note "Weight cache"
  ++s.dropout_step_host;  // the device's counter: the plan's dropout_advance_step launch
}

std::uint32_t SequenceExecutor::dropout_step() const { return impl_->dropout_step_host; }

void SequenceExecutor::set_dropout_step(std::uint32_t step, cudaStream_t stream) {
  Impl& s = *impl_;
  s.dropout_step_host = step;
  if (s.dropout_step.data() == nullptr) return;  // no dropout: nothing on the device reads it
  // Why a copy from the host: a pageable source is staged before cudaMemcpyAsync returns, so the
  // member may change right after; the kernels of later steps on `stream` read the new value.
  OPFUSE_CUDA_CHECK(cudaMemcpyAsync(s.dropout_step.data(), &s.dropout_step_host,
                                    sizeof(s.dropout_step_host), cudaMemcpyHostToDevice, stream),
                    "advancing dropout's step counter");
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

std::vector<unsigned char> SequenceExecutor::stat_records(cudaStream_t stream) const {
  const Impl& s = *impl_;
  std::vector<unsigned char> out(s.stat_records.size());
  if (out.empty()) return out;
  OPFUSE_CUDA_CHECK(cudaMemcpyAsync(out.data(), s.stat_records.data(), out.size(),
                                    cudaMemcpyDeviceToHost, stream));
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

const plan::SequencePlan& SequenceExecutor::plan() const { return impl_->plan; }

std::size_t SequenceExecutor::stat_record_bytes() const { return impl_->stat_records.size(); }

void SequenceExecutor::copy_stat_records_async(void* host, cudaStream_t stream) const {
  const Impl& s = *impl_;
  if (s.stat_records.size() == 0) return;
  OPFUSE_CUDA_CHECK(cudaMemcpyAsync(host, s.stat_records.data(), s.stat_records.size(),
                                    cudaMemcpyDeviceToHost, stream));
}

std::vector<debug::CapturedTensor> SequenceExecutor::captures(cudaStream_t stream) const {
  const Impl& s = *impl_;
  std::vector<debug::CapturedTensor> out(s.captures.size());
  for (std::size_t i = 0; i < s.captures.size(); ++i) {
    for (const plan::SymExpr& d : s.plan.capture_slots[i].shape)
      out[i].shape.push_back(evaluate_expr(d, s.symbols));
    out[i].values.resize(static_cast<std::size_t>(s.capture_counts[i]));
    out[i].scale_inv.resize(
        static_cast<std::size_t>(s.plan.capture_slots[i].scale_count(out[i].shape)));
    if (!out[i].scale_inv.empty()) {
      OPFUSE_CUDA_CHECK(
          cudaMemcpyAsync(out[i].scale_inv.data(),
                          static_cast<const float*>(s.captures[i].data()) + s.capture_counts[i],
                          out[i].scale_inv.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    }
    if (out[i].values.empty()) continue;
    OPFUSE_CUDA_CHECK(cudaMemcpyAsync(out[i].values.data(), s.captures[i].data(),
                                      out[i].values.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                      stream));
  }
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

void SequenceExecutor::enable_block_summaries(cudaStream_t stream) {
  if (impl_->block_summaries) return;
  impl_->block_summaries = std::make_unique<BlockSummaries>(impl_->plan, stream);
}

bool SequenceExecutor::block_summaries_enabled() const { return impl_->block_summaries != nullptr; }

std::vector<CopySummary> SequenceExecutor::block_summaries(cudaStream_t stream) const {
  if (!impl_->block_summaries) {
    throw UsageError(fmt::format(
        "block summaries of sequence '{}' were not asked for: enable them before running "
        "(SessionOptions::block_summaries)",
        impl_->plan.name));
  }
  return impl_->block_summaries->download(stream);
}

const float* SequenceExecutor::quantizer_scale_inv(int index) const {
  const Impl& s = *impl_;
  if (index < 0 || index >= static_cast<int>(s.plan.quantizers.size()) || !s.quantizers ||
      !s.plan.quantizers[static_cast<std::size_t>(index)].spec.per_tensor()) {
    throw UsageError(
        fmt::format("sequence '{}' has no per-tensor quantizer {}", s.plan.name, index));
  }
  return s.quantizers->scale_inv(index);
}

const float* SequenceExecutor::quantizer_scale(int index) const {
  const Impl& s = *impl_;
  if (index < 0 || index >= static_cast<int>(s.plan.quantizers.size()) || !s.quantizers ||
      !s.plan.quantizers[static_cast<std::size_t>(index)].spec.has_tensor_scale()) {
    throw UsageError(
        fmt::format("sequence '{}' has no quantizer {} with a tensor scale", s.plan.name, index));
  }
  return s.quantizers->scale(index);
}

bool SequenceExecutor::outputs_from_training() const { return impl_->outputs_from_training; }

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

void SequenceExecutor::set_fused_epilogues(bool enabled) {
  if (impl_->fused_epilogues == enabled) return;
  impl_->fused_epilogues = enabled;
  if (enabled) impl_->allocate_fused_gemms();
  impl_->drop_graph();  // a recording holds one choice
}

void SequenceExecutor::set_fused_training_epilogues(bool enabled) {
  impl_->fused_training_epilogues = enabled;  // graphs record inference forwards only
}

std::map<int, std::string> SequenceExecutor::fused_gemm_refusals() const {
  return impl_->fused_refusals;
}

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
      // The step's `what` names what the training launch writes; the variant writes less.
      if (!step.inference->what.empty()) profile.what = step.inference->what;
      profile.what += " (inference variant)";
    }
    for (int id : step.reads) profile.bytes_read += s.bytes[static_cast<std::size_t>(id)];
    for (int id : variant ? step.inference->writes : step.writes)
      profile.bytes_written += s.bytes[static_cast<std::size_t>(id)];
    // Note "Fused GEMM epilogues": what a forward of this mode runs instead.
    if (const FusedGemm* f = s.fused_at(step.index, mode, true)) {
      const Step& act = s.plan.steps[static_cast<std::size_t>(f->folded)];
      const bool act_variant = mode == RunMode::Inference && act.inference;
      profile.what +=
          fmt::format(" + {} in its epilogue (CUTLASS)",
                      act_variant && !act.inference->what.empty() ? act.inference->what : act.what);
      if (mode == RunMode::Inference) {
        profile.bytes_written = s.bytes[static_cast<std::size_t>(f->output)];
      } else {
        profile.bytes_written += s.bytes[static_cast<std::size_t>(f->output)] +
                                 s.bytes[static_cast<std::size_t>(f->output_t)];
      }
    } else if (const FusedGemm* folding = s.fused_at(step.index, mode, false)) {
      profile.folded = true;
      profile.what += fmt::format(" (folded into step {}'s GEMM)", folding->step);
    }
    if (const LaunchStep* launch = launch_of(step, mode)) {
      profile.kind = StepProfile::Kind::Kernel;
      profile.kernel = launch->kernel;
    } else if (std::holds_alternative<plan::CollectiveStep>(step.body)) {
      profile.kind = StepProfile::Kind::Collective;
    } else {
      const GemmDesc& desc = s.steps[static_cast<std::size_t>(step.index)].gemm;
      profile.kind = StepProfile::Kind::Gemm;
      profile.gemm = desc;
      profile.gemm_role = std::string(plan::name(std::get<GemmStep>(step.body).role));
      profile.flops = 2.0 * double(desc.m) * double(desc.n) * double(desc.k);
    }
    profiles.push_back(std::move(profile));
  }
  if (mode == RunMode::Training && s.reduces_amaxes()) {  // note "Amax reduction"
    StepProfile profile;
    profile.index = static_cast<int>(s.plan.steps.size());
    profile.phase = plan::Phase::Backward;
    profile.kind = StepProfile::Kind::Collective;
    profile.what = fmt::format("amax all-reduce (max over {}{}, {} quantizers)",
                               s.communicator ? fmt::format("{} ranks", s.plan.parallel.tp) : "",
                               s.amax_communicator ? fmt::format("{}{} data-parallel replicas",
                                                                 s.communicator ? " and " : "",
                                                                 s.amax_communicator->size())
                                                   : "",
                               s.quantizers->count());
    profile.bytes_read = profile.bytes_written = s.quantizers->amaxes_floats() * sizeof(float);
    profile.end_of_step = true;
    profiles.push_back(std::move(profile));
  }
  return profiles;
}

}  // namespace opfuse::gpu
