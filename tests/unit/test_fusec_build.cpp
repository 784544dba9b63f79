// `fusec build` and `fusec dump-kernels` as a user runs them: the files they write, the kernel
// cache (all hits the second time, corrupt entries recompiled with a warning, four builds sharing
// one cache directory at once, a read-only cache directory), NVRTC failures and user errors.
// Each test uses its own cache directory (OPFUSE_CACHE_DIR). Needs NVRTC, not a GPU; a cold mlp
// build compiles 10 kernels, 2 of them inference variants (~2-3 s on 2 shared cores).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_support.h"

namespace opfuse {
namespace {

using test::contains;
using test::count;
using test::shell_quoted;

namespace fs = std::filesystem;

std::string example(const std::string& name) {
  return shell_quoted(test::source_path("dsl_examples/" + name + ".fuse"));
}

// `fusec ARGS` with OPFUSE_CACHE_DIR=cache (and extra environment assignments).
test::CommandResult fusec(const std::string& cache, const std::string& args,
                          const std::string& env = "") {
  return test::run_command("OPFUSE_CACHE_DIR=" + shell_quoted(cache) + " " + env + " " +
                           test::fusec_path() + " " + args);
}

// Every regular file under `dir` by relative path, with its bytes.
std::map<std::string, std::string> files_under(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file())
      files[fs::relative(e.path(), dir).generic_string()] = test::read_text(e.path().string());
  }
  return files;
}

// Outputs that do not depend on timing (report.txt holds times).
std::map<std::string, std::string> stable_outputs(const std::string& dir) {
  auto files = files_under(dir);
  files.erase("report.txt");
  return files;
}

std::vector<std::string> cache_entries(const std::string& cache) {
  std::vector<std::string> entries;
  for (const auto& e : fs::recursive_directory_iterator(cache))
    if (e.is_regular_file() && e.path().extension() == ".opfk") entries.push_back(e.path());
  std::sort(entries.begin(), entries.end());
  return entries;
}

struct Build {
  std::string cache;
  std::string out;
  test::CommandResult result;
};

Build build_mlp(const std::string& tag) {
  Build b;
  b.cache = test::make_temp_dir(tag + "-cache");
  b.out = test::make_temp_dir(tag + "-out") + "/build";
  b.result = fusec(b.cache, "build " + example("mlp") + " -o " + shell_quoted(b.out));
  return b;
}

TEST(FusecBuild, WritesPlanKernelSourcesCubinsAndAReport) {
  const Build b = build_mlp("writes");
  ASSERT_EQ(b.result.exit_code, 0) << b.result.output;
  EXPECT_TRUE(contains(b.result.output,
                       "fusec: built mlp.fuse for sm_90a: 10 kernels (10 compiled, "
                       "0 from the cache)"))
      << b.result.output;
  EXPECT_FALSE(contains(b.result.output, "compiling")) << "no progress line when not a terminal";
  // plan.json is the plan codegen's golden holds.
  const std::string plan_text = test::read_text(b.out + "/plan.json");
  EXPECT_TRUE(plan_text == test::read_text(test::source_path("tests/golden/codegen/mlp/plan.json")))
      << "build's plan.json differs from tests/golden/codegen/mlp/plan.json";
  const auto plan = nlohmann::json::parse(plan_text);
  ASSERT_EQ(plan["kernels"].size(), 10u);
  const std::string report = test::read_text(b.out + "/report.txt");
  EXPECT_TRUE(contains(report, "cache: 0 hits, 10 misses")) << report;
  for (const auto& kernel : plan["kernels"]) {
    const std::string id = kernel["id"];
    const std::string source = test::read_text(b.out + "/kernels/" + id + ".cu");
    EXPECT_TRUE(source == test::read_text(
                              test::source_path("tests/golden/codegen/mlp/kernels/" + id + ".cu")))
        << id;
    const std::string cubin = test::read_text(b.out + "/kernels/" + id + ".cubin");
    ASSERT_GE(cubin.size(), 4u) << id;
    EXPECT_EQ(cubin.substr(0, 4),
              "\x7f"
              "ELF")
        << id << ".cubin is not an ELF cubin";
    EXPECT_TRUE(contains(report, id)) << id;
  }
  // The report names the fused ops with their lines.
  EXPECT_TRUE(contains(report,
                       "fused norm_cast: layernorm \"layernorm_0\" (mlp.fuse:14), "
                       "cast_fp8 \"fc1.input\" (mlp.fuse:15)"))
      << report;
}

