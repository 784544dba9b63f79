// The disk kernel cache: hits without NVRTC, corrupt entries recompiled with a warning, keys that
// follow every input, several processes sharing one directory, and unusable directories.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "jit/kernel_cache.h"
#include "jit/nvrtc_compiler.h"
#include "test_support.h"

namespace opfuse::jit {
namespace {

namespace fs = std::filesystem;

constexpr const char* kScaleTemplate = R"(#pragma once
#include <cuda_fp8.h>
#include <cuda_bf16.h>

namespace opfuse_test {

template <typename InputT, typename OutputT>
__global__ void scale_cast(const InputT* input, OutputT* output, const float* scale, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) output[i] = OutputT(static_cast<float>(input[i]) * *scale);
}

}  // namespace opfuse_test
)";

// The JIT reads OPFUSE_TEMPLATES_DIR once per process, so set it before any test compiles.
class TestTemplatesEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const std::string dir = test::make_temp_dir("cache-templates");
    std::ofstream(dir + "/scale_cast.cuh") << kScaleTemplate;
    setenv("OPFUSE_TEMPLATES_DIR", dir.c_str(), 1);
  }
};
const auto* const kTemplatesEnvironment =
    ::testing::AddGlobalTestEnvironment(new TestTemplatesEnvironment);

CompileRequest scale_request(const std::string& input_type, const std::string& output_type) {
  CompileRequest request;
  request.kernel_name = "scale_" + input_type + "_" + output_type;
  request.source = "#include \"scale_cast.cuh\"\n";
  request.name_expressions = {"opfuse_test::scale_cast<" + input_type + ", " + output_type + ">"};
  return request;
}

// Collects warnings from a KernelCache (which may call from several threads).
struct Warnings {
  std::mutex mutex;
  std::vector<std::string> messages;
  WarningSink sink() {
    return [this](const std::string& message) {
      std::lock_guard lock(mutex);
      messages.push_back(message);
    };
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Every regular file under `dir`, relative to it.
std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_directory()) files.push_back(fs::relative(entry.path(), dir).string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(KernelCache, MissThenHitServesTheSameKernelWithoutCallingNvrtc) {
  const std::string dir = test::make_temp_dir("cache-hit");
  Warnings warnings;
  KernelCache cache(dir, warnings.sink());
  const std::vector<CompileRequest> requests = {scale_request("float", "__nv_fp8_e4m3")};

  const CompileAllResult first = compile_all(requests, &cache, 1);
  EXPECT_EQ(first.stats.misses, 1);
  EXPECT_EQ(first.stats.hits, 0);
  EXPECT_FALSE(first.kernels[0].cache_hit);
  const std::string key = cache_key_for(requests[0]);
  ASSERT_EQ(key.size(), 64u);
  EXPECT_EQ(cache.entry_path(key), dir + "/" + key.substr(0, 2) + "/" + key + ".opfk");
  EXPECT_TRUE(fs::is_regular_file(cache.entry_path(key)));

  const std::uint64_t compiles_before = nvrtc_compile_count();
  const CompileAllResult second = compile_all(requests, &cache, 1);
  EXPECT_EQ(nvrtc_compile_count(), compiles_before);
  EXPECT_EQ(second.stats.hits, 1);
  EXPECT_EQ(second.stats.misses, 0);
  const CompiledKernel& hit = second.kernels[0];
  EXPECT_TRUE(hit.cache_hit);
  EXPECT_TRUE(hit.binary == first.kernels[0].binary);
  EXPECT_EQ(hit.lowered_names, first.kernels[0].lowered_names);
  EXPECT_EQ(hit.registers, first.kernels[0].registers);
  EXPECT_EQ(hit.spill_store_bytes, first.kernels[0].spill_store_bytes);
  EXPECT_EQ(hit.log, first.kernels[0].log);
  EXPECT_EQ(hit.kernel_name, requests[0].kernel_name);
  EXPECT_EQ(hit.arch, "sm_90a");

  // A second cache object on the directory, like a later process, hits as well.
  KernelCache later(dir, warnings.sink());
  EXPECT_TRUE(compile_all(requests, &later, 1).kernels[0].cache_hit);
  EXPECT_EQ(nvrtc_compile_count(), compiles_before);

  const KernelCacheStats stats = cache.stats();
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.stores, 1);
  EXPECT_EQ(stats.corrupt_entries, 0);
  EXPECT_EQ(stats.store_failures, 0);
  EXPECT_TRUE(warnings.messages.empty());
}

TEST(KernelCache, ParallelBuildFillsTheCacheForEveryKernel) {
  const std::string dir = test::make_temp_dir("cache-parallel");
  KernelCache cache(dir);
  std::vector<CompileRequest> requests;
  for (const std::string input : {"float", "__nv_bfloat16"}) {
    for (const std::string output : {"__nv_fp8_e4m3", "__nv_fp8_e5m2"}) {
      requests.push_back(scale_request(input, output));
    }
  }
  const CompileAllResult cold = compile_all(requests, &cache, 4);
  EXPECT_EQ(cold.stats.misses, 4);
  const CompileAllResult warm = compile_all(requests, &cache, 4);
  EXPECT_EQ(warm.stats.hits, 4);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(warm.kernels[i].binary == cold.kernels[i].binary) << requests[i].kernel_name;
  }
  EXPECT_EQ(files_under(dir).size(), 4u);
}

