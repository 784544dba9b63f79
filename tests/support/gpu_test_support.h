// Helpers shared by the GPU test programs (tests/gpu): a .fuse program compiled and loaded on the
// current device, test-owned device memory, and bf16 values moved between host and device. Only
// the GPU tests link this (it needs the CUDA runtime); the CPU tests use test_support.h alone.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codegen/plan.h"
#include "driver/compile.h"
#include "gpu/plan_executor.h"
#include "ir/graph.h"
#include "jit/nvrtc_compiler.h"
#include "reference/reference_executor.h"
#include "support/source_manager.h"

// Fails the current test (and returns from it) when a CUDA call does not succeed, naming it.
#define OPFUSE_TEST_CUDA_OK(call)                                                  \
  do {                                                                             \
    const cudaError_t status = (call);                                             \
    ASSERT_EQ(status, cudaSuccess) << #call << ": " << cudaGetErrorString(status); \
  } while (false)

namespace opfuse::debug {
struct Routing;
}

namespace opfuse::test {

// A program through the passes and codegen, its kernels compiled for the current GPU and loaded.
// Held by pointer: the plan refers to `sources`, so it must not move.
struct CompiledProgram {
  SourceManager sources;
  ir::Program program;
  codegen::Plan plan;
  std::unique_ptr<gpu::PlanModules> modules;
};

// Compiles `text` as the file `<name>.fuse`. A non-empty `recipe_override` (a declared recipe or
// "bf16") replaces every sequence's own `uses`. Kernels go through the disk cache in
// `kernel_cache_dir`, or, when it is empty, through one temporary cache this process shares.
// Returns nullptr (and fails the current test with the diagnostics) when the text does not load.
// A non-null `debug_routing` compiles that plan variant (compiler/debug_config/instrument.h).
std::unique_ptr<CompiledProgram> compile_program(const std::string& name, const std::string& text,
                                                 const std::string& recipe_override = "",
                                                 const std::string& kernel_cache_dir = "",
                                                 const debug::Routing* debug_routing = nullptr);
// The same with the driver's `options` as given (their arch replaced by the current GPU's), e.g.
// CompileOptions::emulate_block_scaling.
std::unique_ptr<CompiledProgram> compile_program_with(const std::string& name,
                                                      const std::string& text,
                                                      driver::CompileOptions options,
                                                      const std::string& kernel_cache_dir = "");

// Kernel templates (templates/) instantiated through NVRTC for the current GPU and loaded: the
// kernel of every name expression, in order, and the program's compile result (its ptxas figures:
// registers, spills). The library stays loaded until the process ends. When NVRTC or the load
// fails, the current test fails and the kernels are nullptr.
struct TemplateKernels {
  jit::CompiledKernel compiled;
  std::vector<cudaKernel_t> kernels;
};
TemplateKernels load_template_kernels(const std::string& source,
                                      const std::vector<std::string>& name_expressions);

// Device memory owned by the test (plain cudaMalloc: the test may synchronize). Never smaller
// than 16 bytes, so even an empty tensor has an aligned address.
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t bytes);
  ~DeviceArray();
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A test with a non-blocking stream of its own, skipped (saying why) where no GPU is present.
class GpuStreamTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // Device memory that lives until the test ends.
  DeviceArray& new_array(std::size_t bytes);
  // Device memory of its size for every tensor `gpu` names but its results (inputs, parameters,
  // output gradients), set on `gpu`; by tensor name.
  std::map<std::string, DeviceArray*> allocate_tensors(gpu::SequenceExecutor& gpu);
  // Sets every byte of `array` to `byte` on the test's stream (an output poisoned before a kernel
  // writes it, so a byte not written shows).
  void fill_bytes(const DeviceArray& array, std::uint8_t byte);

  cudaStream_t stream_ = nullptr;

 private:
  std::vector<std::unique_ptr<DeviceArray>> arrays_;
};

// Copies bf16 bits (or values, rounded to bf16 to nearest even) into the whole of `array`; fails
// the current test when the sizes differ.
void upload_bf16_bits(const DeviceArray& array, const std::vector<std::uint16_t>& bits);
void upload_bf16(const DeviceArray& array, const std::vector<float>& values);

// Values into the whole of `array` as `dtype` holds them: bf16 (rounded to nearest even) or fp32
// (as they are); fails the current test for another dtype or when the sizes differ.
void upload_values(const DeviceArray& array, const std::vector<float>& values, plan::DType dtype);

// Copies `bytes` bytes from `host` to the start of `array` (at most its size), then waits for the
// device.
void upload_bytes(const DeviceArray& array, const void* host, std::size_t bytes);

// The first `bytes` bytes (`count` bf16 elements) at `device`, after the whole device finished.
std::vector<std::uint8_t> download_bytes(const void* device, std::size_t bytes);
// Every byte of `a` equal to `b`'s (the same size), after the whole device finished; otherwise a
// test failure naming `what`, how many bytes differ and the first of them.
void expect_same_bytes(const DeviceArray& a, const DeviceArray& b, const char* what);
// How many bytes of `array` are not `byte` (one filled with it and never written has none).
std::size_t bytes_other_than(const DeviceArray& array, std::uint8_t byte);
std::vector<std::uint16_t> download_bf16_bits(const void* device, std::size_t count);
std::vector<float> download_bf16(const void* device, std::size_t count);
// `count` bf16 or fp32 elements at `device` as floats (another dtype fails the current test).
std::vector<float> download_values(const void* device, std::size_t count, plan::DType dtype);

// N(mean, stddev) values already rounded to bf16, so a GPU run and the CPU reference see the same
// numbers. The draws (std::normal_distribution<double> over `rng`) are part of the tests' inputs:
// changing them changes every test's numbers.
std::vector<float> random_bf16(std::size_t count, double stddev, std::mt19937_64& rng,
                               double mean = 0.0);

// The same random bf16 values for every parameter of `ref` and in its array of `arrays`
// (stddev 0.05 for matrices, 0.1 for vectors, drawn in ref.param_names() order), then
// ref.params_changed().
void random_params(cpu::ReferenceExecutor<float>& ref,
                   const std::map<std::string, DeviceArray*>& arrays, std::mt19937_64& rng);

// Runs `size` ranks of a tensor-parallel test, one process per GPU (0..size-1): fork + exec of
// this test program running only `child_test` (a DISABLED_ test), with the launcher's variables
// (OPFUSE_RANK, OPFUSE_WORLD_SIZE, OPFUSE_LOCAL_DEVICE, OPFUSE_BOOTSTRAP_DIR = dir, OPFUSE_JOB =
// job), `extra_env` ("NAME=VALUE") and NCCL_NVLS_ENABLE=0 unless set. Rank 0 starts last, so the
// others wait for its id file. Fails the current test for every rank that does not exit with 0
// within `timeout` (killing it then).
void run_ranks(int size, const std::string& child_test, const std::string& dir,
               const std::string& job, const std::vector<std::string>& extra_env,
               std::chrono::seconds timeout);

}  // namespace opfuse::test