TEST(FusecBuild, SecondBuildIsAllCacheHitsWithIdenticalOutputs) {
  const Build first = build_mlp("warm");
  ASSERT_EQ(first.result.exit_code, 0) << first.result.output;
  const std::string again = fs::path(first.out).parent_path().string() + "/again";
  const auto second = fusec(first.cache, "build " + example("mlp") + " -o " + shell_quoted(again));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_TRUE(contains(second.output, "(0 compiled, 10 from the cache)")) << second.output;
  EXPECT_FALSE(contains(second.output, "warning")) << second.output;
  EXPECT_TRUE(contains(test::read_text(again + "/report.txt"), "cache: 10 hits, 0 misses"));
  EXPECT_TRUE(stable_outputs(first.out) == stable_outputs(again));
}

TEST(FusecBuild, BitFlippedAndTruncatedCacheEntriesAreRecompiledWithAWarning) {
  const Build first = build_mlp("corrupt");
  ASSERT_EQ(first.result.exit_code, 0) << first.result.output;
  const auto entries = cache_entries(first.cache);
  ASSERT_EQ(entries.size(), 10u);
  {
    std::string bytes = test::read_text(entries[0]);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
    std::ofstream(entries[0], std::ios::binary | std::ios::trunc) << bytes;
  }
  fs::resize_file(entries[1], fs::file_size(entries[1]) / 2);
  const std::string again = fs::path(first.out).parent_path().string() + "/again";
  const auto second = fusec(first.cache, "build " + example("mlp") + " -o " + shell_quoted(again));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(count(second.output, "warning: kernel cache entry"), 2u) << second.output;
  EXPECT_TRUE(contains(second.output, "checksum mismatch")) << second.output;
  EXPECT_TRUE(contains(second.output, "truncated")) << second.output;
  EXPECT_TRUE(contains(second.output, "(2 compiled, 8 from the cache)")) << second.output;
  EXPECT_TRUE(stable_outputs(first.out) == stable_outputs(again));
  // The recompiled kernels replaced the bad entries: a third build hits everywhere.
  const auto third = fusec(first.cache, "build " + example("mlp") + " -o " + shell_quoted(again));
  EXPECT_TRUE(contains(third.output, "(0 compiled, 10 from the cache)")) << third.output;
}

TEST(FusecBuild, FourConcurrentBuildsIntoOneCacheAllSucceedWithIdenticalOutputs) {
  const std::string cache = test::make_temp_dir("concurrent-cache");
  const std::string dir = test::make_temp_dir("concurrent-out");
  std::string script;
  for (int i = 0; i < 4; ++i) {
    const std::string out = dir + "/" + std::to_string(i);
    script += "(OPFUSE_CACHE_DIR=" + shell_quoted(cache) + " " + test::fusec_path() + " build " +
              example("mlp") + " -o " + shell_quoted(out) + " > " + shell_quoted(out + ".log") +
              " 2>&1; echo $? > " + shell_quoted(out + ".rc") + ") & ";
  }
  const auto result = test::run_command(script + "wait");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto reference = stable_outputs(dir + "/0");
  ASSERT_EQ(reference.size(), 2u + 2 * 10) << "plan.json, kernels.json, 10 .cu and 10 .cubin";
  for (int i = 0; i < 4; ++i) {
    const std::string out = dir + "/" + std::to_string(i);
    EXPECT_EQ(test::read_text(out + ".rc"), "0\n") << test::read_text(out + ".log");
    EXPECT_FALSE(contains(test::read_text(out + ".log"), "warning")) << out;
    EXPECT_TRUE(stable_outputs(out) == reference) << out << " differs from build 0";
  }
  EXPECT_EQ(cache_entries(cache).size(), 10u);
}

TEST(FusecBuild, ReadOnlyCacheDirectoryBuildsWithOneWarning) {
  const std::string cache = test::make_temp_dir("readonly-cache");
  // Root ignores directory permissions, so every shard directory name is also taken by a file:
  // no entry can be written either way.
  for (int i = 0; i < 256; ++i) {
    static const char* kHex = "0123456789abcdef";
    std::ofstream(cache + "/" + kHex[i / 16] + kHex[i % 16]) << "not a directory";
  }
  ASSERT_EQ(::chmod(cache.c_str(), 0555), 0);
  const std::string out = test::make_temp_dir("readonly-out") + "/build";
  const auto result = fusec(cache, "build " + example("mlp") + " -o " + shell_quoted(out));
  ::chmod(cache.c_str(), 0755);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(count(result.output, "warning"), 1u) << result.output;
  EXPECT_TRUE(contains(result.output, "continuing without caching kernels")) << result.output;
  EXPECT_EQ(stable_outputs(out).size(), 2u + 2 * 10);
  EXPECT_TRUE(cache_entries(cache).empty());
}