// --- corrupt entries ----------------------------------------------------------------------------

struct Corruption {
  const char* name;
  const char* expected_reason;
};

void PrintTo(const Corruption& corruption, std::ostream* out) { *out << corruption.name; }

class CorruptEntry : public ::testing::TestWithParam<Corruption> {};

TEST_P(CorruptEntry, IsWarnedAboutRecompiledAndReplaced) {
  const std::string dir = test::make_temp_dir("cache-corrupt");
  const CompileRequest request = scale_request("float", "__nv_fp8_e5m2");
  const CompileRequest other = scale_request("__nv_bfloat16", "__nv_fp8_e5m2");
  KernelCache primer(dir);
  const CompiledKernel original = compile_all({request}, &primer, 1).kernels[0];
  compile_all({other}, &primer, 1);
  const std::string path = primer.entry_path(cache_key_for(request));
  std::string bytes = read_bytes(path);
  ASSERT_GT(bytes.size(), 1000u);

  const std::string corruption = GetParam().name;
  if (corruption == "truncated") {
    write_bytes(path, bytes.substr(0, bytes.size() / 2));
  } else if (corruption == "bit_flip") {
    bytes[bytes.size() / 2] ^= 0x10;
    write_bytes(path, bytes);
  } else if (corruption == "other_key") {
    fs::copy_file(primer.entry_path(cache_key_for(other)), path,
                  fs::copy_options::overwrite_existing);
  } else if (corruption == "garbage") {
    write_bytes(path, "this is not a kernel");
  }

  Warnings warnings;
  KernelCache cache(dir, warnings.sink());
  const std::uint64_t compiles_before = nvrtc_compile_count();
  const CompiledKernel recompiled = compile_all({request}, &cache, 1).kernels[0];
  EXPECT_EQ(nvrtc_compile_count(), compiles_before + 1);
  EXPECT_FALSE(recompiled.cache_hit);
  EXPECT_TRUE(recompiled.binary == original.binary);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_EQ(warnings.messages[0].rfind("kernel cache entry " + path + " is corrupt (", 0), 0u)
      << warnings.messages[0];
  EXPECT_NE(warnings.messages[0].find(GetParam().expected_reason), std::string::npos)
      << warnings.messages[0];
  EXPECT_NE(warnings.messages[0].find("); recompiling"), std::string::npos);
  EXPECT_EQ(cache.stats().corrupt_entries, 1);
  EXPECT_EQ(cache.stats().stores, 1);

  // The recompile replaced the bad entry: a fresh cache now hits it, silently.
  Warnings later_warnings;
  KernelCache later(dir, later_warnings.sink());
  const std::optional<CompiledKernel> fixed = later.load(cache_key_for(request));
  ASSERT_TRUE(fixed.has_value());
  EXPECT_TRUE(fixed->binary == original.binary);
  EXPECT_TRUE(later_warnings.messages.empty());
}

INSTANTIATE_TEST_SUITE_P(KernelCache, CorruptEntry,
                         ::testing::Values(Corruption{"truncated", "truncated"},
                                           Corruption{"bit_flip", "checksum mismatch"},
                                           Corruption{"other_key", "it holds the entry for key "},
                                           Corruption{"garbage", "bad magic"}),
                         [](const ::testing::TestParamInfo<Corruption>& info) {
                           return std::string(info.param.name);
                         });

