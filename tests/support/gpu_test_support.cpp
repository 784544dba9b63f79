#include "gpu_test_support.h"
#include "driver/compile.h"

#include <algorithm>
#include <map>
#include <utility>

#include "api/program_impl.h"
#include "cpu/numerics.h"
#include "driver/frontend.h"
#include "gpu/device.h"
#include "jit/kernel_cache.h"
#include "jit/nvrtc_compiler.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "support/diagnostics.h"
#include "test_support.h"

namespace opfuse::test {

namespace {

// One cache object per directory for the whole process, so that programs compiled by several
// tests share the kernels they have in common.
jit::KernelCache& kernel_cache(const std::string& directory) {
  static std::map<std::string, std::unique_ptr<jit::KernelCache>> caches;
  std::unique_ptr<jit::KernelCache>& cache = caches[directory];
  if (cache == nullptr) {
    cache = std::make_unique<jit::KernelCache>(directory.empty() ? make_temp_dir("gpu_test_kernels")
                                                                 : directory);
  }
  return *cache;
}

}  // namespace

std::unique_ptr<CompiledProgram> compile_program(const std::string& name, const std::string& text,
                                                 const std::string& recipe_override,
                                                 const std::string& kernel_cache_dir,
                                                 const debug::Routing* debug_routing) {
  auto compiled = std::make_unique<CompiledProgram>();
  DiagnosticEngine diags(compiled->sources);
  driver::CompileOptions options;
  options.recipe = recipe_override;
  options.arch = gpu::current_device().arch;
  options.debug_routing = debug_routing;
  driver::CompileResult program =
      driver::compile_source(name + ".fuse", text, compiled->sources, diags, options);
  if (!program.ok()) {
    ADD_FAILURE() << diags.format_all() << program.error;
    return nullptr;
  }
  compiled->program = std::move(program.program);
  compiled->plan = std::move(program.plan);
  const jit::CompileAllResult result =
      jit::compile_all(opfuse::compile_requests(program.kernels), &kernel_cache(kernel_cache_dir));
  compiled->modules = std::make_unique<gpu::PlanModules>(compiled->plan, result.kernels);
  return compiled;
}

TemplateKernels load_template_kernels(const std::string& source,
                                      const std::vector<std::string>& name_expressions) {
  TemplateKernels loaded;
  loaded.kernels.assign(name_expressions.size(), nullptr);
  jit::CompileRequest request;
  request.kernel_name = name_expressions.empty() ? "templates" : name_expressions.front();
  request.source = source;
  request.name_expressions = name_expressions;
  request.arch = gpu::current_device().arch;
  try {
    loaded.compiled = jit::compile_kernel(request);
  } catch (const jit::JitError& error) {
    ADD_FAILURE() << error.what();
    return loaded;
  }
  cudaLibrary_t library = nullptr;
  const cudaError_t load = cudaLibraryLoadData(&library, loaded.compiled.binary.data(), nullptr,
                                               nullptr, 0, nullptr, nullptr, 0);
  if (load != cudaSuccess) {
    ADD_FAILURE() << "cudaLibraryLoadData: " << cudaGetErrorString(load);
    return loaded;
  }
  for (std::size_t i = 0; i < name_expressions.size(); ++i) {
    const auto lowered = loaded.compiled.lowered_names.find(name_expressions[i]);
    if (lowered == loaded.compiled.lowered_names.end()) {
      ADD_FAILURE() << "no lowered name for " << name_expressions[i];
      continue;
    }
    EXPECT_EQ(cudaLibraryGetKernel(&loaded.kernels[i], library, lowered->second.c_str()),
              cudaSuccess)
        << name_expressions[i];
  }
  return loaded;
}

DeviceArray::DeviceArray(std::size_t bytes) : bytes_(bytes) {
  EXPECT_EQ(cudaMalloc(&data_, std::max<std::size_t>(bytes, 16)), cudaSuccess);
}

DeviceArray::~DeviceArray() { cudaFree(data_); }

void GpuStreamTest::SetUp() {
  std::string why;
  if (!gpu::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
}

void GpuStreamTest::TearDown() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

DeviceArray& GpuStreamTest::new_array(std::size_t bytes) {
  arrays_.push_back(std::make_unique<DeviceArray>(bytes));
  return *arrays_.back();
}

std::map<std::string, DeviceArray*> GpuStreamTest::allocate_tensors(gpu::SequenceExecutor& gpu) {
  std::map<std::string, DeviceArray*> arrays;
  for (const gpu::TensorInfo& info : gpu.tensors()) {
    if (info.role == plan::BufferRole::Result) continue;
    arrays[info.name] = &new_array(info.bytes);
    gpu.set_tensor(info.name, arrays[info.name]->data());
  }
  return arrays;
}

void random_params(cpu::ReferenceExecutor<float>& ref,
                   const std::map<std::string, DeviceArray*>& arrays, std::mt19937_64& rng) {
  for (const std::string& name : ref.param_names()) {
    cpu::Tensor<float>& p = ref.param(name);
    p.data = random_bf16(p.data.size(), p.shape.size() == 2 ? 0.05 : 0.1, rng);
    upload_bf16(*arrays.at(name), p.data);
  }
  ref.params_changed();
}

void upload_bf16_bits(const DeviceArray& array, const std::vector<std::uint16_t>& bits) {
  ASSERT_EQ(bits.size() * 2, array.bytes());
  ASSERT_EQ(cudaMemcpy(array.data(), bits.data(), array.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  // Why: from pageable memory cudaMemcpy may return before the DMA lands, and the tests' streams
  // do not wait for the legacy stream (cudaStreamNonBlocking).
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

void upload_bf16(const DeviceArray& array, const std::vector<float>& values) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = cpu::float_to_bf16(values[i]);
  upload_bf16_bits(array, bits);
}

void upload_bytes(const DeviceArray& array, const void* host, std::size_t bytes) {
  ASSERT_LE(bytes, array.bytes());
  ASSERT_EQ(cudaMemcpy(array.data(), host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  // Why: as upload_bf16_bits.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::vector<std::uint8_t> download_bytes(const void* device, std::size_t bytes) {
  std::vector<std::uint8_t> out(bytes);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(out.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

std::vector<std::uint16_t> download_bf16_bits(const void* device, std::size_t count) {
  std::vector<std::uint16_t> bits(count);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(bits.data(), device, count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  return bits;
}

std::vector<float> download_bf16(const void* device, std::size_t count) {
  const std::vector<std::uint16_t> bits = download_bf16_bits(device, count);
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = cpu::bf16_to_float(bits[i]);
  return values;
}

std::vector<float> random_bf16(std::size_t count, double stddev, std::mt19937_64& rng,
                               double mean) {
  std::normal_distribution<double> normal(mean, stddev);
  std::vector<float> values(count);
  for (float& v : values)
    v = cpu::bf16_to_float(cpu::float_to_bf16(static_cast<float>(normal(rng))));
  return values;
}

}  // namespace opfuse::test
