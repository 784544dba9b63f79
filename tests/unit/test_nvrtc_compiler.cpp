// NVRTC compilation: cubins per arch, PTX, lowered names, ptxas usage, errors, parallel builds,
// and where the CUDA headers and templates are found. Needs NVRTC, not a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "jit/cuda_paths.h"
#include "jit/nvrtc_compiler.h"
#include "test_support.h"

namespace opfuse::jit {
namespace {

namespace fs = std::filesystem;

// A small FP8 cast kernel template, like the real templates/ ones: scales with IEEE math, amax.
constexpr const char* kCastTemplate = R"(#pragma once
#include <cuda_fp8.h>
#include <cuda_bf16.h>

namespace opfuse_test {

template <typename InputT, typename OutputT, int kVectorSize>
__global__ void cast_to_fp8(const InputT* __restrict__ input, OutputT* __restrict__ output,
                            const float* __restrict__ scale, float* __restrict__ amax, int n) {
  const float s = *scale;
  float local_amax = 0.0f;
  const int base = (blockIdx.x * blockDim.x + threadIdx.x) * kVectorSize;
#pragma unroll
  for (int k = 0; k < kVectorSize; ++k) {
    if (base + k < n) {
      const float x = static_cast<float>(input[base + k]);
      local_amax = fmaxf(local_amax, fabsf(x));
      output[base + k] = OutputT(x * s);
    }
  }
  atomicMax(reinterpret_cast<int*>(amax), __float_as_int(local_amax));
}

}  // namespace opfuse_test
)";

// Points OPFUSE_TEMPLATES_DIR at a directory holding the template above before any compile,
// since the JIT discovers its paths once per process.
class TestTemplatesEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    templates_dir() = test::make_temp_dir("nvrtc-templates");
    fs::create_directories(templates_dir() + "/test_cast");
    std::ofstream(templates_dir() + "/test_cast/fp8_cast.cuh") << kCastTemplate;
    setenv("OPFUSE_TEMPLATES_DIR", templates_dir().c_str(), 1);
  }
  static std::string& templates_dir() {
    static std::string dir;
    return dir;
  }
};
const auto* const kTemplatesEnvironment =
    ::testing::AddGlobalTestEnvironment(new TestTemplatesEnvironment);

CompileRequest cast_request(const std::string& arch,
                            const std::string& input_type = "__nv_bfloat16",
                            const std::string& output_type = "__nv_fp8_e4m3", int vector_size = 4) {
  CompileRequest request;
  request.kernel_name = "cast_" + arch;
  request.source = "#include \"test_cast/fp8_cast.cuh\"\n";
  request.name_expressions = {"opfuse_test::cast_to_fp8<" + input_type + ", " + output_type + ", " +
                              std::to_string(vector_size) + ">"};
  request.arch = arch;
  return request;
}

bool is_elf(const std::vector<char>& binary) {
  return binary.size() > 20 && std::string(binary.data(), 4) ==
                                   "\x7f"
                                   "ELF";
}

// e_machine of an ELF64 header, little-endian at offset 18; EM_CUDA is 190.
int elf_machine(const std::vector<char>& binary) {
  return static_cast<unsigned char>(binary[18]) | (static_cast<unsigned char>(binary[19]) << 8);
}

TEST(NvrtcCompiler, CompilesCubinForEachSupportedArch) {
  std::vector<std::vector<char>> cubins;
  for (const std::string arch : {"sm_89", "sm_90a", "sm_100a"}) {
    SCOPED_TRACE(arch);
    const CompiledKernel kernel = compile_kernel(cast_request(arch));
    EXPECT_FALSE(kernel.is_ptx);
    EXPECT_EQ(kernel.arch, arch);
    ASSERT_TRUE(is_elf(kernel.binary));
    EXPECT_EQ(elf_machine(kernel.binary), 190);
    EXPECT_GT(kernel.registers, 0);
    EXPECT_EQ(kernel.spill_store_bytes, 0);
    EXPECT_EQ(kernel.spill_load_bytes, 0);
    EXPECT_EQ(kernel.stack_bytes, 0);
    EXPECT_NE(kernel.log.find("Compiling entry function"), std::string::npos) << kernel.log;
    EXPECT_FALSE(kernel.cache_hit);
    EXPECT_GT(kernel.compile_ms, 0.0);
    cubins.push_back(kernel.binary);
  }
  EXPECT_FALSE(cubins[0] == cubins[1]);
  EXPECT_FALSE(cubins[1] == cubins[2]);
}

