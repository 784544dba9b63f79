#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <set>
#include <span>

#include "api/debug_session.h"
#include "api/program_impl.h"
#include "api/session_access.h"
#include "api/session_impl.h"
#include "api/state_file.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "gpu/binding_check.h"
#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/device_memory.h"
#include "gpu/plan_executor.h"
#include "gpu/pointer_check.h"
#include "opfuse/program.h"
#include "plan/param_init.h"

namespace opfuse {

namespace {

TensorDType public_dtype(plan::DType dtype) {
  switch (dtype) {
    case plan::DType::BF16:
      return TensorDType::BF16;
    case plan::DType::FP16:
      return TensorDType::FP16;
    case plan::DType::FP32:
      return TensorDType::FP32;
    case plan::DType::E4M3:
      return TensorDType::E4M3;
    case plan::DType::E5M2:
      return TensorDType::E5M2;
    case plan::DType::E2M1:  // an NVFP4 boundary's packed codes
      return TensorDType::E2M1;
    case plan::DType::E8M0:  // an MXFP8 boundary's block scales
      return TensorDType::E8M0;
  }
  return TensorDType::FP32;
}

TensorKind public_kind(const gpu::TensorInfo& info) {
  switch (info.role) {
    case plan::BufferRole::Input:
      return TensorKind::Input;
    case plan::BufferRole::Param:
      return TensorKind::Param;
    case plan::BufferRole::OutputGrad:
      return TensorKind::OutputGrad;
    default:
      break;
  }
  if (info.result_kind == "input_grad") return TensorKind::InputGrad;
  if (info.result_kind == "param_grad") return TensorKind::ParamGrad;
  return TensorKind::Output;
}

}  // namespace

Session::Session(const Program& program, std::string_view sequence, cudaStream_t stream,
                 const SessionOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.program = program.impl_;
  const Program::Impl& p = *s.program;
  // A misnamed sequence is the same mistake with or without a GPU: said first.
  s.plan = &find_sequence_plan(p, sequence);
  // Every entry point starts so: once the CUDA context has faulted, each call repeats that
  // message instead of failing in unrelated ways (note "Faulted context", gpu/cuda_check.h).
  gpu::throw_if_faulted();
  std::string why;
  if (!gpu::gpu_available(&why)) {
    throw UsageError(fmt::format(
        "opfuse::Session needs a CUDA GPU: {}; run the CPU reference instead (`fusec run --device "
        "cpu`)",
        why));
  }
  s.stream = stream;
  const std::string device_arch = gpu::current_device().arch;
  if (p.plan.arch != device_arch) {
    throw UsageError(fmt::format(
        "{} was compiled for {} but this GPU ({}) needs {}: compile with CompileOptions::arch "
        "empty (the GPU's) or \"{}\"",
        p.source_name, p.plan.arch, gpu::current_device().name, device_arch, device_arch));
  }
  const ParallelOptions& par = options.parallel;
  if (par.size != s.plan->parallel.tp || par.rank < 0 || par.rank >= par.size) {
    throw UsageError(fmt::format(
        "sequence '{}' is built for {} rank{}, but this process is rank {} of {}: {}", s.plan->name,
        s.plan->parallel.tp, s.plan->parallel.tp == 1 ? "" : "s", par.rank, par.size,
        s.plan->parallel.active()
            ? fmt::format("start {} processes, one GPU each (fusec run --nproc {}), and set "
                          "SessionOptions::parallel (ParallelOptions::from_environment())",
                          s.plan->parallel.tp, s.plan->parallel.tp)
            : "the sequence has no `with parallel(tp = N)`; run it in one process"));
  }
  const ParallelOptions& group = options.amax_group;
  if (group.size < 1 || group.rank < 0 || group.rank >= group.size) {
    throw UsageError(fmt::format(
        "SessionOptions::amax_group: rank {} of {} is not a place in a group of replicas",
        group.rank, group.size));
  }
  if (p.debug && (group.size > 1 || !group.nccl_id.empty())) {
    throw UsageError(fmt::format(
        "sequence '{}': SessionOptions::amax_group and a precision-debug config: the debug "
        "variants do not reduce their amaxes over a data-parallel group yet",
        s.plan->name));
  }
  if (p.debug && s.plan->parallel.active()) {
    throw UsageError(fmt::format(
        "sequence '{}' is tensor-parallel and the program has a precision-debug config: the "
        "debug variants do not run over several ranks yet; run the config on the one-rank program",
        s.plan->name));
  }
  s.modules = std::make_unique<gpu::PlanModules>(p.plan, p.kernels);
  s.gemms = std::make_unique<gpu::GemmRunner>(stream, gpu::GemmOptions{options.gemm_autotune});
  s.executor = std::make_unique<gpu::SequenceExecutor>(*s.plan, *s.modules, *s.gemms, stream);
  s.executor->set_auto_graph(options.auto_graph);
  s.executor->set_fused_epilogues(options.fused_epilogues);
  s.executor->set_fused_training_epilogues(options.fused_training_epilogues);
  // A one-rank sequence given an NCCL id runs its collectives through a one-rank communicator
  // (ParallelOptions::nccl_id): the path of N ranks, on one GPU.
  // The group's communicator: from the application's NCCL id, or rank 0's id exchanged through
  // a file in the shared bootstrap directory.
  auto connect = [](const ParallelOptions& group, const char* field) {
    comm::UniqueId id;
    if (!group.nccl_id.empty()) {
      id = comm::unique_id_from_hex(group.nccl_id);
    } else {
      if (group.bootstrap_dir.empty() || group.job.empty())
        throw UsageError(
            fmt::format("SessionOptions::{} needs nccl_id, or bootstrap_dir and job", field));
      id = comm::exchange_unique_id(group.bootstrap_dir, group.job, group.rank, group.size,
                                    std::chrono::seconds(group.timeout_s));
    }
    auto communicator = std::make_unique<comm::Communicator>(id, group.rank, group.size);
    if (group.nccl_id.empty() && group.rank == 0)
      comm::remove_unique_id_file(group.bootstrap_dir, group.job);
    return communicator;
  };
  if (s.plan->parallel.active() || !par.nccl_id.empty()) {
    s.communicator = connect(par, "parallel");
    s.rank = par.rank;
    s.executor->set_communicator(s.communicator.get());
  }
  // The data-parallel group (note "Amax reduction" in gpu/executor_comm.cpp).
  const ParallelOptions& dp = options.amax_group;
  if (dp.size > 1 || !dp.nccl_id.empty()) {
    s.amax_communicator = connect(dp, "amax_group");
    s.executor->set_amax_communicator(s.amax_communicator.get());
  }
  if (options.block_summaries) {
    if (p.debug) {
      throw UsageError(fmt::format(
          "sequence '{}': SessionOptions::block_summaries and a precision-debug config: the "
          "debug variants are not summarized; drop one of them",
          s.plan->name));
    }
    s.executor->enable_block_summaries(stream);  // UsageError for a tensor-parallel sequence
  }
  if (p.debug) {
    s.debug = std::make_unique<api::DebugSession>(p.debug, s.plan->name, options.debug, *s.gemms,
                                                  options.auto_graph, *s.executor);
  }
}

ParallelOptions ParallelOptions::from_environment() {
  ParallelOptions o;
  const std::optional<comm::LaunchEnv> env = comm::launch_env_from_environment();
  if (!env) return o;
  o.rank = env->rank;
  o.size = env->size;
  o.bootstrap_dir = env->dir.string();
  o.job = env->job;
  return o;
}

std::string new_parallel_id() { return comm::unique_id_hex(comm::new_unique_id()); }

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

const std::string& Session::sequence() const { return impl_->plan->name; }

void Session::bind(const std::map<std::string, std::int64_t>& sizes) {
  gpu::throw_if_faulted();  // note "Faulted context" (gpu/cuda_check.h)
  Impl& s = *impl_;
  s.require_no_graph("bind()");
  s.executor->bind(sizes);
  if (s.debug) s.debug->bind(sizes);
  s.bindings = sizes;
  // Parameters keep their memory: their shapes are constants of the program (no symbolic size
  // reaches a weight), so a new binding never changes their size.
  s.bound = true;
}

std::vector<TensorInfo> Session::tensors() const {
  impl_->require_bound("tensors()");
  std::vector<TensorInfo> result;
  for (const gpu::TensorInfo& info : impl_->exec().tensors()) {
    result.push_back(
        {info.name, public_kind(info), public_dtype(info.dtype), info.shape, info.bytes});
  }
  return result;
}

void Session::own_parameters(std::uint64_t seed, cudaStream_t stream) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_bound("own_parameters()");
  s.require_no_graph("own_parameters()");
  // The values `fusec run --device cpu` starts from: each parameter as its op declared it
  // (plan::Buffer::init), in creation order, from the shared seeded generator (plan/param_init.h);
  // a tensor-parallel rank's shard (plan::Buffer::shard) of the unsharded program's value.
  plan::ParamInitializer initializer(seed);
  std::map<std::string, std::vector<float>, std::less<>> values;
  for (const plan::Buffer& buffer : s.plan->buffers) {
    if (buffer.role != plan::BufferRole::Param || buffer.alias_of >= 0) continue;
    const std::string name = gpu::ir_name(buffer.name);
    std::vector<std::int64_t> shape;
    std::size_t elements = 1;
    for (const plan::SymExpr& d : buffer.shape) {
      const std::optional<std::int64_t> size = d.value();
      if (!size) {
        throw UsageError(
            fmt::format("parameter '{}' has a size that depends on '{}'", name, d.text()));
      }
      shape.push_back(*size);
      elements *= static_cast<std::size_t>(*size);
    }
    std::vector<float>& v = values[name];
    v.resize(elements);
    initializer.fill_shard(buffer.init, v, shape, buffer.shard, s.plan->parallel.tp, s.rank);
  }
  for (const gpu::TensorInfo& info : s.params()) {
    const auto found = values.find(info.name);
    if (found == values.end()) {
      throw UsageError(fmt::format("the plan has no initializer for parameter '{}'", info.name));
    }
    const std::vector<unsigned char> bytes = encode_values(found->second, public_dtype(info.dtype));
    gpu::DeviceBuffer buffer(bytes.size(), stream);
    OPFUSE_CUDA_CHECK(
        cudaMemcpyAsync(buffer.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream),
        fmt::format("uploading parameter '{}'", info.name));
    OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "own_parameters");
    s.set_everywhere(info.name, buffer.data());
    s.given.erase(info.name);
    s.owned.insert_or_assign(info.name, std::move(buffer));
  }
}

