// `fusec bench` on a machine without a GPU: its command line (help, argument errors as exit 2)
// and the clear exit-1 error without a GPU. The measurement itself is covered on the GPU
// (tests/gpu/test_bench_gpu.cpp) and by bench/run_gpu.sh.
#include <gtest/gtest.h>

#include <string>

#include "gpu/device.h"
#include "test_support.h"

namespace opfuse {
namespace {

using test::contains;

constexpr int kExitOk = 0;
constexpr int kExitUserError = 1;
constexpr int kExitUsage = 2;

test::CommandResult bench(const std::string& args) {
  return test::run_command(test::fusec_path() + " bench " + args);
}

std::string mlp() { return "'" + test::source_path("dsl_examples/mlp.fuse") + "'"; }

TEST(FusecBench, HelpNamesEveryOptionAndTheExitCodes) {
  const auto r = bench("--help");
  EXPECT_EQ(r.exit_code, kExitOk) << r.output;
  for (const char* option :
       {"--sequence", "--bind", "--mode", "fwdbwd", "--recipe", "--graph", "--iterations",
        "--warmup", "--calibrate", "--json", "--recast-weights", "--nproc", "--trace",
        "--trace-iterations", "Chrome trace JSON"}) {
    EXPECT_TRUE(contains(r.output, option)) << option << " missing from:\n" << r.output;
  }
  EXPECT_TRUE(contains(r.output, "Exit codes:")) << r.output;
  EXPECT_TRUE(contains(r.output, "rotated")) << r.output;
}

TEST(FusecBench, MalformedBindIsAUsageError) {
  for (const char* bind : {"tokens", "tokens=", "=64", "tokens=6x4"}) {
    const auto r = bench(mlp() + " --bind " + bind);
    EXPECT_EQ(r.exit_code, kExitUsage) << bind << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "is not NAME=SIZE")) << r.output;
  }
}

TEST(FusecBench, UnknownModeIsAUsageError) {
  const auto r = bench(mlp() + " --bind tokens=64 --mode backward");
  EXPECT_EQ(r.exit_code, kExitUsage) << r.output;
  EXPECT_TRUE(contains(r.output, "backward not in {fwd,fwdbwd}")) << r.output;
}

TEST(FusecBench, NegativeCountsAreUsageErrors) {
  for (const char* option :
       {"--iterations -1", "--warmup -5", "--calibrate -2", "--iterations many"}) {
    const auto r = bench(mlp() + " --bind tokens=64 " + option);
    EXPECT_EQ(r.exit_code, kExitUsage) << option << ": " << r.output;
  }
}

// --trace-iterations counts the iterations of a --trace: alone, or below 1, it is a usage error.
TEST(FusecBench, TraceIterationsNeedATraceAndAPositiveCount) {
  const auto alone = bench(mlp() + " --bind tokens=64 --trace-iterations 3");
  EXPECT_EQ(alone.exit_code, kExitUsage) << alone.output;
  EXPECT_TRUE(contains(alone.output, "--trace")) << alone.output;
  const std::string out = test::make_temp_dir("bench") + "/t.json";
  for (const char* count : {"0", "-1", "many"}) {
    const auto r =
        bench(mlp() + " --bind tokens=64 --trace '" + out + "' --trace-iterations " + count);
    EXPECT_EQ(r.exit_code, kExitUsage) << count << ": " << r.output;
  }
}

TEST(FusecBench, MissingFileIsAUsageError) {
  const auto missing = bench("'" + test::make_temp_dir("bench") + "/absent.fuse'");
  EXPECT_EQ(missing.exit_code, kExitUsage) << missing.output;
  const auto none = bench("--bind tokens=64");
  EXPECT_EQ(none.exit_code, kExitUsage) << none.output;
  EXPECT_TRUE(contains(none.output, "file is required")) << none.output;
}

TEST(FusecBench, WithoutAGpuSaysSoAndExitsOne) {
  std::string why;
  if (gpu::gpu_available(&why)) GTEST_SKIP() << "this machine has a GPU: tests/gpu cover bench";
  const std::string out = test::make_temp_dir("bench") + "/result.json";
  const auto r = bench(mlp() + " --bind tokens=64 --json '" + out + "'");
  EXPECT_EQ(r.exit_code, kExitUserError) << r.output;
  EXPECT_TRUE(contains(r.output, "fusec: error: bench needs a GPU: " + why)) << r.output;
  EXPECT_FALSE(test::run_command("test -e '" + out + "'").exit_code == 0)
      << "no JSON is written when nothing was measured";
  const std::string trace = test::make_temp_dir("bench") + "/trace.json";
  const auto traced = bench(mlp() + " --bind tokens=64 --trace '" + trace + "'");
  EXPECT_EQ(traced.exit_code, kExitUserError) << traced.output;
  EXPECT_TRUE(contains(traced.output, "bench needs a GPU")) << traced.output;
  EXPECT_FALSE(test::run_command("test -e '" + trace + "'").exit_code == 0)
      << "no trace is written when nothing ran";
}

// `fusec bench --nproc N` (docs/parallel.md) starts a process per GPU: without N GPUs it says
// so and writes nothing; a count below 1 is a usage error.
TEST(FusecBench, NprocNeedsAGpuPerRank) {
  const std::string tp = "'" + test::source_path("bench/workloads/mlp_large_tp.fuse") + "'";
  if (!gpu::gpu_available()) {
    const std::string out = test::make_temp_dir("bench") + "/tp.json";
    const auto r = bench(
        tp + " --sequence mlp_tp2 --nproc 2 --bind tokens=64 --mode fwdbwd --json '" + out + "'");
    EXPECT_EQ(r.exit_code, kExitUserError) << r.output;
    EXPECT_TRUE(contains(r.output, "--nproc 2 starts one process per GPU, but this machine has 0"))
        << r.output;
    EXPECT_FALSE(test::run_command("test -e '" + out + "'").exit_code == 0);
  }
  const auto zero = bench(tp + " --sequence mlp_tp2 --nproc 0 --bind tokens=64");
  EXPECT_EQ(zero.exit_code, kExitUsage) << zero.output;
}

}  // namespace
}  // namespace opfuse
