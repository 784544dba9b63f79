#include "run/gpu_train.h"

#include "api/program_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <vector>

#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/device_memory.h"

namespace opfuse::api {

namespace {

constexpr const char* kWhat = "fusec train";

// One step's data on the host: its inputs (signature order) and its target noise.
struct Batch {
  std::vector<std::vector<unsigned char>> inputs;  // encoded in each input's dtype
  std::vector<float> noise;
};

Batch draw_batch(const std::vector<TensorInfo>& inputs, std::size_t outputs, uint64_t seed,
                 uint64_t counter, double noise) {
  Batch b;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::vector<float> values(inputs[i].bytes / tensor_dtype_bytes(inputs[i].dtype));
    cpu::fill_normal(values, seed, cpu::input_stream(i), counter, 1.0);
    b.inputs.push_back(encode_values(values, inputs[i].dtype));
  }
  b.noise.resize(outputs);
  cpu::fill_normal(b.noise, seed, cpu::kNoiseStream, counter, noise);
  return b;
}

std::vector<unsigned char> download_bytes(const void* device, const TensorInfo& info,
                                          cudaStream_t stream) {
  std::vector<unsigned char> bytes(info.bytes);
  OPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(bytes.data(), device, bytes.size(), cudaMemcpyDeviceToHost, stream),
      fmt::format("reading '{}'", info.name));
  return bytes;
}

void sync(cudaStream_t stream) { OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), kWhat); }

std::vector<float> download(const void* device, const TensorInfo& info, cudaStream_t stream) {
  const std::vector<unsigned char> bytes = download_bytes(device, info, stream);
  sync(stream);
  return decode_values(bytes, info.dtype);
}

// The copy is enqueued; `bytes` must live until the stream has read it.
void upload(void* device, const std::vector<unsigned char>& bytes, const TensorInfo& info,
            cudaStream_t stream) {
  OPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream),
      fmt::format("writing '{}'", info.name));
}

struct Interface {
  std::vector<TensorInfo> inputs, params, param_grads, output_grads;
  TensorInfo output;
};

Interface interface_of(const Session& session) {
  for (const QuantizedTensorInfo& q : session.quantized_tensors()) {
    if (q.kind == TensorKind::Input) {
      throw UsageError(fmt::format(
          "fusec train draws bf16 batches, and input '{}' of sequence '{}' is quantized: train "
          "the sequence that makes it and this one as one sequence",
          q.name, session.sequence()));
    }
  }
  Interface in;
  bool has_output = false;
  for (const TensorInfo& info : session.tensors()) {
    if (info.kind == TensorKind::Input) in.inputs.push_back(info);
    if (info.kind == TensorKind::Param) in.params.push_back(info);
    if (info.kind == TensorKind::ParamGrad) in.param_grads.push_back(info);
    if (info.kind == TensorKind::OutputGrad) in.output_grads.push_back(info);
    if (info.kind == TensorKind::Output && !has_output) {
      in.output = info;
      has_output = true;
    }
  }
  if (in.params.empty())
    throw UsageError(fmt::format("sequence '{}' has no parameters to train", session.sequence()));
  // Each parameter's gradient in the parameters' order (tensors() lists kinds apart, the
  // gradients in an order of their own); a gradient is named as its parameter.
  std::vector<TensorInfo> grads;
  for (const TensorInfo& p : in.params) {
    const auto g = std::find_if(in.param_grads.begin(), in.param_grads.end(),
                                [&](const TensorInfo& info) { return info.name == p.name; });
    if (g == in.param_grads.end())
      throw UsageError(fmt::format("parameter '{}' of sequence '{}' has no gradient to train with",
                                   p.name, session.sequence()));
    grads.push_back(*g);
  }
  in.param_grads = std::move(grads);
  if (!has_output || in.output_grads.empty())
    throw UsageError(
        fmt::format("sequence '{}' has no output gradient to train through", session.sequence()));
  return in;
}

std::vector<cpu::HostParam> download_params(const Session& session, const Interface& in,
                                            cudaStream_t stream) {
  std::vector<cpu::HostParam> out;
  for (const TensorInfo& p : in.params)
    out.push_back({p.name, p.shape, download(session.parameter(p.name), p, stream)});
  return out;
}