void Session::allocate_parameters(cudaStream_t stream) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_bound("allocate_parameters()");
  s.require_no_graph("allocate_parameters()");
  for (const gpu::TensorInfo& info : s.params()) {
    gpu::DeviceBuffer buffer(info.bytes, stream);
    OPFUSE_CUDA_CHECK(cudaMemsetAsync(buffer.data(), 0, info.bytes, stream),
                      fmt::format("zeroing parameter '{}'", info.name));
    s.set_everywhere(info.name, buffer.data());
    s.given.erase(info.name);
    s.owned.insert_or_assign(info.name, std::move(buffer));
  }
}

void* Session::parameter(std::string_view name) const {
  const auto it = impl_->owned.find(name);
  if (it == impl_->owned.end()) {
    throw UsageError(fmt::format(
        "the session owns no parameter '{}': call own_parameters() first, or use your own "
        "pointer given with set_tensor()",
        name));
  }
  return it->second.data();
}

void Session::set_tensor(std::string_view name, const void* device_ptr) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_no_graph("set_tensor()");
  for (const plan::QuantizerPlan& q : s.plan->quantizers) {
    // The input itself, or one of its pieces ("h.columnwise", "h.scale_inv", ...).
    const bool piece = name == q.name + ".columnwise" || name == q.name + ".scale_inv" ||
                       name == q.name + ".columnwise.scale_inv" ||
                       name == q.name + ".tensor_scale" ||
                       name == q.name + ".columnwise.tensor_scale";
    if (q.boundary && (q.name == name || piece)) {
      throw UsageError(
          fmt::format("input '{}' of sequence '{}' is quantized: give its copies and "
                      "scales as a QuantizedTensorView (quantized_tensors() says what "
                      "it expects)",
                      name, s.plan->name));
    }
  }
  s.set_everywhere(std::string(name), device_ptr);
  if (const auto it = s.owned.find(name); it != s.owned.end()) s.owned.erase(it);
  for (const gpu::TensorInfo& info : s.params()) {
    if (info.name == name) s.given.insert_or_assign(std::string(name), device_ptr);
  }
}