TEST(KernelCache, DefaultWarningGoesToStderrWithOpfusePrefix) {
  const std::string dir = test::make_temp_dir("cache-stderr");
  const CompileRequest request = scale_request("float", "__nv_fp8_e4m3");
  KernelCache primer(dir);
  compile_all({request}, &primer, 1);
  const std::string path = primer.entry_path(cache_key_for(request));
  std::string bytes = read_bytes(path);
  bytes[bytes.size() - 1] ^= 0x01;  // inside the checksum itself
  write_bytes(path, bytes);

  KernelCache cache(dir);
  ::testing::internal::CaptureStderr();
  cache.load(cache_key_for(request));
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed, "opfuse: warning: kernel cache entry " + path +
                         " is corrupt (checksum mismatch); recompiling\n");
}

// --- keys ---------------------------------------------------------------------------------------

KernelCacheKeyInputs base_key_inputs() {
  KernelCacheKeyInputs inputs;
  inputs.source = "__global__ void k() {}";
  inputs.templates_digest = "digest";
  inputs.options = {"-std=c++17", "-lineinfo"};
  inputs.arch = "sm_90a";
  inputs.name_expressions = {"k"};
  inputs.nvrtc_version = "13.0";
  inputs.codegen_version = 1;
  return inputs;
}

TEST(KernelCacheKey, ChangesWithEveryInputButNotOptionOrder) {
  const std::string base = kernel_cache_key(base_key_inputs());
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(kernel_cache_key(base_key_inputs()), base);

  std::vector<KernelCacheKeyInputs> variants(7, base_key_inputs());
  variants[0].source += " ";
  variants[1].templates_digest = "other digest";
  variants[2].options.push_back("-DX=1");
  variants[3].arch = "sm_100a";
  variants[4].name_expressions = {"k2"};
  variants[5].nvrtc_version = "13.1";
  variants[6].codegen_version = 2;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(kernel_cache_key(variants[i]), base) << "variant " << i;
  }

  KernelCacheKeyInputs reordered = base_key_inputs();
  std::reverse(reordered.options.begin(), reordered.options.end());
  EXPECT_EQ(kernel_cache_key(reordered), base);
}

TEST(KernelCacheKey, LengthPrefixesKeepShiftedBoundariesApart) {
  KernelCacheKeyInputs a = base_key_inputs();
  KernelCacheKeyInputs b = base_key_inputs();
  a.source = "ab";
  a.templates_digest = "c";
  b.source = "a";
  b.templates_digest = "bc";
  EXPECT_NE(kernel_cache_key(a), kernel_cache_key(b));
  a.options = {"-DA", "-DB"};
  b.options = {"-DA-DB"};
  EXPECT_NE(kernel_cache_key(a), kernel_cache_key(b));
}

TEST(KernelCacheKey, TemplateContentsNotTimesDecideTheDigest) {
  const std::string dir = test::make_temp_dir("key-templates");
  fs::create_directories(dir + "/norms");
  write_bytes(dir + "/norms/rmsnorm.cuh", "// v1\n");
  write_bytes(dir + "/common.cuh", "// common\n");
  const std::string original = hash_templates_dir(dir);
  EXPECT_EQ(hash_templates_dir(dir), original);

  write_bytes(dir + "/norms/rmsnorm.cuh", "// v2\n");
  const std::string edited = hash_templates_dir(dir);
  EXPECT_NE(edited, original);
  write_bytes(dir + "/norms/rmsnorm.cuh", "// v1\n");  // same bytes, new mtime
  EXPECT_EQ(hash_templates_dir(dir), original);

  fs::rename(dir + "/common.cuh", dir + "/common2.cuh");
  EXPECT_NE(hash_templates_dir(dir), original);
  fs::rename(dir + "/common2.cuh", dir + "/common.cuh");
  write_bytes(dir + "/norms/extra.cuh", "");
  EXPECT_NE(hash_templates_dir(dir), original);
  EXPECT_NE(hash_templates_dir(""), original);

  // And a changed digest changes the kernel's key.
  KernelCacheKeyInputs before = base_key_inputs();
  KernelCacheKeyInputs after = base_key_inputs();
  before.templates_digest = original;
  after.templates_digest = edited;
  EXPECT_NE(kernel_cache_key(before), kernel_cache_key(after));
}

