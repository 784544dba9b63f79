#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

#include "api/build_dir.h"
#include "api/debug_program.h"
#include "api/program_impl.h"
#include "cpu/numerics.h"
#include "driver/compile.h"
#include "driver/frontend.h"
#include "dsl/lexer.h"
#include "gpu/device.h"
#include "jit/kernel_cache.h"
#include "support/diagnostics.h"

namespace opfuse {

namespace {

float decode_one(const unsigned char* bytes, TensorDType dtype) {
  std::uint16_t half = 0;
  switch (dtype) {
    case TensorDType::BF16:
      std::memcpy(&half, bytes, 2);
      return cpu::bf16_to_float(half);
    case TensorDType::FP16:
      std::memcpy(&half, bytes, 2);
      return cpu::fp16_to_float(half);
    case TensorDType::FP32: {
      float value = 0;
      std::memcpy(&value, bytes, 4);
      return value;
    }
    default:
      break;
  }
  throw UsageError(
      fmt::format("reading {} values on the host: only bf16, fp16 and fp32 are supported",
                  tensor_dtype_name(dtype)));
}

void encode_one(float value, TensorDType dtype, unsigned char* bytes) {
  std::uint16_t half = 0;
  switch (dtype) {
    case TensorDType::BF16:
      half = cpu::float_to_bf16(value);
      std::memcpy(bytes, &half, 2);
      return;
    case TensorDType::FP16:
      half = cpu::float_to_fp16(value);
      std::memcpy(bytes, &half, 2);
      return;
    case TensorDType::FP32:
      std::memcpy(bytes, &value, 4);
      return;
    default:
      break;
  }
  throw UsageError(
      fmt::format("writing {} values from the host: only bf16, fp16 and fp32 are supported",
                  tensor_dtype_name(dtype)));
}

// The GPU's NVRTC target, or the default target when this machine has no GPU.
std::string default_arch() {
  if (!gpu::gpu_available()) return "sm_90a";
  return gpu::current_device().arch;
}

}  // namespace

std::vector<unsigned char> encode_values(const std::vector<float>& values, TensorDType dtype) {
  const std::size_t size = tensor_dtype_bytes(dtype);
  std::vector<unsigned char> bytes(values.size() * size);
  for (std::size_t i = 0; i < values.size(); ++i)
    encode_one(values[i], dtype, bytes.data() + i * size);
  return bytes;
}

std::vector<float> decode_values(const std::vector<unsigned char>& bytes, TensorDType dtype) {
  const std::size_t size = tensor_dtype_bytes(dtype);
  std::vector<float> values(bytes.size() / size);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = decode_one(bytes.data() + i * size, dtype);
  return values;
}

bool gpu_available(std::string* why) { return gpu::gpu_available(why); }

std::string_view scale_layout_name(ScaleLayout layout) {
  switch (layout) {
    case ScaleLayout::Tensor:
      return "tensor";
    case ScaleLayout::Block1x128:
      return "block_1x128";
    case ScaleLayout::Block128x128:
      return "block_128x128";
    case ScaleLayout::Mxfp8:
      return "mxfp8_1x32";
    case ScaleLayout::Nvfp4:
      return "nvfp4_1x16";
  }
  return "?";
}

std::string_view tensor_dtype_name(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::BF16:
      return "bf16";
    case TensorDType::FP16:
      return "fp16";
    case TensorDType::FP32:
      return "fp32";
    case TensorDType::E4M3:
      return "e4m3";
    case TensorDType::E5M2:
      return "e5m2";
    case TensorDType::E2M1:
      return "e2m1";
    case TensorDType::E8M0:
      return "e8m0";
  }
  return "?";
}

std::size_t tensor_dtype_bytes(TensorDType dtype) {
  switch (dtype) {
    case TensorDType::BF16:
    case TensorDType::FP16:
      return 2;
    case TensorDType::FP32:
      return 4;
    case TensorDType::E4M3:
    case TensorDType::E5M2:
    case TensorDType::E2M1:
    case TensorDType::E8M0:
      return 1;
  }
  return 0;
}