TEST(FusecBuild, NvrtcFailureNamesTheKernelShowsTheLogAndExitsOne) {
  // A copy of the templates whose norm header does not compile.
  const std::string templates = test::make_temp_dir("broken-templates") + "/templates";
  fs::copy(test::source_path("templates"), templates, fs::copy_options::recursive);
  std::ofstream(templates + "/norm.cuh", std::ios::app) << "\n#error broken on purpose\n";
  const std::string cache = test::make_temp_dir("broken-cache");
  const std::string out = test::make_temp_dir("broken-out") + "/build";
  const auto result = fusec(cache, "build " + example("mlp") + " -o " + shell_quoted(out),
                            "OPFUSE_TEMPLATES_DIR=" + shell_quoted(templates));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(contains(result.output, "failed to compile kernel 'layernorm_fwd_bf16_e4m3_4096_t'"))
      << result.output;
  EXPECT_TRUE(contains(result.output, "broken on purpose")) << "the NVRTC log:\n" << result.output;
  EXPECT_FALSE(contains(result.output, "kernel 'cast_transpose_bf16_e4m3_t'")) << result.output;
  EXPECT_FALSE(fs::exists(out + "/plan.json"));
  EXPECT_FALSE(fs::exists(out + "/kernels.json"));
}

TEST(FusecBuild, AShapeNoKernelCanRunIsAUserErrorAtItsLine) {
  const std::string dir = test::make_temp_dir("no-kernel");
  std::ofstream(dir + "/scaled.fuse") << "sequence s(x: bf16[t, 12]) -> (y: bf16[t, 12]) {\n"
                                         "  identity()\n"
                                         "  constant_scale(0.5)\n"
                                         "}\n";
  const auto result = fusec(dir + "/cache", "build " + shell_quoted(dir + "/scaled.fuse") + " -o " +
                                                shell_quoted(dir + "/out"));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(contains(result.output,
                       "scaled.fuse:3:3: error: 'constant_scale' (constant_scale_0): the "
                       "constant_scale kernel reads 16-byte vectors of bf16 (8 elements), but the "
                       "row width 12 is not a multiple of 8"))
      << result.output;
}