TEST(KernelCacheKey, RequestKeyFollowsArchOptionsAndNameExpressions) {
  const CompileRequest base = scale_request("float", "__nv_fp8_e4m3");
  const std::string key = cache_key_for(base);
  EXPECT_EQ(cache_key_for(base), key);
  CompileRequest renamed = base;
  renamed.kernel_name = "display name only";
  EXPECT_EQ(cache_key_for(renamed), key);
  CompileRequest other_arch = base;
  other_arch.arch = "sm_89";
  EXPECT_NE(cache_key_for(other_arch), key);
  CompileRequest extra_option = base;
  extra_option.extra_options = {"-DOPFUSE_VARIANT=2"};
  EXPECT_NE(cache_key_for(extra_option), key);
  CompileRequest other_name = base;
  other_name.name_expressions = {"opfuse_test::scale_cast<float, __nv_fp8_e5m2>"};
  EXPECT_NE(cache_key_for(other_name), key);
}

// --- several processes --------------------------------------------------------------------------

// Waits for `pid` up to `deadline`; returns its wait status, or kills it and returns -1.
int wait_with_deadline(pid_t pid, std::chrono::steady_clock::time_point deadline) {
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

TEST(KernelCache, FourProcessesBuildingTogetherLeaveExactlyTheValidEntries) {
  const std::string dir = test::make_temp_dir("cache-processes") + "/not-yet-created";
  const std::vector<CompileRequest> requests = {scale_request("float", "__nv_fp8_e4m3"),
                                                scale_request("float", "__nv_fp8_e5m2"),
                                                scale_request("__nv_bfloat16", "__nv_fp8_e4m3")};
  int start_gate[2];
  ASSERT_EQ(pipe(start_gate), 0);
  std::vector<pid_t> children;
  for (int child = 0; child < 4; ++child) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: wait until every sibling exists, build twice (the second build reads entries
      // siblings may still be writing: it must never see a partial one), report through the
      // exit code only (_exit: no gtest output, no atexit handlers removing the parent's temp
      // dirs).
      close(start_gate[1]);
      // NVRTC removes its PCH directory at exit, which _exit skips: no PCH in the children.
      setenv("OPFUSE_NVRTC_PCH", "0", 1);
      char byte;
      (void)!read(start_gate[0], &byte, 1);
      int code = 0;
      try {
        KernelCache cache(dir, [&](const std::string&) { code = 3; });
        for (int round = 0; round < 2; ++round) {
          const CompileAllResult result = compile_all(requests, &cache, 2);
          for (const CompiledKernel& kernel : result.kernels) {
            if (kernel.binary.size() < 4 || kernel.binary[1] != 'E') code = 4;
          }
        }
      } catch (...) {
        code = 5;
      }
      _exit(code);
    }
    children.push_back(pid);
  }
  close(start_gate[0]);
  close(start_gate[1]);  // EOF releases all children at once

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (const pid_t pid : children) {
    const int status = wait_with_deadline(pid, deadline);
    ASSERT_NE(status, -1) << "child " << pid << " did not finish in time";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << pid << " exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }

  std::vector<std::string> expected_files;
  for (const CompileRequest& request : requests) {
    const std::string key = cache_key_for(request);
    expected_files.push_back(key.substr(0, 2) + "/" + key + ".opfk");
  }
  std::sort(expected_files.begin(), expected_files.end());
  EXPECT_EQ(files_under(dir), expected_files);  // no temp files, nothing else

  Warnings warnings;
  KernelCache cache(dir, warnings.sink());
  const std::vector<CompiledKernel> reference = compile_all(requests, nullptr, 1).kernels;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const std::optional<CompiledKernel> entry = cache.load(cache_key_for(requests[i]));
    ASSERT_TRUE(entry.has_value()) << requests[i].kernel_name;
    EXPECT_TRUE(entry->binary == reference[i].binary) << requests[i].kernel_name;
  }
  EXPECT_TRUE(warnings.messages.empty());
}

// --- unusable directories -----------------------------------------------------------------------

std::vector<CompileRequest> two_requests() {
  return {scale_request("float", "__nv_fp8_e4m3"), scale_request("float", "__nv_fp8_e5m2")};
}

