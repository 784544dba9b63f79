#include "run_driver.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <random>

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

std::string run_reference_training(const ir::Sequence& sequence, const RunOptions& options) {
  if (options.steps < 1)
    throw ReferenceError(fmt::format("--steps must be at least 1, got {}", options.steps));
  // Run what the compiler makes of it: the whole pipeline, fusions included (a fused op runs as
  // its parts with rounding only where values leave it, like the GPU kernel).
  ir::Program program;
  program.sequences.push_back(sequence);
  if (!sequence.has_backward) {
    driver::CompileOptions passes_only;
    passes_only.last_stage = driver::Stage::Passes;
    program = driver::compile_ir(std::move(program), nullptr, nullptr, passes_only).program;
  }
  ReferenceExecutor<float> exec(program.sequences[0], options.bindings);
  init_params_from_seed(exec, options.seed);
  // Inputs come from a second stream of the same seed so that they do not depend on the
  // number of parameters.
  std::vector<Tensor<float>> inputs;
  const auto input_shapes = exec.input_shapes();
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
    exec.step();
    exec.sgd_step(grads, options.lr);
  }
  return out;
}

}  // namespace opfuse::cpu