TEST(NvrtcCompiler, ComputeArchGivesPtxText) {
  const CompiledKernel kernel = compile_kernel(cast_request("compute_90"));
  EXPECT_TRUE(kernel.is_ptx);
  ASSERT_FALSE(kernel.binary.empty());
  EXPECT_EQ(kernel.binary.back(), '\0');  // loaders need NUL-terminated PTX
  const std::string ptx(kernel.binary.data());
  EXPECT_NE(ptx.find(".version "), std::string::npos);
  EXPECT_NE(ptx.find(".target sm_90"), std::string::npos);
  EXPECT_NE(ptx.find(kernel.lowered_names.begin()->second), std::string::npos);
  EXPECT_EQ(kernel.registers, -1);  // no ptxas run for PTX
  EXPECT_EQ(kernel.stack_bytes, -1);
  EXPECT_EQ(kernel.spill_store_bytes, -1);
}

TEST(NvrtcCompiler, AutomaticPchLeavesTheOutputUnchanged) {
  // PCH is outside the cache key, so it must not change a byte (see note "Automatic PCH").
  CompileRequest request = cast_request("sm_90a", "__half", "__nv_fp8_e4m3", 2);
  request.source = "#include <cuda_fp16.h>\n" + request.source;
  const CompiledKernel creates_pch = compile_kernel(request);
  const CompiledKernel uses_pch = compile_kernel(request);
  setenv("OPFUSE_NVRTC_PCH", "0", 1);
  const CompiledKernel without_pch = compile_kernel(request);
  unsetenv("OPFUSE_NVRTC_PCH");
  EXPECT_TRUE(creates_pch.binary == without_pch.binary);
  EXPECT_TRUE(uses_pch.binary == without_pch.binary);
  EXPECT_EQ(uses_pch.registers, without_pch.registers);
  EXPECT_EQ(uses_pch.log.find("precompiled header"), std::string::npos) << uses_pch.log;
}

TEST(NvrtcCompiler, NameExpressionsGetDistinctMangledNames) {
  CompileRequest request = cast_request("sm_90a");
  request.name_expressions = {"opfuse_test::cast_to_fp8<__nv_bfloat16, __nv_fp8_e4m3, 4>",
                              "opfuse_test::cast_to_fp8<float, __nv_fp8_e5m2, 8>"};
  const CompiledKernel kernel = compile_kernel(request);
  ASSERT_EQ(kernel.lowered_names.size(), 2u);
  const std::string& bf16_name = kernel.lowered_names.at(request.name_expressions[0]);
  const std::string& float_name = kernel.lowered_names.at(request.name_expressions[1]);
  EXPECT_EQ(bf16_name.rfind("_ZN11opfuse_test11cast_to_fp8I", 0), 0u) << bf16_name;
  EXPECT_NE(bf16_name.find("__nv_bfloat16"), std::string::npos) << bf16_name;
  EXPECT_NE(float_name.find("__nv_fp8_e5m2"), std::string::npos) << float_name;
  EXPECT_NE(bf16_name, float_name);
  // Both instantiations are in the cubin's symbol table.
  const std::string cubin(kernel.binary.begin(), kernel.binary.end());
  EXPECT_NE(cubin.find(bf16_name), std::string::npos);
  EXPECT_NE(cubin.find(float_name), std::string::npos);
}

TEST(NvrtcCompiler, RegisterCountGrowsWithWork) {
  // A wider vector keeps more values live; the parsed count must follow ptxas, not be a constant.
  const CompiledKernel narrow = compile_kernel(cast_request("sm_90a", "float", "__nv_fp8_e4m3", 1));
  const CompiledKernel wide = compile_kernel(cast_request("sm_90a", "float", "__nv_fp8_e4m3", 16));
  EXPECT_GT(narrow.registers, 0);
  EXPECT_GT(wide.registers, narrow.registers);
}

TEST(NvrtcCompiler, SyntaxErrorThrowsJitErrorNamingKernelAndLine) {
  CompileRequest request;
  request.kernel_name = "broken_norm";
  request.source = "__global__ void k(float* x) {\n  x[0] = 1.0f\n}\n";
  request.name_expressions = {"k"};
  try {
    compile_kernel(request);
    FAIL() << "expected JitError";
  } catch (const JitError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.rfind("failed to compile kernel 'broken_norm' for sm_90a:", 0), 0u)
        << message;
    EXPECT_NE(message.find("broken_norm.cu(3): error: expected a \";\""), std::string::npos)
        << message;
  }
}

TEST(NvrtcCompiler, MissingIncludeNamesTheHeaderAndTheSearchPath) {
  CompileRequest request;
  request.kernel_name = "needs_header";
  request.source = "#include \"norms/not_there.cuh\"\n__global__ void k() {}\n";
  try {
    compile_kernel(request);
    FAIL() << "expected JitError";
  } catch (const JitError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.rfind("failed to compile kernel 'needs_header' for sm_90a:", 0), 0u);
    EXPECT_NE(message.find("cannot open source file \"norms/not_there.cuh\""), std::string::npos)
        << message;
    EXPECT_NE(message.find("hint: the include path was:"), std::string::npos) << message;
    EXPECT_NE(message.find(TestTemplatesEnvironment::templates_dir()), std::string::npos)
        << message;
    EXPECT_NE(message.find("OPFUSE_TEMPLATES_DIR"), std::string::npos) << message;
  }
}

