#include "run_driver.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>

#include "debug_config/debug_run.h"
#include "plan/param_init.h"
#include "reference_kernels.h"
#include "run_ranks.h"
#include "run_steps.h"

namespace opfuse::cpu {

Tensor<float> seeded_normal(const std::vector<int64_t>& shape, uint64_t seed, double stddev) {
  Tensor<float> t = Tensor<float>::zeros(shape);
  std::mt19937_64 rng(seed);
  for (float& v : t.data) v = float(stddev * plan::next_normal(rng));
  return t;
}

void init_params_from_seed(ReferenceExecutor<float>& executor, uint64_t seed, int rank) {
  const ir::Sequence& seq = executor.sequence();
  // Parameters in creation order (op order, then operand order), each as its op declared it
  // (ir::ParamDecl::init), from the generator Session::own_parameters uses too; a tensor-parallel
  // rank keeps its shard of each (ir::Value::shard) of what the unsharded program draws.
  plan::ParamInitializer initializer(seed);
  for (ir::ValueId id : seq.params) {
    const ir::Value& v = seq.value(id);
    Tensor<float>& param = executor.param(v.name);
    initializer.fill_shard(v.init, param.data, param.shape, v.shard, seq.parallel.tp, rank);
  }
  executor.params_changed();
}

namespace {

// The plan variant a debug run is in, switched when the routing's decisions change: the new
// executor takes over the parameters and every quantizer state it shares by name (states of
// quantizers a variant lacks wait in `bank` for the next variant that has them).
class VariantRunner {
 public:
  VariantRunner(const ir::Sequence& sequence, const RunOptions& options)
      : sequence_(sequence), options_(options) {}

  ReferenceExecutor<float>& at(const debug::Routing* routing) {
    const std::string key = routing ? routing->variant_key() : std::string();
    if (exec_ && key == key_) return *exec_;
    auto next = std::make_unique<ReferenceExecutor<float>>(lowered_for_run(sequence_, routing),
                                                           options_.bindings);
    if (!exec_) {
      init_params_from_seed(*next, options_.seed);
    } else {
      for (const std::string& name : next->param_names())
        next->param(name).data = exec_->param(name).data;
      next->params_changed();
      for (QuantizerInfo& q : exec_->quantizers()) bank_[q.name] = std::move(q);
      std::vector<QuantizerInfo> states;
      for (const auto& [name, q] : bank_) states.push_back(q);
      next->set_quantizer_states(states);
    }
    exec_ = std::move(next);
    key_ = key;
    return *exec_;
  }

 private:
  const ir::Sequence& sequence_;
  const RunOptions& options_;
  std::unique_ptr<ReferenceExecutor<float>> exec_;
  std::string key_;
  std::map<std::string, QuantizerInfo> bank_;
};

}  // namespace

std::string run_reference_training(const ir::Sequence& sequence, const RunOptions& options) {
  if (options.steps < 1)
    throw ReferenceError(fmt::format("--steps must be at least 1, got {}", options.steps));
  if (sequence.parallel.active()) return run_reference_ranks(sequence, options);
  std::optional<debug::DebugRun> debug;
  if (options.debug) {
    debug::DebugRunSetup setup;
    setup.bindings = options.debug->bindings;
    setup.log = options.debug->log;
    setup.sources = options.debug->sources;
    setup.start_iteration = options.debug->start_iteration;
    setup.log_dir = options.debug->log_dir;
    setup.rank = options.debug->rank;
    try {
      debug.emplace(std::move(setup));  // an unwritable dump directory: before the first step
    } catch (const debug::DebugLogError& e) {
      throw ReferenceError(e.what());
    }
  }
  // Two features modifying one operand is a user error of the config.
  auto routing = [&]() -> const debug::Routing& {
    try {
      return debug->routing();
    } catch (const std::runtime_error& e) {
      throw ReferenceError(e.what());
    }
  };
  VariantRunner variants(sequence, options);
  ReferenceExecutor<float>* current = &variants.at(debug ? &routing() : nullptr);
  uint64_t generation = debug ? debug->generation() : 0;
  std::vector<Tensor<float>> inputs;
  const auto input_shapes = current->input_shapes();
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    inputs.push_back(seeded_input(input_shapes[i], options.seed, i));
    round_as_stored(inputs.back().data,
                    current->sequence().value(current->sequence().inputs[i]).type.dtype);
  }

  std::string out = format_run_header(sequence, options);
  for (int step = 0; step < options.steps; ++step) {
    // The variant is looked up (by key) only where the routing was asked again.
    if (debug) {
      const debug::Routing& r = routing();
      if (debug->generation() != generation) {
        current = &variants.at(&r);
        generation = debug->generation();
      }
    }
    ReferenceExecutor<float>& exec = *current;
    // A quantized input (a consumer sequence): the seeded values quantized as a producer would.
    if (exec.sequence().quantized_input) exec.quantize_input(inputs[0]);
    const std::vector<Tensor<float>> outputs = exec.forward(inputs);
    const Tensor<float>& y = outputs[0];
    StepReport report;
    report.sum_squares = squared_norm(y.data);
    report.numel = y.numel();
    std::vector<Tensor<float>> grads_out(outputs.size());
    grads_out[0] = y;
    for (float& g : grads_out[0].data) g = float(double(g) / double(y.numel()));
    const Gradients<float> grads = exec.backward(grads_out);

    for (size_t i = 0; i < grads.params.size(); ++i)
      report.grad_norms.emplace_back(exec.param_names()[i],
                                     std::sqrt(squared_norm(grads.params[i].data)));
    report.quantizers = exec.quantizers();
    // Note "Block summaries": not in debug runs, whose variants the GPU's sessions do not
    // summarize (Session::block_summaries).
    if (!debug) report.blocks = exec.block_summaries();
    out += format_step(step, report);
    if (debug) {
      debug->add_run(exec.sequence().inspections, exec.stat_records(), debug::RunPhase::Both);
      debug->add_captures(exec.sequence().captures, exec.captures(), debug::RunPhase::Both);
      try {
        debug->end_step();
      } catch (const debug::DebugLogError& e) {
        throw ReferenceError(e.what());
      }
    }
    exec.step();
    exec.sgd_step(grads, options.lr);
  }
  return out;
}

}  // namespace opfuse::cpu