std::string_view tensor_kind_name(TensorKind kind) {
  switch (kind) {
    case TensorKind::Input:
      return "input";
    case TensorKind::Param:
      return "param";
    case TensorKind::OutputGrad:
      return "output_grad";
    case TensorKind::Output:
      return "output";
    case TensorKind::InputGrad:
      return "input_grad";
    case TensorKind::ParamGrad:
      return "param_grad";
  }
  return "?";
}

namespace {

// Each declaration as the language writes it, one source per declaration so that a diagnostic
// names the one it is in. Names are checked first: the text must say what the fields say.
ExtraSources fusion_sources(const std::vector<FusionDeclaration>& fusions) {
  ExtraSources out;
  for (size_t i = 0; i < fusions.size(); ++i) {
    const FusionDeclaration& f = fusions[i];
    if (!dsl::is_identifier(f.name)) {
      throw UsageError(fmt::format(
          "CompileOptions::fusions[{}]: the name '{}' is not an identifier", i, f.name));
    }
    std::string steps;
    for (const std::string& op : f.ops) {
      const bool optional = op.ends_with('?');
      const std::string_view name = std::string_view(op).substr(0, op.size() - (optional ? 1 : 0));
      if (!dsl::is_identifier(name)) {
        throw UsageError(fmt::format(
            "CompileOptions::fusions[{}] ('{}'): the step '{}' is not an op name (with '?' when "
            "optional)",
            i, f.name, op));
      }
      steps += fmt::format("{}{}", steps.empty() ? "" : "; ", op);
    }
    out.emplace_back(
        fmt::format("<CompileOptions.fusions[{}]>", i),
        fmt::format("fusion {}(phase = {}, priority = {}) {{ {} }}\n", f.name,
                    f.phase == FusionDeclaration::Phase::Backward ? "backward" : "forward",
                    f.priority, steps));
  }
  return out;
}

}  // namespace

Program Program::compile(std::string_view source, std::string_view file_name,
                         const CompileOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->source_name = std::string(file_name);

  auto sources = std::make_shared<SourceManager>();
  DiagnosticEngine diags(*sources);
  driver::CompileOptions compile_options;
  compile_options.recipe = options.recipe;
  compile_options.disabled_passes.insert(options.disabled_passes.begin(),
                                         options.disabled_passes.end());
  compile_options.arch = options.arch.empty() ? default_arch() : options.arch;
  compile_options.fp8_fprop_fast_accum = options.fp8_fprop_fast_accum;
  compile_options.fp8_backward_fast_accum = options.fp8_backward_fast_accum;
  compile_options.emulate_block_scaling = options.emulate_block_scaling;
  compile_options.extra_sources = fusion_sources(options.fusions);
  // The front end, then the passes and the plan (the plain plan): a debug config keeps the IR
  // in between to compile its variants from.
  driver::CompileOptions front_end = compile_options;
  front_end.last_stage = driver::Stage::FrontEnd;
  driver::CompileResult result = driver::compile_source(std::string(file_name), std::string(source),
                                                        *sources, diags, front_end);
  if (result.status == driver::CompileStatus::UsageError) {
    if (!result.unknown_passes.empty()) {
      throw UsageError(fmt::format("CompileOptions::disabled_passes names no pass '{}'; passes: {}",
                                   result.unknown_passes[0],
                                   fmt::join(driver::pass_names(), ", ")));
    }
    throw UsageError("CompileOptions::disabled_passes: " + result.error);
  }
  if (!result.ok()) throw CompileError(diags.format_all());
  if (!options.debug_features.empty() && !options.debug_config) {
    throw UsageError(
        "CompileOptions::debug_features without a debug_config: the features run only where a "
        "config names them");
  }
  if (options.debug_config) {
    const DebugConfigSource& config = *options.debug_config;
    if (config.path.empty() && config.text.empty()) {
      throw UsageError(
          "CompileOptions::debug_config has neither a path nor a text: give one, or leave "
          "debug_config empty");
    }
    impl->debug =
        api::DebugProgram::create(config, result.program, sources, diags, compile_options, options);
    if (!impl->debug) throw CompileError(diags.format_all());
  }
  ir::Program program = std::move(result.program);
  result = driver::compile_ir(std::move(program), sources.get(), &diags, compile_options);
  if (!result.ok()) throw CompileError(result.error.empty() ? diags.format_all() : result.error);
  impl->warnings = diags.format_all();
  impl->plan = std::move(result.plan);

  const std::vector<jit::CompileRequest> requests = compile_requests(result.kernels);
  std::unique_ptr<jit::KernelCache> cache;
  if (options.use_cache) {
    cache = std::make_unique<jit::KernelCache>(
        options.cache_dir.empty() ? jit::KernelCache::default_directory() : options.cache_dir);
  }
  const auto kernels_start = std::chrono::steady_clock::now();
  jit::CompileAllResult compiled = jit::compile_all(requests, cache.get(), options.compile_threads);
  impl->kernels = std::move(compiled.kernels);
  impl->stats.kernels = static_cast<int>(requests.size());
  impl->stats.cache_hits = compiled.stats.hits;
  impl->stats.compiled = compiled.stats.misses;
  impl->stats.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - kernels_start)
          .count();
  return Program(std::move(impl));
}