TEST(NvrtcCompiler, UnknownNameExpressionIsAnError) {
  CompileRequest request = cast_request("sm_90a");
  request.name_expressions = {"opfuse_test::no_such_kernel<float>"};
  try {
    compile_kernel(request);
    FAIL() << "expected JitError";
  } catch (const JitError& error) {
    EXPECT_NE(std::string(error.what()).find("has no member \"no_such_kernel\""), std::string::npos)
        << error.what();
  }
}

TEST(NvrtcCompiler, MalformedArchIsRejectedWithTheAcceptedForms) {
  try {
    compile_kernel(cast_request("hopper"));
    FAIL() << "expected JitError";
  } catch (const JitError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.rfind("failed to compile kernel 'cast_hopper' for hopper:", 0), 0u);
    EXPECT_NE(message.find("sm_90a"), std::string::npos) << message;
    EXPECT_NE(message.find("compute_XX"), std::string::npos) << message;
  }
}

TEST(NvrtcCompiler, OptionsAreIeeeCpp17WithIncludeDirsAndExtrasLast) {
  CompileRequest request = cast_request("sm_90a");
  request.extra_options = {"-DOPFUSE_EXTRA=1"};
  const std::vector<std::string> options = nvrtc_options(request);
  const auto has = [&](const std::string& option) {
    return std::find(options.begin(), options.end(), option) != options.end();
  };
  EXPECT_TRUE(has("--gpu-architecture=sm_90a"));
  EXPECT_TRUE(has("-std=c++17"));
  EXPECT_TRUE(has("-default-device"));
  EXPECT_TRUE(has("-lineinfo"));
  EXPECT_TRUE(has("-Xptxas=-v"));
  EXPECT_TRUE(has("--no-cache"));  // NVRTC's cache would drop the ptxas -v lines on a hit
  EXPECT_TRUE(has("-I" + TestTemplatesEnvironment::templates_dir()));
  const JitPaths paths = find_jit_paths();
  EXPECT_TRUE(has("-I" + paths.cuda_include_dir));
  if (!paths.cccl_include_dir.empty()) {
    EXPECT_TRUE(has("-I" + paths.cccl_include_dir));
  }
  for (const std::string& option : options) {
    EXPECT_EQ(option.find("fast_math"), std::string::npos) << "scales must be IEEE";
  }
  EXPECT_EQ(std::count_if(options.begin(), options.end(),
                          [](const std::string& o) { return o.rfind("-frandom-seed=", 0) == 0; }),
            1);
  EXPECT_EQ(options.back(), "-DOPFUSE_EXTRA=1");
}

std::vector<CompileRequest> six_requests() {
  std::vector<CompileRequest> requests;
  for (const std::string input : {"float", "__nv_bfloat16", "__half"}) {
    for (const std::string output : {"__nv_fp8_e4m3", "__nv_fp8_e5m2"}) {
      CompileRequest request = cast_request("sm_90a", input, output, 4);
      request.source = "#include <cuda_fp16.h>\n" + request.source;
      request.kernel_name = "cast_" + input + "_to_" + output;
      requests.push_back(request);
    }
  }
  return requests;
}

TEST(NvrtcCompiler, ParallelCompileAllEqualsSerialInRequestOrder) {
  const std::vector<CompileRequest> requests = six_requests();
  const CompileAllResult serial = compile_all(requests, nullptr, 1);
  const CompileAllResult parallel = compile_all(requests, nullptr, 4);
  ASSERT_EQ(serial.kernels.size(), 6u);
  ASSERT_EQ(parallel.kernels.size(), 6u);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(requests[i].kernel_name);
    EXPECT_EQ(parallel.kernels[i].kernel_name, requests[i].kernel_name);
    EXPECT_EQ(parallel.kernels[i].lowered_names, serial.kernels[i].lowered_names);
    // Byte-identical: -frandom-seed makes NVRTC's internal symbol names reproducible.
    EXPECT_TRUE(parallel.kernels[i].binary == serial.kernels[i].binary);
    // Read from the cubin (note "Usage sources"): a recompile's log may lack ptxas -v lines.
    EXPECT_GT(parallel.kernels[i].registers, 0);
    EXPECT_EQ(parallel.kernels[i].registers, serial.kernels[i].registers);
    EXPECT_EQ(parallel.kernels[i].stack_bytes, 0);
    EXPECT_EQ(parallel.kernels[i].spill_store_bytes, 0);
    EXPECT_EQ(parallel.kernels[i].spill_load_bytes, 0);
    EXPECT_GT(parallel.stats.kernel_ms[i], 0.0);
  }
  // Different instantiations really are different kernels.
  EXPECT_FALSE(parallel.kernels[0].binary == parallel.kernels[1].binary);
  EXPECT_EQ(parallel.stats.misses, 6);
  EXPECT_EQ(parallel.stats.hits, 0);
}