void Session::parameters_changed() {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.exec().invalidate_weight_cache();
  // A recording of an fp8_weights sequence holds no weight casts (capture()): cast them now.
  if (s.graph_exec != nullptr && s.plan->fp8_weights) s.executor->cast_weights(s.graph_stream);
}

void Session::forward(cudaStream_t stream, RunMode mode) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_bound("forward()");
  s.require_no_graph("forward()");
  gpu::SequenceExecutor& exec = s.debug ? s.debug->before_forward(stream) : *s.executor;
  exec.forward(stream,
               mode == RunMode::Training ? gpu::RunMode::Training : gpu::RunMode::Inference);
  if (s.debug) s.debug->after_run(debug::RunPhase::Forward, stream);
}

void Session::backward(cudaStream_t stream) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_bound("backward()");
  s.require_no_graph("backward()");
  if (!s.without_columnwise.empty()) {
    throw UsageError(fmt::format(
        "backward() of sequence '{}' reads the column-wise copy of quantized input '{}', which "
        "its view did not carry: give a QuantizedTensorView with columnwise (a training forward "
        "of the producer makes it)",
        s.plan->name, *s.without_columnwise.begin()));
  }
  s.exec().backward(stream);
  if (s.debug) s.debug->after_run(debug::RunPhase::Backward, stream);
}