Program Program::compile_file(const std::string& path, const CompileOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("cannot read the program file {}", path));
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  return compile(text, path, options);
}

Program Program::load_build(const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  api::LoadedBuild build = api::load_build_dir(dir);
  auto impl = std::make_shared<Impl>();
  impl->source_name = build.plan.source;
  impl->plan = std::move(build.plan);
  impl->kernels = std::move(build.kernels);
  impl->stats.kernels = static_cast<int>(impl->kernels.size());
  impl->stats.cache_hits = impl->stats.kernels;
  impl->stats.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return Program(std::move(impl));
}

std::vector<std::string> Program::sequences() const {
  std::vector<std::string> names;
  for (const auto& s : impl_->plan.sequences) names.push_back(s.name);
  return names;
}

const std::string& Program::arch() const { return impl_->plan.arch; }

std::string Program::recipe(std::string_view sequence) const {
  return find_sequence_plan(*impl_, sequence).recipe;
}

std::string Program::plan_json() const { return plan::plan_json_text(impl_->plan); }

const BuildStats& Program::build_stats() const { return impl_->stats; }

const std::string& Program::warnings() const { return impl_->warnings; }

bool Program::has_debug_config() const { return impl_->debug != nullptr; }

std::vector<jit::CompileRequest> compile_requests(
    const std::vector<driver::KernelRequest>& kernels) {
  std::vector<jit::CompileRequest> requests;
  for (const driver::KernelRequest& kernel : kernels) {
    jit::CompileRequest request;
    request.kernel_name = kernel.kernel_name;
    request.source = kernel.source;
    request.name_expressions = kernel.name_expressions;
    request.arch = kernel.arch;
    requests.push_back(std::move(request));
  }
  return requests;
}

std::vector<jit::CompileRequest> kernel_requests(const plan::Plan& plan, const std::string& arch) {
  return compile_requests(driver::kernel_requests(plan, arch));
}

const plan::SequencePlan& find_sequence_plan(const Program::Impl& program,
                                             std::string_view sequence) {
  const auto& sequences = program.plan.sequences;
  if (sequence.empty() && sequences.size() == 1) return sequences.front();
  std::vector<std::string> names;
  for (const auto& s : sequences) {
    if (s.name == sequence) return s;
    names.push_back(s.name);
  }
  throw UsageError(sequence.empty()
                       ? fmt::format("{} has {} sequences; name one: {}", program.source_name,
                                     sequences.size(), fmt::join(names, ", "))
                       : fmt::format("{} has no sequence '{}'; its sequences: {}",
                                     program.source_name, sequence, fmt::join(names, ", ")));
}

}  // namespace opfuse