TEST(NvrtcCompiler, CompileAllReportsTheFirstFailureAndCountsTheOthers) {
  std::vector<CompileRequest> requests = six_requests();
  requests[1].source += "\nthis is not cuda;\n";
  requests[1].kernel_name = "first_bad";
  requests[4].source += "\nneither is this;\n";
  requests[4].kernel_name = "second_bad";
  try {
    compile_all(requests, nullptr, 3);
    FAIL() << "expected JitError";
  } catch (const JitError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.rfind("failed to compile kernel 'first_bad' for sm_90a:", 0), 0u) << message;
    EXPECT_NE(message.find("(1 more kernels failed to compile: 'second_bad')"), std::string::npos)
        << message;
  }
}

// --- path discovery -----------------------------------------------------------------------------

JitPathInputs inputs_with_default_root(const std::string& root) {
  JitPathInputs inputs;
  inputs.default_cuda_root = root;
  return inputs;
}

TEST(JitPaths, FallsBackPastAnInvalidCudaHome) {
  const JitPaths real = find_jit_paths();
  JitPathInputs inputs = inputs_with_default_root(real.cuda_root);
  inputs.cuda_home = test::make_temp_dir("not-cuda");
  const JitPaths paths = find_jit_paths(inputs);
  EXPECT_EQ(paths.cuda_root, real.cuda_root);
  EXPECT_EQ(paths.cuda_include_dir, real.cuda_root + "/include");
}

TEST(JitPaths, CudaHomeWinsOverCudaPathAndDefault) {
  const std::string fake_cuda = test::make_temp_dir("fake-cuda");
  fs::create_directories(fake_cuda + "/include/cccl");
  std::ofstream(fake_cuda + "/include/cuda_runtime.h") << "// fake\n";
  JitPathInputs inputs = inputs_with_default_root(find_jit_paths().cuda_root);
  inputs.cuda_home = fake_cuda;
  inputs.cuda_path = "/nonexistent/cuda";
  const JitPaths paths = find_jit_paths(inputs);
  EXPECT_EQ(paths.cuda_root, fake_cuda);
  EXPECT_EQ(paths.cccl_include_dir, fake_cuda + "/include/cccl");
}

TEST(JitPaths, NoToolkitErrorListsEveryPlaceTried) {
  JitPathInputs inputs = inputs_with_default_root("/nonexistent/default-cuda");
  inputs.cuda_home = test::make_temp_dir("empty-cuda-home");
  try {
    find_jit_paths(inputs);
    FAIL() << "expected JitError";
  } catch (const JitError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("CUDA_HOME " + inputs.cuda_home + " (no include/cuda_runtime.h)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("CUDA_PATH (not set)"), std::string::npos) << message;
    EXPECT_NE(message.find("/nonexistent/default-cuda (no such directory)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("Set CUDA_HOME"), std::string::npos) << message;
  }
}

TEST(JitPaths, TemplatesDirPrefersEnvThenSourceThenInstall) {
  const std::string cuda_root = find_jit_paths().cuda_root;
  const std::string source_dir = test::make_temp_dir("source-templates");
  const std::string install_dir = test::make_temp_dir("install-templates");
  JitPathInputs inputs = inputs_with_default_root(cuda_root);
  inputs.source_templates_dir = source_dir;
  inputs.install_templates_dir = install_dir;
  EXPECT_EQ(find_jit_paths(inputs).templates_dir, source_dir);
  inputs.templates_env = install_dir;
  EXPECT_EQ(find_jit_paths(inputs).templates_dir, install_dir);
  inputs.templates_env.clear();
  inputs.source_templates_dir = "/nonexistent/source/templates";
  EXPECT_EQ(find_jit_paths(inputs).templates_dir, install_dir);
  inputs.install_templates_dir = "/nonexistent/install/templates";
  EXPECT_EQ(find_jit_paths(inputs).templates_dir, "");
}

TEST(JitPaths, TemplatesEnvThatIsNotADirectoryIsAnError) {
  JitPathInputs inputs = inputs_with_default_root(find_jit_paths().cuda_root);
  inputs.templates_env = "/nonexistent/opfuse/templates";
  try {
    find_jit_paths(inputs);
    FAIL() << "expected JitError";
  } catch (const JitError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("OPFUSE_TEMPLATES_DIR=/nonexistent/opfuse/templates is not a directory"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace opfuse::jit