void Session::step(cudaStream_t stream) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_no_graph("step()");
  s.exec().end_step(stream);
  ++s.steps;
  if (s.debug) s.debug->end_step();
}

void Session::flush_debug_stats() {
  gpu::throw_if_faulted();
  if (impl_->debug) impl_->debug->flush();
}

std::int64_t Session::debug_iteration() const {
  if (!impl_->debug) {
    throw UsageError(
        fmt::format("debug_iteration(): sequence '{}' runs without a debug config (CompileOptions::"
                    "debug_config)",
                    impl_->plan->name));
  }
  return impl_->debug->iteration();
}

const void* Session::output(std::string_view name) const { return impl_->exec().output(name); }
const void* Session::input_grad(std::string_view name) const {
  return impl_->exec().input_grad(name);
}
const void* Session::param_grad(std::string_view name) const {
  return impl_->exec().param_grad(name);
}

void Session::save(const std::string& path, cudaStream_t stream, StateParts parts) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_bound("save()");
  api::StateFile state = s.state_layout();
  state.step = s.steps;
  if (parts == StateParts::Quantizers) {
    state.tensors.clear();
    state.quantizers_only = true;
  }
  for (api::StateTensor& tensor : state.tensors) {
    const void* pointer = s.param_pointer(tensor.name);
    if (pointer == nullptr) {
      throw UsageError(fmt::format(
          "save(): parameter '{}' has no memory yet: call own_parameters() or set_tensor()",
          tensor.name));
    }
    auto bytes = static_cast<std::size_t>(plan::dtype_bytes(tensor.dtype));
    for (const std::int64_t dim : tensor.shape) bytes *= static_cast<std::size_t>(dim);
    tensor.bytes.resize(bytes);
    OPFUSE_CUDA_CHECK(
        cudaMemcpyAsync(tensor.bytes.data(), pointer, bytes, cudaMemcpyDeviceToHost, stream),
        fmt::format("downloading parameter '{}'", tensor.name));
  }
  const std::map<std::string, cpu::DelayedScalingState> quantizers = s.quantizer_states(stream);
  for (api::StateQuantizer& q : state.quantizers) {
    if (const auto it = quantizers.find(q.name); it != quantizers.end()) q.state = it->second;
  }
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "save()");
  api::write_state_file(path, state);
}