TEST(FusecBuild, SequenceOptionBuildsOneSequenceAndStaleKernelsGo) {
  const std::string dir = test::make_temp_dir("one-sequence");
  // Kernels an earlier build left in the directory go; other files stay.
  fs::create_directories(dir + "/out/kernels");
  for (const char* name : {"old_kernel.cu", "old_kernel.cubin", "notes.txt"})
    std::ofstream(dir + "/out/kernels/" + name) << "earlier";
  const auto result = fusec(dir + "/cache", "build " + example("mlp_residual") +
                                                " --sequence fc2 -o " + shell_quoted(dir + "/out"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto plan = nlohmann::json::parse(test::read_text(dir + "/out/plan.json"));
  ASSERT_EQ(plan["sequences"].size(), 1u);
  EXPECT_EQ(plan["sequences"][0]["name"], "fc2");
  EXPECT_FALSE(fs::exists(dir + "/out/kernels/old_kernel.cu"));
  EXPECT_FALSE(fs::exists(dir + "/out/kernels/old_kernel.cubin"));
  EXPECT_TRUE(fs::exists(dir + "/out/kernels/notes.txt"));
  EXPECT_EQ(files_under(dir + "/out/kernels").size(), 1 + 2 * plan["kernels"].size());
  const auto missing =
      fusec(dir + "/cache", "build " + example("mlp_residual") + " --sequence fc3 -o " +
                                shell_quoted(dir + "/out"));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_TRUE(contains(missing.output, "no sequence 'fc3'")) << missing.output;
}

TEST(FusecBuild, UnknownArchIsAUsageError) {
  const std::string dir = test::make_temp_dir("bad-arch");
  const auto result =
      fusec(dir, "build " + example("mlp") + " --arch sm_9x -o " + shell_quoted(dir + "/out"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_TRUE(contains(result.output, "'sm_9x' is not an arch")) << result.output;
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

TEST(FusecBuild, ProgressLineOnATerminalOnly) {
  if (test::run_command("command -v script").exit_code != 0) GTEST_SKIP() << "no `script` here";
  const std::string cache = test::make_temp_dir("progress-cache");
  const std::string out = test::make_temp_dir("progress-out") + "/build";
  // `script` runs fusec on a pseudo-terminal, so its stderr is a terminal.
  const std::string command = "OPFUSE_CACHE_DIR=" + cache + " " + test::fusec_path() + " build " +
                              test::source_path("dsl_examples/mlp.fuse") + " -o " + out;
  const auto result = test::run_command("script -qec " + shell_quoted(command) + " /dev/null");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "/10] compiling ")) << result.output;
  EXPECT_TRUE(contains(result.output, "\r\033[K")) << "the line is cleared when done";
}

// float8_block_scaling on an architecture without cuBLASLt's block-scale modes, and on sm_90a
// with --emulate-block-scaling: the build says so (a note at the sequence) and its kernels are
// the emulated path's (block_fake_quantize, no block_cast_transpose).
TEST(FusecDumpKernels, EmulatedBlockScalingIsNotedAndItsKernelsWritten) {
  const std::string dir = test::make_temp_dir("dump-emulated");
  const std::string file = dir + "/blocks.fuse";
  std::ofstream(file) << "recipe blocks = float8_block_scaling()\n"
                         "sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses "
                         "blocks {\n"
                         "  linear(256, 256, bias = false) as fc\n"
                         "}\n";
  struct Case {
    std::string flags;
    std::string note;
  };
  for (const Case& c :
       {Case{"--arch sm_100a", "runs float8_block_scaling emulated on sm_100a (cuBLASLt has no"},
        Case{"--emulate-block-scaling",
             "runs float8_block_scaling emulated on sm_90a (as the compile options ask)"},
        Case{"", ""}}) {
    SCOPED_TRACE(c.flags);
    const std::string out = dir + "/out" + std::to_string(c.flags.size());
    const auto result =
        test::run_command(test::fusec_path() + " dump-kernels " + shell_quoted(file) + " " +
                          c.flags + " -o " + shell_quoted(out));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    bool emulated = false, native = false;
    for (const auto& e : fs::directory_iterator(out + "/kernels")) {
      emulated |= e.path().stem().string().starts_with("block_fake_quantize");
      native |= e.path().stem().string().starts_with("block_cast_transpose");
    }
    if (c.note.empty()) {
      EXPECT_FALSE(contains(result.output, "note:")) << result.output;
      EXPECT_TRUE(native && !emulated);
    } else {
      EXPECT_TRUE(contains(result.output, "blocks.fuse:2:10: note: sequence 'mlp' " + c.note))
          << result.output;
      EXPECT_TRUE(emulated && !native);
    }
  }
}

TEST(FusecDumpKernels, WritesFormattedSourcesTheIrAroundFusionAndThePlan) {
  const std::string out = test::make_temp_dir("dump") + "/dump";
  const auto result = test::run_command(test::fusec_path() + " dump-kernels " + example("mlp") +
                                        " -o " + shell_quoted(out));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(test::read_text(out + "/plan.json") ==
              test::read_text(test::source_path("tests/golden/codegen/mlp/plan.json")));
  const std::string before = test::read_text(out + "/ir_before_fusion.ir");
  const std::string after = test::read_text(out + "/ir_after_fusion.ir");
  EXPECT_FALSE(contains(before, "fused(")) << before;
  EXPECT_TRUE(contains(before, "cast_fp8(%0)")) << "the cast is still its own op";
  EXPECT_TRUE(contains(after, "{pattern = norm_cast}")) << after;
  size_t kernels = 0;
  for (const auto& e : fs::directory_iterator(out + "/kernels")) {
    ++kernels;
    const std::string source = test::read_text(e.path().string());
    // The end-of-step scale update serves no single op.
    if (e.path().stem() != "update_scales_256") {
      EXPECT_TRUE(contains(source, "(mlp.fuse:")) << e.path();
    }
    EXPECT_TRUE(contains(source, "template __global__ void")) << e.path();
    EXPECT_TRUE(contains(source, "// Parameter, by value")) << e.path();
  }
  EXPECT_EQ(kernels, 10u);
  const bool formatter = test::run_command("command -v clang-format").exit_code == 0;
  EXPECT_TRUE(contains(result.output,
                       formatter ? "formatted with clang-format" : "clang-format is not on PATH"))
      << result.output;
}

}  // namespace
}  // namespace opfuse
