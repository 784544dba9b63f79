#include "run_driver.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <memory>
#include <numbers>
#include <random>

#include "debug_config/debug_run.h"
#include "driver/compile.h"
#include "plan/param_init.h"
#include "support/assert.h"

namespace opfuse::cpu {

namespace {

using plan::next_normal;

double norm_of(const std::vector<float>& values) {
  double sum = 0;
  for (float v : values) sum += double(v) * double(v);
  return std::sqrt(sum);
}

std::string bindings_string(const Bindings& bindings) {
  std::string out;
  for (const auto& [name, size] : bindings) out += fmt::format(" {}={}", name, size);
  return out.empty() ? " (none)" : out;
}

}  // namespace

Tensor<float> seeded_normal(const std::vector<int64_t>& shape, uint64_t seed, double stddev) {
  Tensor<float> t = Tensor<float>::zeros(shape);
  std::mt19937_64 rng(seed);
  for (float& v : t.data) v = float(stddev * next_normal(rng));
  return t;
}

void init_params_from_seed(ReferenceExecutor<float>& executor, uint64_t seed) {
  const ir::Sequence& seq = executor.sequence();
  // Parameters in creation order (op order, then operand order), each as its op declared it
  // (ir::ParamDecl::init), from the generator Session::own_parameters uses too.
  plan::ParamInitializer initializer(seed);
  for (ir::ValueId id : seq.params) {
    const ir::Value& v = seq.value(id);
    initializer.fill(v.init, executor.param(v.name).data);
  }
  executor.params_changed();
}

namespace {

// What the compiler makes of the sequence: the whole pipeline, fusions included (a fused op runs
// as its parts with rounding only where values leave it, like the GPU kernel); with a routing,
// that iteration's plan variant.
ir::Sequence lowered(const ir::Sequence& sequence, const debug::Routing* routing) {
  if (sequence.has_backward) {
    if (routing) throw ReferenceError("a debug config needs the sequence as written, not lowered");
    return sequence;
  }
  ir::Program program;
  program.sequences.push_back(sequence);
  driver::CompileOptions passes_only;
  passes_only.last_stage = driver::Stage::Passes;
  passes_only.debug_routing = routing;
  driver::CompileResult r = driver::compile_ir(std::move(program), nullptr, nullptr, passes_only);
  if (!r.ok()) throw ReferenceError(r.error);
  return std::move(r.program.sequences.at(0));
}

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
    auto next =
        std::make_unique<ReferenceExecutor<float>>(lowered(sequence_, routing), options_.bindings);
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
  // Inputs come from a second stream of the same seed so that they do not depend on the
  // number of parameters.
  std::vector<Tensor<float>> inputs;
  const auto input_shapes = current->input_shapes();
  for (size_t i = 0; i < input_shapes.size(); ++i)
    inputs.push_back(
        seeded_normal(input_shapes[i], options.seed ^ (0x9E3779B97F4A7C15ull + i), 1.0));

  std::string out = fmt::format(
      "sequence {}  recipe {}{}\nbindings{}  steps {}  seed {}  lr {}\n{}; SGD on every "
      "parameter\nquantizers: amax of this step (history slot 0) and the scale used in it\n",
      sequence.name, ir::recipe_string(sequence.recipe),
      sequence.fp8_weights ? "  fp8_weights" : "", bindings_string(options.bindings), options.steps,
      options.seed, options.lr, kRunLossDescription);
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
    const std::vector<Tensor<float>> outputs = exec.forward(inputs);
    const Tensor<float>& y = outputs[0];
    double sum_squares = 0;
    for (float v : y.data) sum_squares += double(v) * double(v);
    const double loss = 0.5 * sum_squares / double(y.numel());
    std::vector<Tensor<float>> grads_out(outputs.size());
    grads_out[0] = y;
    for (float& g : grads_out[0].data) g = float(double(g) / double(y.numel()));
    const Gradients<float> grads = exec.backward(grads_out);

    out +=
        fmt::format("\nstep {:>4}  loss {:.6e}  |y| {:.6e}\n", step, loss, std::sqrt(sum_squares));
    for (size_t i = 0; i < grads.params.size(); ++i)
      out += fmt::format("  grad   {:<32} |g| {:.6e}\n", exec.param_names()[i],
                         norm_of(grads.params[i].data));
    for (const QuantizerInfo& q : exec.quantizers())
      out += fmt::format("  quant  {:<32} {}  amax {:.6e}  scale {:.6e}\n", q.name,
                         q.format == Fp8Format::E4M3 ? "e4m3" : "e5m2", q.amax_history[0], q.scale);
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
