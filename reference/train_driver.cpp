#include "train_driver.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <numbers>

#include "run_driver.h"
#include "run_steps.h"

namespace opfuse::cpu {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform in (0, 1] from the top 53 bits (never 0, so the logarithm is finite).
double unit_interval(uint64_t bits) { return double((bits >> 11) + 1) * 0x1.0p-53; }

std::vector<HostParam> params_of(ReferenceExecutor<float>& executor) {
  std::vector<HostParam> out;
  for (const std::string& name : executor.param_names()) {
    const Tensor<float>& p = executor.param(name);
    out.push_back({name, p.shape, p.data});
  }
  return out;
}

std::vector<Tensor<float>> batch(const std::vector<std::vector<int64_t>>& shapes, uint64_t seed,
                                 uint64_t counter) {
  std::vector<Tensor<float>> inputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    inputs.push_back(Tensor<float>::zeros(shapes[i]));
    fill_normal(inputs.back().data, seed, input_stream(i), counter, 1.0);
  }
  return inputs;
}

void add_noise(std::vector<float>& target, uint64_t seed, uint64_t counter, double stddev) {
  std::vector<float> noise(target.size());
  fill_normal(noise, seed, kNoiseStream, counter, stddev);
  for (size_t i = 0; i < target.size(); ++i) target[i] += noise[i];
}

}  // namespace

void fill_normal(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t batch,
                 double stddev, size_t first) {
  const uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ batch);
  for (size_t j = 0; j < out.size(); j += 2) {
    const uint64_t pair = (first + j) / 2;
    const double u1 = unit_interval(splitmix64(key ^ (2 * pair)));
    const double u2 = unit_interval(splitmix64(key ^ (2 * pair + 1)));
    const double radius = stddev * std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    out[j] = float(radius * std::cos(angle));
    if (j + 1 < out.size()) out[j + 1] = float(radius * std::sin(angle));
  }
}

void teacher_weights(std::vector<HostParam>& params) {
  for (HostParam& p : params) {
    if (p.shape.size() != 2 || p.values.empty()) continue;
    const double rms = std::sqrt(2.0 * half_mean_square(p.values));
    if (rms == 0) continue;
    const double gain = 1.0 / (std::sqrt(double(p.shape[1])) * rms);
    for (float& v : p.values) v = float(double(v) * gain);
  }
}

size_t last_matrix(const std::vector<HostParam>& params) {
  for (size_t i = params.size(); i-- > 0;)
    if (params[i].shape.size() == 2) return i;
  return params.size();
}

SgdOptimizer::SgdOptimizer(std::vector<HostParam> masters, double lr, double momentum)
    : masters_(std::move(masters)), velocity_(masters_.size()), lr_(lr), momentum_(momentum) {
  if (momentum_ != 0)
    for (size_t i = 0; i < masters_.size(); ++i)
      velocity_[i].assign(masters_[i].values.size(), 0.0F);
}

const std::vector<float>& SgdOptimizer::update(size_t index, std::span<const float> grad) {
  std::vector<float>& w = masters_.at(index).values;
  if (momentum_ == 0) {
    for (size_t j = 0; j < w.size(); ++j) w[j] = float(double(w[j]) - lr_ * double(grad[j]));
  } else {
    std::vector<float>& v = velocity_[index];
    for (size_t j = 0; j < w.size(); ++j) {
      v[j] = float(momentum_ * double(v[j]) + double(grad[j]));
      w[j] = float(double(w[j]) - lr_ * double(v[j]));
    }
  }
  return w;
}

double loss_and_gradient(std::span<const float> y, std::span<const float> target,
                         std::span<float> dy) {
  double sum = 0;
  const double n = double(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    const double diff = double(y[i]) - double(target[i]);
    sum += diff * diff;
    dy[i] = float(diff / n);
  }
  return 0.5 * sum / n;
}

double half_mean_square(std::span<const float> values) {
  double sum = 0;
  for (const float v : values) sum += double(v) * double(v);
  return values.empty() ? 0.0 : 0.5 * sum / double(values.size());
}

bool evaluates_after(int step, const TrainOptions& options) {
  return step == options.steps || (options.eval_every > 0 && step % options.eval_every == 0);
}