void Session::load(const std::string& path, cudaStream_t stream, StateParts parts) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_no_graph("load()");
  s.require_bound("load()");
  const api::StateFile file = api::read_state_file(path);
  api::StateFile expected = s.state_layout();
  if (parts == StateParts::Quantizers) {
    expected.tensors.clear();
    expected.quantizers_only = true;
  }
  api::require_state_fits(file, expected, path);
  for (const api::StateTensor& tensor : expected.tensors) {
    if (s.param_pointer(tensor.name) == nullptr) {
      throw UsageError(fmt::format(
          "load({}): parameter '{}' has no memory to load into: call own_parameters() or "
          "set_tensor() first; nothing was loaded",
          path, tensor.name));
    }
  }
  // Checked whole above: from here on every copy goes to memory known to fit.
  std::vector<cpu::DelayedScalingState> quantizers(expected.quantizers.size());
  for (std::size_t i = 0; i < expected.quantizers.size(); ++i) {
    for (const api::StateQuantizer& q : file.quantizers) {
      if (q.name == expected.quantizers[i].name) quantizers[i] = q.state;
    }
  }
  for (const api::StateTensor& tensor :
       expected.quantizers_only ? std::span<const api::StateTensor>() : std::span(file.tensors)) {
    OPFUSE_CUDA_CHECK(
        cudaMemcpyAsync(const_cast<void*>(s.param_pointer(tensor.name)), tensor.bytes.data(),
                        tensor.bytes.size(), cudaMemcpyHostToDevice, stream),
        fmt::format("uploading parameter '{}'", tensor.name));
  }
  if (s.debug) {
    std::map<std::string, cpu::DelayedScalingState> by_name;
    for (std::size_t i = 0; i < quantizers.size(); ++i)
      by_name[expected.quantizers[i].name] = quantizers[i];
    s.debug->set_quantizer_states(by_name, stream);
  } else {
    s.executor->upload_quantizers(quantizers, stream);
  }
  s.exec().invalidate_weight_cache();
  // Dropout continues the masks of the step the file was saved at (its Philox counter word).
  s.exec().set_dropout_step(static_cast<std::uint32_t>(file.step), stream);
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "load()");
  s.steps = file.step;
}

void Session::capture(cudaStream_t stream, GraphScope scope) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  s.require_bound("capture()");
  s.require_no_graph("capture()");
  if (s.debug) {
    throw UsageError(fmt::format(
        "capture() on sequence '{}': a session with a debug config runs eagerly (its plan "
        "changes by iteration); compile without CompileOptions::debug_config to capture",
        s.plan->name));
  }
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    throw UsageError(
        "capture() needs a stream created with cudaStreamCreate*: the default stream cannot be "
        "captured");
  }
  // Every buffer allocated now, outside the capture: the recording has no memory nodes and its
  // pointers stay valid across replays. The weights are cast inside the recording (so replays
  // follow parameter changes), except under `with fp8_weights`: they are cast once, now and at
  // each parameters_changed(), outside it.
  s.executor->pin_memory(stream);
  if (s.plan->fp8_weights) {
    s.executor->cast_weights(stream);
  } else {
    s.executor->invalidate_weight_cache();
  }
  OPFUSE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture()");
  try {
    if (scope == GraphScope::InferenceForward) {
      s.executor->forward(stream, gpu::RunMode::Inference);
    } else {
      s.executor->forward(stream, gpu::RunMode::Training);
      s.executor->backward(stream);
      s.executor->end_step(stream);
    }
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(stream, &broken);
    if (broken != nullptr) (void)cudaGraphDestroy(broken);
    (void)cudaGetLastError();
    s.executor->unpin_memory(stream);
    throw;
  }
  OPFUSE_CUDA_CHECK(cudaStreamEndCapture(stream, &s.graph), "capture()");
  const cudaError_t instantiated = cudaGraphInstantiateWithFlags(&s.graph_exec, s.graph, 0);
  if (instantiated != cudaSuccess) {
    s.executor->unpin_memory(stream);
    s.destroy_graph();
    OPFUSE_CUDA_CHECK(instantiated, "capture(): instantiating the graph");
  }
  s.graph_scope = scope;
  s.graph_stream = stream;
}

