#include "gpu_test_support.h"
#include "driver/compile.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>
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

extern char** environ;

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
  driver::CompileOptions options;
  options.recipe = recipe_override;
  options.debug_routing = debug_routing;
  return compile_program_with(name, text, std::move(options), kernel_cache_dir);
}

std::unique_ptr<CompiledProgram> compile_program_with(const std::string& name,
                                                      const std::string& text,
                                                      driver::CompileOptions options,
                                                      const std::string& kernel_cache_dir) {
  auto compiled = std::make_unique<CompiledProgram>();
  DiagnosticEngine diags(compiled->sources);
  options.arch = gpu::current_device().arch;
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

void GpuStreamTest::fill_bytes(const DeviceArray& array, std::uint8_t byte) {
  OPFUSE_TEST_CUDA_OK(cudaMemsetAsync(array.data(), byte, array.bytes(), stream_));
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

void upload_values(const DeviceArray& array, const std::vector<float>& values, plan::DType dtype) {
  if (dtype == plan::DType::BF16) return upload_bf16(array, values);
  ASSERT_EQ(dtype, plan::DType::FP32) << "upload_values takes bf16 or fp32";
  ASSERT_EQ(values.size() * sizeof(float), array.bytes());
  upload_bytes(array, values.data(), array.bytes());
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

void expect_same_bytes(const DeviceArray& a, const DeviceArray& b, const char* what) {
  const std::vector<std::uint8_t> wa = download_bytes(a.data(), a.bytes());
  const std::vector<std::uint8_t> ga = download_bytes(b.data(), b.bytes());
  ASSERT_EQ(wa.size(), ga.size()) << what;
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < wa.size(); ++i) {
    if (wa[i] != ga[i] && differ++ == 0) first = i;
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " bytes differ, the first at " << first
                        << " (unfused " << int(wa[first]) << ", fused " << int(ga[first]) << ")";
}

std::size_t bytes_other_than(const DeviceArray& array, std::uint8_t byte) {
  std::size_t count = 0;
  for (const std::uint8_t b : download_bytes(array.data(), array.bytes())) count += b != byte;
  return count;
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

std::vector<float> download_values(const void* device, std::size_t count, plan::DType dtype) {
  if (dtype == plan::DType::BF16) return download_bf16(device, count);
  EXPECT_EQ(dtype, plan::DType::FP32) << "download_values takes bf16 or fp32";
  if (dtype != plan::DType::FP32) return std::vector<float>(count);
  const std::vector<std::uint8_t> bytes = download_bytes(device, count * sizeof(float));
  std::vector<float> values(count);
  std::memcpy(values.data(), bytes.data(), bytes.size());
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

void run_ranks(int size, const std::string& child_test, const std::string& dir,
               const std::string& job, const std::vector<std::string>& extra_env,
               std::chrono::seconds timeout) {
  SCOPED_TRACE(std::to_string(size) + " ranks");
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();

  // Everything the children need is built before fork: after fork in a threaded process (CUDA's
  // threads) the child only calls execve.
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.starts_with("OPFUSE_RANK=") || entry.starts_with("OPFUSE_WORLD_SIZE=") ||
        entry.starts_with("OPFUSE_LOCAL_DEVICE=") || entry.starts_with("OPFUSE_BOOTSTRAP_DIR=") ||
        entry.starts_with("OPFUSE_JOB=") || entry.starts_with("GTEST_OUTPUT=")) {
      continue;
    }
    base_env.push_back(entry);
  }
  base_env.insert(base_env.end(), extra_env.begin(), extra_env.end());
  if (std::getenv("NCCL_NVLS_ENABLE") == nullptr) base_env.emplace_back("NCCL_NVLS_ENABLE=0");
  std::vector<std::string> args = {exe, "--gtest_also_run_disabled_tests",
                                   "--gtest_filter=" + child_test};
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::vector<std::string>> envs(size, base_env);
  std::vector<std::vector<char*>> envps(size);
  for (int rank = 0; rank < size; ++rank) {
    envs[rank].push_back("OPFUSE_RANK=" + std::to_string(rank));
    envs[rank].push_back("OPFUSE_WORLD_SIZE=" + std::to_string(size));
    envs[rank].push_back("OPFUSE_LOCAL_DEVICE=" + std::to_string(rank));
    envs[rank].push_back("OPFUSE_BOOTSTRAP_DIR=" + dir);
    envs[rank].push_back("OPFUSE_JOB=" + job);
    envps[rank].reserve(envs[rank].size() + 1);
    for (std::string& e : envs[rank]) envps[rank].push_back(e.data());
    envps[rank].push_back(nullptr);
  }

  std::vector<pid_t> pids(size, -1);
  // Rank 0 last, so that the others wait for its file as a launcher's ranks may.
  for (int rank = size - 1; rank >= 0; --rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execve(argv[0], argv.data(), envps[rank].data());
      ::_exit(127);
    }
    ASSERT_GT(pid, 0) << "fork: " << std::strerror(errno);
    pids[rank] = pid;
  }

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::optional<int>> statuses(size);
  int running = size;
  while (running > 0) {
    for (int rank = 0; rank < size; ++rank) {
      if (statuses[rank]) continue;
      int status = 0;
      if (::waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        statuses[rank] = status;
        --running;
      }
    }
    if (running == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int rank = 0; rank < size; ++rank) {
        if (statuses[rank]) continue;
        ADD_FAILURE() << "rank " << rank << " still running after " << timeout.count()
                      << " s: killed (a hang in NCCL init or a collective; see its output)";
        ::kill(pids[rank], SIGKILL);
        int status = 0;
        ::waitpid(pids[rank], &status, 0);
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int rank = 0; rank < size; ++rank) {
    const int status = *statuses[rank];
    if (WIFEXITED(status)) {
      EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << rank << " failed; its output is above";
    } else {
      ADD_FAILURE() << "rank " << rank << " ended by signal "
                    << (WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    }
  }
}

}  // namespace opfuse::test