void expect_uncached_build_works(KernelCache& cache, const Warnings& warnings) {
  const std::uint64_t compiles_before = nvrtc_compile_count();
  const CompileAllResult first = compile_all(two_requests(), &cache, 1);
  const CompileAllResult second = compile_all(two_requests(), &cache, 1);
  EXPECT_EQ(nvrtc_compile_count(), compiles_before + 4);  // nothing was cached
  EXPECT_EQ(second.stats.hits, 0);
  EXPECT_TRUE(second.kernels[1].binary == first.kernels[1].binary);
  EXPECT_FALSE(cache.writable());
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("continuing without caching kernels"), std::string::npos)
      << warnings.messages[0];
  EXPECT_NE(warnings.messages[0].find("OPFUSE_CACHE_DIR"), std::string::npos);
  EXPECT_EQ(cache.stats().stores, 0);
}

TEST(KernelCache, ReadOnlyDirectoryWarnsOnceAndBuildsUncached) {
  if (geteuid() == 0) {
    GTEST_SKIP() << "running as root, which ignores directory permissions; "
                    "UncreatableDirectory and BlockedShardDirectory cover this path";
  }
  const std::string dir = test::make_temp_dir("cache-readonly");
  ASSERT_EQ(chmod(dir.c_str(), 0555), 0);
  Warnings warnings;
  KernelCache cache(dir, warnings.sink());
  expect_uncached_build_works(cache, warnings);
  EXPECT_EQ(cache.stats().store_failures, 1);
  EXPECT_NE(warnings.messages[0].find("Permission denied"), std::string::npos)
      << warnings.messages[0];
}

TEST(KernelCache, UncreatableDirectoryWarnsOnceAndBuildsUncached) {
  // A path below a regular file can never be created, whoever runs the test.
  const std::string file = test::make_temp_dir("cache-uncreatable") + "/plain-file";
  write_bytes(file, "x");
  const std::string dir = file + "/opfuse";
  Warnings warnings;
  KernelCache cache(dir, warnings.sink());
  expect_uncached_build_works(cache, warnings);
  EXPECT_NE(warnings.messages[0].find(dir + " cannot be created"), std::string::npos)
      << warnings.messages[0];
}

TEST(KernelCache, BlockedShardDirectoryCountsOneStoreFailureAndWarnsOnce) {
  // The shard subdirectory of the first kernel's key is a file, so its write fails mid-build.
  const std::string dir = test::make_temp_dir("cache-blocked");
  const std::string key = cache_key_for(two_requests()[0]);
  write_bytes(dir + "/" + key.substr(0, 2), "in the way");
  Warnings warnings;
  KernelCache cache(dir, warnings.sink());
  expect_uncached_build_works(cache, warnings);
  EXPECT_EQ(cache.stats().store_failures, 1);
  EXPECT_EQ(files_under(dir), std::vector<std::string>{key.substr(0, 2)});  // no temp files left
}

// --- default directory --------------------------------------------------------------------------

// Sets or unsets environment variables for one scope, restoring them afterwards.
class ScopedEnvironment {
 public:
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->was_set) {
        setenv(it->name.c_str(), it->value.c_str(), 1);
      } else {
        unsetenv(it->name.c_str());
      }
    }
  }

 private:
  struct Saved {
    std::string name;
    bool was_set;
    std::string value;
  };
  std::vector<Saved> saved_;
};

TEST(KernelCache, DefaultDirectoryFollowsOpfuseThenXdgThenHome) {
  ScopedEnvironment environment;
  environment.set("OPFUSE_CACHE_DIR", "/srv/opfuse-cache");
  environment.set("XDG_CACHE_HOME", "/xdg/cache");
  environment.set("HOME", "/home/someone");
  EXPECT_EQ(KernelCache::default_directory(), "/srv/opfuse-cache");
  environment.set("OPFUSE_CACHE_DIR", nullptr);
  EXPECT_EQ(KernelCache::default_directory(), "/xdg/cache/opfuse");
  environment.set("XDG_CACHE_HOME", "relative/ignored");
  EXPECT_EQ(KernelCache::default_directory(), "/home/someone/.cache/opfuse");
  environment.set("XDG_CACHE_HOME", nullptr);
  EXPECT_EQ(KernelCache::default_directory(), "/home/someone/.cache/opfuse");
  environment.set("HOME", nullptr);
  EXPECT_EQ(KernelCache::default_directory(), "");
}

}  // namespace
}  // namespace opfuse::jit