void Session::replay(cudaStream_t stream) {
  gpu::throw_if_faulted();
  Impl& s = *impl_;
  if (s.graph_exec == nullptr)
    throw UsageError(fmt::format("replay() on sequence '{}' without capture()", s.plan->name));
  OPFUSE_CUDA_CHECK(cudaGraphLaunch(s.graph_exec, stream), "replay()");
  s.graph_stream = stream;
  if (s.graph_scope == GraphScope::TrainingStep) ++s.steps;
}

void Session::release_graph() {
  Impl& s = *impl_;
  if (s.graph_exec == nullptr) return;
  s.destroy_graph();
  s.executor->unpin_memory(s.graph_stream);
}

bool Session::has_graph() const { return impl_->graph_exec != nullptr; }

std::vector<QuantizerStatus> Session::quantizers(cudaStream_t stream) const {
  gpu::throw_if_faulted();
  const Impl& s = *impl_;
  // The quantizers of the variant that runs now (plan order).
  const std::vector<cpu::DelayedScalingState> states = s.exec().download_quantizers(stream);
  const plan::SequencePlan& plan = s.exec().plan();
  std::vector<QuantizerStatus> result;
  for (std::size_t i = 0; i < states.size(); ++i) {
    const plan::QuantizerPlan& q = plan.quantizers.at(i);
    // Block scales live in each copy's grid (MXFP8: in its decoded copy), not here; NVFP4's
    // tensor scale is here.
    if (!q.spec.has_tensor_scale()) continue;
    result.push_back({q.name, public_dtype(q.format()), states[i].amax_history, states[i].scale,
                      states[i].scale_inv});
  }
  return result;
}

std::vector<BlockSummaryStatus> Session::block_summaries(cudaStream_t stream) const {
  gpu::throw_if_faulted();
  const Impl& s = *impl_;
  if (!s.executor->block_summaries_enabled()) {
    throw UsageError(fmt::format(
        "block_summaries() on sequence '{}' without SessionOptions::block_summaries = true",
        s.plan->name));
  }
  std::vector<BlockSummaryStatus> result;
  for (const gpu::CopySummary& c : s.executor->block_summaries(stream)) {
    const plan::QuantizerPlan& q = s.plan->quantizers.at(static_cast<std::size_t>(c.quantizer));
    result.push_back({q.name, c.columnwise, public_dtype(q.format()), c.block_rows, c.block_cols,
                      c.blocks, c.zero_blocks, c.scale_inv_min, c.scale_inv_max, c.has_tensor_scale,
                      c.tensor_scale});
  }
  return result;
}

MemoryStats Session::memory() const {
  const gpu::ExecutorMemory memory = impl_->exec().memory();
  MemoryStats stats;
  stats.live_bytes = memory.live_bytes;
  stats.peak_bytes = memory.peak_bytes;
  stats.reserved_bytes = memory.reserved_bytes;
  for (const auto& [name, buffer] : impl_->owned) stats.owned_bytes += buffer.size();
  return stats;
}

void Session::reset_peak_memory() {
  impl_->executor->reset_peak();
  if (impl_->debug) impl_->debug->reset_peak();
}

gpu::SequenceExecutor& SessionAccess::executor(Session& session) { return session.impl_->exec(); }

comm::Communicator* SessionAccess::communicator(Session& session) {
  return session.impl_->communicator.get();
}

}  // namespace opfuse