TrainCurve train_reference(const ir::Sequence& student_sequence,
                           const ir::Sequence& teacher_sequence, const TrainOptions& options,
                           const TrainProgress& progress) {
  if (options.steps < 1)
    throw ReferenceError(fmt::format("--steps must be at least 1, got {}", options.steps));
  if (student_sequence.quantized_input) {
    throw ReferenceError(fmt::format(
        "fusec train draws bf16 batches, and input '{}' of sequence '{}' is quantized: train the "
        "sequence that makes it and this one as one sequence",
        student_sequence.value(student_sequence.inputs[0]).name, student_sequence.name));
  }
  const auto start = std::chrono::steady_clock::now();
  ReferenceExecutor<float> teacher(lowered_for_run(teacher_sequence, nullptr), options.bindings);
  ReferenceExecutor<float> student(lowered_for_run(student_sequence, nullptr), options.bindings);
  if (student.param_names().empty())
    throw ReferenceError(
        fmt::format("sequence '{}' has no parameters to train", student_sequence.name));
  const auto shapes = student.input_shapes();
  const size_t outputs = student.output_shapes().size();
  TrainCurve curve;
  curve.recipe_text = ir::recipe_string(student_sequence.recipe);

  // The teacher: parameters from seed + 1, matrices rescaled, then the last one scaled so that
  // the teacher's output on the evaluation batch has root mean square 1.
  init_params_from_seed(teacher, options.seed + 1);
  std::vector<HostParam> teacher_params = params_of(teacher);
  teacher_weights(teacher_params);
  const std::vector<Tensor<float>> eval_inputs = batch(shapes, options.seed, kEvalBatch);
  for (int pass = 0; pass < 2; ++pass) {
    for (const HostParam& p : teacher_params) teacher.param(p.name).data = p.values;
    teacher.params_changed();
    if (pass == 1) break;
    const std::vector<float> y = teacher.forward(eval_inputs)[0].data;
    const double rms = std::sqrt(2.0 * half_mean_square(y));
    const size_t last = last_matrix(teacher_params);
    if (rms > 0 && std::isfinite(rms) && last < teacher_params.size())
      for (float& v : teacher_params[last].values) v = float(double(v) / rms);
  }
  std::vector<float> eval_target = teacher.forward(eval_inputs)[0].data;
  curve.teacher_rms = std::sqrt(2.0 * half_mean_square(eval_target));
  {
    std::vector<float> noise(eval_target.size());
    fill_normal(noise, options.seed, kNoiseStream, kEvalBatch, options.noise);
    curve.noise_floor = half_mean_square(noise);
    for (size_t i = 0; i < noise.size(); ++i) eval_target[i] += noise[i];
  }

  // The student: parameters from the seed, matrices rescaled as the teacher's (the header says
  // why).
  init_params_from_seed(student, options.seed);
  std::vector<HostParam> student_params = params_of(student);
  teacher_weights(student_params);
  for (const HostParam& p : student_params) student.param(p.name).data = p.values;
  student.params_changed();
  SgdOptimizer optimizer(params_of(student), options.lr, options.momentum);
  std::vector<Tensor<float>> output_grads(outputs);
  double last_train_loss = 0;
  // The evaluation forward runs before the step's training forward (which backward reads).
  auto evaluate = [&](int step) {
    const Tensor<float> y = student.forward(eval_inputs)[0];
    std::vector<float> unused(y.data.size());
    curve.steps.push_back(step);
    curve.eval_loss.push_back(loss_and_gradient(y.data, eval_target, unused));
    curve.train_loss.push_back(last_train_loss);
    return std::isfinite(curve.eval_loss.back());
  };
  auto report = [&] {
    if (progress) progress(curve.steps.back(), curve.eval_loss.back(), curve.train_loss.back());
  };
  auto stop = [&](int step) {
    curve.diverged = true;
    curve.diverged_step = step;
  };
  for (int step = 0; step < options.steps && !curve.diverged; ++step) {
    const bool evaluated = evaluates_after(step, options);
    const bool eval_finite = !evaluated || evaluate(step);
    const std::vector<Tensor<float>> inputs = batch(shapes, options.seed, uint64_t(step));
    std::vector<float> target = teacher.forward(inputs)[0].data;
    add_noise(target, options.seed, uint64_t(step), options.noise);
    const Tensor<float> y = student.forward(inputs)[0];
    output_grads[0] = Tensor<float>::zeros(y.shape);
    last_train_loss = loss_and_gradient(y.data, target, output_grads[0].data);
    if (evaluated) {
      curve.train_loss.back() = last_train_loss;
      report();
    }
    if (!eval_finite || !std::isfinite(last_train_loss)) {
      stop(step);
      break;
    }
    const Gradients<float> grads = student.backward(output_grads);
    student.step();
    for (size_t i = 0; i < grads.params.size(); ++i)
      student.param(student.param_names()[i]).data = optimizer.update(i, grads.params[i].data);
    student.params_changed();
  }
  if (!curve.diverged) {
    if (!evaluate(options.steps)) stop(options.steps);
    report();
  }
  if (!curve.diverged) {
    // The final weights in the teacher's (bf16) executor, whose targets are computed already.
    for (const std::string& name : student.param_names())
      teacher.param(name).data = student.param(name).data;
    teacher.params_changed();
    const std::vector<float> y = teacher.forward(eval_inputs)[0].data;
    std::vector<float> unused(y.size());
    curve.final_bf16_forward_loss = loss_and_gradient(y, eval_target, unused);
  }
  curve.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return curve;
}

}  // namespace opfuse::cpu
