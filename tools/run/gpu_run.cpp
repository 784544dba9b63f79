#include "run/gpu_run.h"

#include "api/program_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/device_memory.h"
#include "reference/run_driver.h"
#include "reference/run_steps.h"
#include "run/quantized_inputs.h"

namespace opfuse::api {

namespace {

std::vector<float> download(const void* device, const TensorInfo& info, cudaStream_t stream) {
  std::vector<unsigned char> bytes(info.bytes);
  OPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(bytes.data(), device, bytes.size(), cudaMemcpyDeviceToHost, stream),
      fmt::format("reading '{}'", info.name));
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "fusec run");
  return decode_values(bytes, info.dtype);
}

void upload(void* device, const std::vector<float>& values, const TensorInfo& info,
            cudaStream_t stream) {
  const std::vector<unsigned char> bytes = encode_values(values, info.dtype);
  OPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(device, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream),
      fmt::format("writing '{}'", info.name));
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "fusec run");
}

double norm_of(const std::vector<float>& values) {
  double sum = 0;
  for (const float v : values) sum += double(v) * double(v);
  return std::sqrt(sum);
}

}  // namespace

std::string run_gpu_training(const Program& program, const GpuRunOptions& options) {
  if (options.steps < 1)
    throw UsageError(fmt::format("--steps must be at least 1, got {}", options.steps));
  if (std::string why; !gpu::gpu_available(&why))
    throw UsageError(fmt::format("fusec run on the GPU: {}", why));
  cudaStream_t stream = nullptr;
  OPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "fusec run");
  struct StreamOwner {
    cudaStream_t stream;
    ~StreamOwner() { (void)cudaStreamDestroy(stream); }
  } owner{stream};

  SessionOptions session_options;
  session_options.debug = options.debug;
  session_options.parallel = options.parallel;
  // Note "Block summaries": printed as the CPU reference prints them, which it does not for
  // tensor-parallel or debug runs.
  session_options.block_summaries = options.parallel.size == 1 && !program.has_debug_config();
  Session session(program, options.sequence, stream, session_options);
  session.bind(options.bindings);
  session.own_parameters(options.seed, stream);

  std::vector<TensorInfo> inputs, params, outputs;
  std::map<std::string, TensorInfo> param_grads;
  const TensorInfo* output_grad = nullptr;
  const std::vector<TensorInfo> tensors = session.tensors();
  for (const TensorInfo& info : tensors) {
    if (info.kind == TensorKind::Input && !quantized_input_piece(session, info.name))
      inputs.push_back(info);
    if (info.kind == TensorKind::Param) params.push_back(info);
    if (info.kind == TensorKind::Output && !quantized_output_piece(session, info.name))
      outputs.push_back(info);
    if (info.kind == TensorKind::ParamGrad) param_grads[info.name] = info;
    if (info.kind == TensorKind::OutputGrad && output_grad == nullptr) output_grad = &info;
  }
  // Inputs as the CPU driver makes them: a second stream of the seed per input (signature order).
  std::vector<gpu::DeviceBuffer> input_memory;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const cpu::Tensor<float> values =
        cpu::seeded_normal(inputs[i].shape, options.seed ^ (0x9E3779B97F4A7C15ull + i), 1.0);
    input_memory.emplace_back(inputs[i].bytes, stream);
    upload(input_memory.back().data(), values.data, inputs[i], stream);
    session.set_tensor(inputs[i].name, input_memory.back().data());
  }
  give_quantized_inputs(session, options.seed, stream, input_memory);
  if (outputs.empty() || output_grad == nullptr)
    throw UsageError("fusec run trains sequences with an output and its gradient");
  const TensorInfo& y = outputs.front();
  // A quantized main output (a producer sequence) is read decoded to bf16, the values the CPU
  // reference's forward returns.
  const std::optional<QuantizedTensorInfo> y_quantized = quantized_output_info(session, y.name);
  TensorInfo y_read = y;
  gpu::DeviceBuffer y_decoded;
  if (y_quantized) {
    y_read.dtype = TensorDType::BF16;
    y_read.bytes = static_cast<std::size_t>(y_quantized->rows * y_quantized->cols) * 2;
    y_decoded = gpu::DeviceBuffer(y_read.bytes, stream);
  }
  gpu::DeviceBuffer dy_memory(output_grad->bytes, stream);
  session.set_tensor(output_grad->name, dy_memory.data());

  std::string bindings;
  for (const auto& [name, size] : options.bindings) bindings += fmt::format(" {}={}", name, size);
  const gpu::DeviceInfo device = gpu::current_device();
  std::string out = fmt::format(
      "sequence {}  recipe {}  device {} ({})\nbindings{}  steps {}  seed {}  lr {}\n{}; SGD on "
      "every parameter\nquantizers: amax of this step (history slot 0) and the scale used in it\n",
      session.sequence(), program.recipe(options.sequence), device.name,
      options.parallel.size > 1 ? fmt::format("{}, rank {} of {}", device.arch,
                                              options.parallel.rank, options.parallel.size)
                                : device.arch,
      bindings, options.steps, options.seed, options.lr, cpu::kRunLossDescription);
  gpu::reset_pool_peak();
  session.reset_peak_memory();
  for (int step = 0; step < options.steps; ++step) {
    session.forward(stream, RunMode::Training);
    if (y_quantized) dequantize(session.quantized_output(y.name), y_decoded.data(), stream);
    std::vector<float> values =
        download(y_quantized ? y_decoded.data() : session.output(y.name), y_read, stream);
    const double magnitude = norm_of(values);
    const double loss = 0.5 * magnitude * magnitude / double(values.size());
    for (float& v : values) v = float(double(v) / double(values.size()));
    upload(dy_memory.data(), values, *output_grad, stream);
    session.backward(stream);

    out += fmt::format("\nstep {:>4}  loss {:.6e}  |y| {:.6e}\n", step, loss, magnitude);
    std::vector<std::vector<float>> grads;
    for (const TensorInfo& p : params) {
      grads.push_back(download(session.param_grad(p.name), param_grads.at(p.name), stream));
      out += fmt::format("  grad   {:<32} |g| {:.6e}\n", p.name, norm_of(grads.back()));
    }
    for (const QuantizerStatus& q : session.quantizers(stream)) {
      out += fmt::format("  quant  {:<32} {}  amax {:.6e}  scale {:.6e}\n", q.name,
                         tensor_dtype_name(q.format), q.amax_history.at(0), q.scale);
    }
    if (session_options.block_summaries) {
      for (const BlockSummaryStatus& b : session.block_summaries(stream)) {
        cpu::BlockCopySummary copy;
        copy.quantizer = b.quantizer;
        copy.columnwise = b.columnwise;
        copy.format_name = std::string(tensor_dtype_name(b.format));
        copy.block_rows = b.block_rows;
        copy.block_cols = b.block_cols;
        copy.summary = {b.blocks, b.zero_blocks, b.scale_inv_min, b.scale_inv_max};
        copy.has_tensor_scale = b.has_tensor_scale;
        copy.tensor_scale = b.tensor_scale;
        out += cpu::format_block_summary(copy);
      }
    }
    session.step(stream);
    for (std::size_t i = 0; i < params.size(); ++i) {
      void* memory = session.parameter(params[i].name);
      std::vector<float> weights = download(memory, params[i], stream);
      for (std::size_t j = 0; j < weights.size(); ++j)
        weights[j] = float(double(weights[j]) - options.lr * double(grads[i][j]));
      upload(memory, weights, params[i], stream);
    }
    session.parameters_changed();
  }
  session.flush_debug_stats();  // the last iteration's statistics, before the report is read
  OPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream), "fusec run");
  const MemoryStats memory = session.memory();
  out += fmt::format(
      "\npeak device memory: {:.1f} MiB of activations and workspaces, {:.1f} MiB of parameters; "
      "pool high-water mark {:.1f} MiB\n",
      double(std::max(memory.peak_bytes, memory.reserved_bytes)) / (1 << 20),
      double(memory.owned_bytes) / (1 << 20), double(gpu::pool_usage().used_high) / (1 << 20));
  return out;
}

}  // namespace opfuse::api
