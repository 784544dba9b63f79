// What SequenceExecutor::bind() evaluates and the memory it places: each step's launch or GEMM
// bound to the sizes check_binding() accepted (bind_launch, bind_step), the buffers placed in
// one allocation per run mode (place_buffers, note "Executor buffers" in plan_executor.cpp), and
// the pointers and allocation the running steps use (pointer, require_set, ensure_memory,
// free_memory).
#include "gpu/executor_impl.h"

namespace opfuse::gpu {

// The sizes were checked (check_binding): the grids fit, the GEMMs run.
BoundStep SequenceExecutor::Impl::bind_launch(
    const LaunchStep& launch, const std::map<std::string, std::int64_t>& values) const {
  BoundStep bound_step;
  const std::int64_t x = evaluate_expr(launch.grid.x, values);
  const std::int64_t y = evaluate_expr(launch.grid.y, values);
  bound_step.kernel = &modules.kernel(launch.kernel);
  bound_step.skip = x == 0 || y == 0;
  bound_step.grid = dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
  bound_step.block = dim3(static_cast<unsigned>(launch.block_threads));
  bound_step.dynamic_smem = static_cast<std::size_t>(launch.dynamic_smem_bytes);
  // Note "Current scaling over ranks" (executor_run.cpp): a tensor-parallel kernel measures
  // without its record, and the scale is derived once the ranks' amaxes are reduced.
  // Only a measuring kernel's current-scaling record: the scale update's records (delayed
  // scaling, after end_step's amax all-reduce) stay bound.
  const auto measured_over_ranks = [&](const ParamBinding& p) {
    return plan.parallel.active() && p.kind == plan::ParamKind::Records && quantizers &&
           std::ranges::all_of(p.records,
                               [&](int q) { return quantizers->settings(q).current_scaling; });
  };
  bound_step.params = pack_params(launch.params, values, [&](const ParamBinding& p) -> const void* {
    if (measured_over_ranks(p)) {
      bound_step.finish_current.insert(bound_step.finish_current.end(), p.records.begin(),
                                       p.records.end());
      return nullptr;
    }
    return state_pointer(p);
  });
  return bound_step;
}

BoundStep SequenceExecutor::Impl::bind_step(
    const Step& step, const std::map<std::string, std::int64_t>& values) const {
  if (const auto* launch = std::get_if<LaunchStep>(&step.body)) return bind_launch(*launch, values);
  BoundStep bound_step;
  if (const auto* gemm = std::get_if<GemmStep>(&step.body))
    bound_step.gemm = gemm_desc(*gemm, values, plan);
  if (const auto* collective = std::get_if<plan::CollectiveStep>(&step.body))
    bound_step.collective_count = evaluate_expr(collective->count, values);
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
  if (plan.parallel.active() && communicator == nullptr) {
    throw UsageError(fmt::format(
        "{}() of sequence '{}': it is tensor-parallel over tp = {} ranks and this executor has "
        "no communicator (set_communicator, or a Session with SessionOptions::parallel)",
        call, plan.name, plan.parallel.tp));
  }
  bool all_set = true;
  for (int index = begin; index < end && all_set; ++index) {
    for (int root : callers_read[static_cast<std::size_t>(index)]) {
      const auto r = static_cast<std::size_t>(root);
      all_set = all_set && caller_pointers[r] != nullptr;
      // A pointer set before a bind() to larger sizes may be too small now.
      const std::optional<std::size_t>& room = caller_facts[r].bytes_to_end;
      if (caller_pointers[r] != nullptr && room && *room < bytes[r]) {
        throw pointer_error(root, caller_pointers[r],
                            pointer_problem(caller_facts[r], device, bytes[r]));
      }
    }
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

UsageError SequenceExecutor::Impl::pointer_error(int root, const void* pointer,
                                                 std::string_view problem) const {
  const auto r = static_cast<std::size_t>(root);
  const char* kind = plan.buffers[r].role == BufferRole::Param        ? "parameter"
                     : plan.buffers[r].role == BufferRole::OutputGrad ? "output gradient"
                                                                      : "input";
  const std::string size =
      bound ? fmt::format("{} bytes", bytes[r]) : std::string("the tensor (sizes not bound yet)");
  return UsageError(fmt::format(
      "set_tensor(\"{}\") of sequence '{}': the {} at {} is {}; give device memory of GPU {} "
      "(cudaMalloc, cudaMallocAsync or managed memory), 16-byte aligned, with room for {} from "
      "that address",
      ir_name(plan.buffers[r].name), plan.name, kind, pointer, problem, device, size));
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

}  // namespace opfuse::gpu
