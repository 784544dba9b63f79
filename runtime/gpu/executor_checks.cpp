// SequenceExecutor construction's checks and facts: check_plan() and check_launch() validate the
// plan against itself before anything runs; learn_buffers() learns each buffer's root, role and
// per-mode lifetime (note "Executor buffers" in plan_executor.cpp); find_weight_cache_groups()
// finds the forward groups that only cast parameters (note "Weight cache"); state_pointer()
// resolves a params field bound to quantizer state.
#include <algorithm>

#include "gpu/executor_impl.h"

namespace opfuse::gpu {

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
    if (const auto* collective = std::get_if<plan::CollectiveStep>(&step.body)) {
      const bool buffers = collective->input >= 0 && collective->input < buffer_count &&
                           collective->output >= 0 && collective->output < buffer_count;
      if (!buffers) {
        throw UsageError(fmt::format("{} names a buffer the plan does not have: rebuild the plan",
                                     describe_step(step)));
      }
      continue;
    }
    // An FP8 operand's scale-inverse: a quantizer's scalar or a block-scale grid buffer.
    const GemmStep& gemm = std::get<GemmStep>(step.body);
    for (const plan::GemmOperand* operand : {&gemm.a, &gemm.b}) {
      if (!plan::dtype_is_fp8(operand->dtype)) continue;
      const int q = operand->scale_inv.quantizer, grid = operand->scale_inv.buffer;
      const bool scalar = q >= 0 && q < static_cast<int>(plan.quantizers.size());
      const bool block = grid >= 0 && grid < buffer_count;
      if (scalar == block) {
        throw UsageError(fmt::format(
            "{} reads an FP8 operand without exactly one scale_inv this runtime can pass "
            "(quantizer {}, scale grid buffer {}): rebuild the plan",
            describe_step(step), q, grid));
      }
      // A block-scaled operand needs its scale mode on this device (plan/gemm_caps.h): refused
      // here, before anything runs, rather than by cuBLASLt's heuristic at the first step.
      const int owner = plan.buffers.at(static_cast<std::size_t>(operand->buffer)).quantizer;
      if (!block || owner < 0 || owner >= static_cast<int>(plan.quantizers.size())) continue;
      const plan::QuantizerPlan& quantizer = plan.quantizers[static_cast<std::size_t>(owner)];
      const std::string problem = plan::gemm_support_problem(*gemm_caps, quantizer.spec);
      if (!problem.empty()) {
        throw UsageError(fmt::format(
            "{} reads quantizer '{}' ({}), but {}: run this plan on an H100 or H200 (sm_90), "
            "or compile the program with a per-tensor recipe (delayed_scaling, current_scaling)",
            describe_step(step), quantizer.name, plan::quant_spec_string(quantizer.spec), problem));
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
        (param.quantizer_value == plan::QuantizerValue::RunningAmax ||
         param.quantizer_value == plan::QuantizerValue::Measurements) &&
        plan.quantizers[static_cast<std::size_t>(param.quantizer)].spec.scaling !=
            plan::ScalingKind::Current &&
        !plan.quantizers[static_cast<std::size_t>(param.quantizer)].spec.nvfp4()) {
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
  if (param.kind == plan::ParamKind::DropoutStep) {
    if (dropout_step.data() == nullptr)
      throw UsageError(fmt::format("params field '{}' binds no dropout step counter", param.field));
    return dropout_step.data();
  }
  if (param.kind == plan::ParamKind::Records) {
    return quantizers->records() + param.records.at(0);
  }
  if (param.kind == plan::ParamKind::StatRecord) {
    const auto slot = param.int_value.value();
    if (!slot || *slot < 0 || static_cast<std::size_t>(*slot) >= plan.stat_slots.size()) {
      throw UsageError(fmt::format("params field '{}' binds statistics record {} of {}",
                                   param.field, param.int_value.text(), plan.stat_slots.size()));
    }
    return static_cast<unsigned char*>(stat_records.data()) + *slot * kStatRecordBytes;
  }
  if (param.kind == plan::ParamKind::Capture) {
    const auto slot = param.int_value.value();
    if (!slot || *slot < 0 || static_cast<std::size_t>(*slot) >= captures.size()) {
      throw UsageError(fmt::format("params field '{}' binds capture {} of {}", param.field,
                                   param.int_value.text(), plan.capture_slots.size()));
    }
    return captures[static_cast<std::size_t>(*slot)].data();
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
    case plan::QuantizerValue::Measurements:
      return quantizers->measurements(param.quantizer);
    case plan::QuantizerValue::GemmScaleInv:
      // As the GEMMs read it (executor_run.cpp): a kept FP8 weight's copy has its own scale_inv.
      if (cast_scale_inv.data() != nullptr) {
        for (const WeightCacheGroup& group : cache_groups) {
          if (std::find(group.quantizers.begin(), group.quantizers.end(), param.quantizer) !=
              group.quantizers.end())
            return cast_scale_inv_slot(param.quantizer);
        }
      }
      return quantizers->scale_inv(param.quantizer);
  }
  throw UsageError(fmt::format("params field '{}' binds an unknown quantizer value", param.field));
}

}  // namespace opfuse::gpu
