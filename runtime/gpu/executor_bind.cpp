// What SequenceExecutor::bind() evaluates and the memory it places: the symbols checked,
// each step's launch or GEMM bound to the sizes (bind_launch, bind_step), the buffers placed in
// one allocation per run mode (place_buffers, note "Executor buffers" in plan_executor.cpp), and
// the pointers and allocation the running steps use (pointer, require_set, ensure_memory,
// free_memory).
#include "gpu/executor_impl.h"

namespace opfuse::gpu {

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
  bound_step.gemm = gemm_desc(*gemm, values, plan);
  const bool fp8 = is_fp8(gemm->a.dtype) || is_fp8(gemm->b.dtype);
  const std::int64_t multiple = plan::gemm_dim_multiple(*gemm_caps, fp8);
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

}  // namespace opfuse::gpu