void upload_params(Session& session, const Interface& in, const std::vector<cpu::HostParam>& params,
                   cudaStream_t stream) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::vector<unsigned char> bytes = encode_values(params[i].values, in.params[i].dtype);
    upload(session.parameter(in.params[i].name), bytes, in.params[i], stream);
    sync(stream);
  }
  session.parameters_changed();
}

}  // namespace

cpu::TrainCurve train_on_gpu(const Program& student_program, const Program& teacher_program,
                             const std::string& sequence, const cpu::TrainOptions& options,
                             const cpu::TrainProgress& progress) {
  if (options.steps < 1)
    throw UsageError(fmt::format("--steps must be at least 1, got {}", options.steps));
  if (std::string why; !gpu::gpu_available(&why))
    throw UsageError(fmt::format("{}: {}", kWhat, why));
  const auto start = std::chrono::steady_clock::now();
  cudaStream_t stream = nullptr;
  OPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), kWhat);
  struct StreamOwner {
    cudaStream_t stream;
    ~StreamOwner() { (void)cudaStreamDestroy(stream); }
  } owner{stream};

  Session teacher(teacher_program, sequence, stream);
  Session student(student_program, sequence, stream);
  const std::map<std::string, std::int64_t> sizes(options.bindings.begin(), options.bindings.end());
  teacher.bind(sizes);
  student.bind(sizes);
  const Interface in = interface_of(student);
  const Interface teacher_in = interface_of(teacher);
  cpu::TrainCurve curve;
  curve.recipe_text = student_program.recipe(sequence);

  // Inputs shared by both sessions; the output gradients of extra outputs stay zero.
  std::vector<gpu::DeviceBuffer> input_memory;
  for (const TensorInfo& x : in.inputs) {
    input_memory.emplace_back(x.bytes, stream);
    student.set_tensor(x.name, input_memory.back().data());
    teacher.set_tensor(x.name, input_memory.back().data());
  }
  std::vector<gpu::DeviceBuffer> grad_memory;
  for (const TensorInfo& g : in.output_grads) {
    grad_memory.emplace_back(g.bytes, stream);
    OPFUSE_CUDA_CHECK(cudaMemsetAsync(grad_memory.back().data(), 0, g.bytes, stream), kWhat);
    student.set_tensor(g.name, grad_memory.back().data());
  }
  const std::size_t numel = in.output.bytes / tensor_dtype_bytes(in.output.dtype);
  auto put_batch = [&](const Batch& b) {
    for (std::size_t i = 0; i < in.inputs.size(); ++i)
      upload(input_memory[i].data(), b.inputs[i], in.inputs[i], stream);
  };
  auto teacher_output = [&](const Batch& b) {
    teacher.forward(stream, RunMode::Inference);
    std::vector<float> y = download(teacher.output(in.output.name), in.output, stream);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += b.noise[i];
    return y;
  };

  // The teacher: parameters from seed + 1, matrices rescaled, the last one scaled so that its
  // output on the evaluation batch has root mean square 1 (as train_reference does).
  teacher.own_parameters(options.seed + 1, stream);
  std::vector<cpu::HostParam> teacher_params = download_params(teacher, teacher_in, stream);
  cpu::teacher_weights(teacher_params);
  upload_params(teacher, teacher_in, teacher_params, stream);
  const Batch eval = draw_batch(in.inputs, numel, options.seed, cpu::kEvalBatch, options.noise);
  put_batch(eval);
  teacher.forward(stream, RunMode::Inference);
  {
    const std::vector<float> y = download(teacher.output(in.output.name), in.output, stream);
    const double rms = std::sqrt(2.0 * cpu::half_mean_square(y));
    const std::size_t last = cpu::last_matrix(teacher_params);
    if (rms > 0 && std::isfinite(rms) && last < teacher_params.size()) {
      for (float& v : teacher_params[last].values) v = float(double(v) / rms);
      upload_params(teacher, teacher_in, teacher_params, stream);
    }
  }
  const std::vector<float> eval_target = teacher_output(eval);
  curve.noise_floor = cpu::half_mean_square(eval.noise);
  {
    std::vector<float> clean(eval_target.size());
    for (std::size_t i = 0; i < clean.size(); ++i) clean[i] = eval_target[i] - eval.noise[i];
    curve.teacher_rms = std::sqrt(2.0 * cpu::half_mean_square(clean));
  }

  student.own_parameters(options.seed, stream);
  std::vector<cpu::HostParam> student_params = download_params(student, in, stream);
  cpu::teacher_weights(student_params);
  upload_params(student, in, student_params, stream);
  cpu::SgdOptimizer optimizer(download_params(student, in, stream), options.lr, options.momentum);
  std::vector<float> dy(numel);
  double last_train_loss = 0;
  auto evaluate = [&](int step) {
    put_batch(eval);
    student.forward(stream, RunMode::Training);
    const std::vector<float> y = download(student.output(in.output.name), in.output, stream);
    curve.steps.push_back(step);
    curve.eval_loss.push_back(cpu::loss_and_gradient(y, eval_target, dy));
    curve.train_loss.push_back(last_train_loss);
    return std::isfinite(curve.eval_loss.back());
  };
  auto report = [&] {
    if (progress) progress(curve.steps.back(), curve.eval_loss.back(), curve.train_loss.back());
  };
  auto next_batch = [&](int step) {
    return std::async(std::launch::async, draw_batch, std::cref(in.inputs), numel, options.seed,
                      uint64_t(step), options.noise);
  };
  std::future<Batch> pending = next_batch(0);
  std::vector<std::vector<unsigned char>> grad_bytes(in.params.size()),
      weight_bytes(in.params.size());
  for (int step = 0; step < options.steps; ++step) {
    const bool evaluated = cpu::evaluates_after(step, options);
    const bool eval_finite = !evaluated || evaluate(step);
    const Batch b = pending.get();
    if (step + 1 < options.steps) pending = next_batch(step + 1);
    put_batch(b);
    const std::vector<float> target = teacher_output(b);
    student.forward(stream, RunMode::Training);
    const std::vector<float> y = download(student.output(in.output.name), in.output, stream);
    last_train_loss = cpu::loss_and_gradient(y, target, dy);
    if (evaluated) {
      curve.train_loss.back() = last_train_loss;
      report();
    }
    if (!eval_finite || !std::isfinite(last_train_loss)) {
      curve.diverged = true;
      curve.diverged_step = step;
      break;
    }
    const std::vector<unsigned char> dy_bytes = encode_values(dy, in.output_grads[0].dtype);
    upload(grad_memory[0].data(), dy_bytes, in.output_grads[0], stream);
    student.backward(stream);
    for (std::size_t i = 0; i < in.params.size(); ++i)
      grad_bytes[i] =
          download_bytes(student.param_grad(in.params[i].name), in.param_grads[i], stream);
    student.step(stream);
    sync(stream);
    // The update, one host thread per parameter.
    std::vector<std::future<void>> updates;
    for (std::size_t i = 0; i < in.params.size(); ++i)
      updates.push_back(std::async(std::launch::async, [&, i] {
        const std::vector<float> g = decode_values(grad_bytes[i], in.param_grads[i].dtype);
        weight_bytes[i] = encode_values(optimizer.update(i, g), in.params[i].dtype);
      }));
    for (auto& u : updates) u.get();
    for (std::size_t i = 0; i < in.params.size(); ++i)
      upload(student.parameter(in.params[i].name), weight_bytes[i], in.params[i], stream);
    student.parameters_changed();
  }
  if (!curve.diverged) {
    if (!evaluate(options.steps)) {
      curve.diverged = true;
      curve.diverged_step = options.steps;
    }
    report();
  }
  if (!curve.diverged) {
    // The final weights in the teacher's (bf16) session, whose targets are computed already.
    upload_params(teacher, teacher_in, download_params(student, in, stream), stream);
    put_batch(eval);
    teacher.forward(stream, RunMode::Inference);
    const std::vector<float> y = download(teacher.output(in.output.name), in.output, stream);
    curve.final_bf16_forward_loss = cpu::loss_and_gradient(y, eval_target, dy);
  }
  sync(stream);
  curve.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return curve;
}

}  // namespace opfuse::api
