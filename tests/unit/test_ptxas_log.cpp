// The regex-free readers of ptxas logs and arch names (runtime/jit/ptxas_log.h): the values the
// kernel report takes from a log when a cubin cannot say, and the arch names fusec and the JIT
// accept.
#include <gtest/gtest.h>

#include <string>

#include "jit/ptxas_log.h"

namespace opfuse::jit {
namespace {

TEST(ArchName, AcceptsCubinAndPtxTargets) {
  for (const char* arch : {"sm_90a", "sm_89", "sm_100f", "sm_8", "compute_90", "compute_90a"}) {
    EXPECT_TRUE(is_arch_name(arch)) << arch;
  }
}

TEST(ArchName, RejectsEverythingElse) {
  for (const char* arch : {"", "sm_", "sm_a", "sm90", "sm_90b", "sm_90aa", "compute_", "gfx90a",
                           "sm_9 0", " sm_90", "sm_90 ", "SM_90", "sm_-90", "sm_90a\n"}) {
    EXPECT_FALSE(is_arch_name(arch)) << "'" << arch << "'";
  }
}

// Two functions as ptxas -v prints them under NVRTC, with the info prefix and blank lines.
constexpr const char* kLog =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'big' for 'sm_90a'\n"
    "ptxas info    : Function properties for big\n"
    "    24 bytes stack frame, 18 bytes spill stores, 36 bytes spill loads\n"
    "ptxas info    : Used 64 registers, used 1 barriers, 24 bytes cumulative stack size\n"
    "ptxas info    : Compiling entry function 'small' for 'sm_90a'\n"
    "ptxas info    : Function properties for small   \n"
    "\n"
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 128 registers, used 0 barriers\n";

TEST(PtxasLog, LargestRegistersAndSpills) {
  EXPECT_EQ(log_largest_registers(kLog), 128);
  const LogSpills spills = log_largest_spills(kLog);
  EXPECT_EQ(spills.store_bytes, 18);
  EXPECT_EQ(spills.load_bytes, 36);
}

TEST(PtxasLog, FunctionBlocks) {
  const std::vector<LogFunctionSpills> blocks = log_function_spills(kLog);
  ASSERT_EQ(blocks.size(), 2U);
  EXPECT_EQ(blocks[0].function, "big");
  EXPECT_EQ(blocks[0].store_bytes, 18);
  EXPECT_EQ(blocks[0].load_bytes, 36);
  EXPECT_EQ(blocks[1].function, "small");
  EXPECT_EQ(blocks[1].store_bytes, 0);
  EXPECT_EQ(blocks[1].load_bytes, 0);
}

TEST(PtxasLog, AbsentOrMalformedIsUnknown) {
  EXPECT_EQ(log_largest_registers(""), -1);
  EXPECT_EQ(log_largest_registers("Used registers\nUsed x registers\nUsed 12 regs"), -1);
  const LogSpills none = log_largest_spills("7 bytes spill stores, many bytes spill loads");
  EXPECT_EQ(none.store_bytes, -1);
  EXPECT_EQ(none.load_bytes, -1);
  // A block whose numbers are not on the following line, a name followed by more text, a
  // truncated log, and numbers too large for an int are skipped, never a crash.
  EXPECT_TRUE(log_function_spills("Function properties for f\nUsed 3 registers\n").empty());
  EXPECT_TRUE(log_function_spills("Function properties for f g\n"
                                  "  0 bytes stack frame, 0 bytes spill stores, 0 bytes spill "
                                  "loads\n")
                  .empty());
  EXPECT_TRUE(log_function_spills("Function properties for ").empty());
  EXPECT_TRUE(log_function_spills("Function properties for f\n  0 bytes stack frame, "
                                  "99999999999 bytes spill stores, 0 bytes spill loads\n")
                  .empty());
  EXPECT_EQ(log_largest_registers("Used 99999999999 registers"), -1);
}

}  // namespace
}  // namespace opfuse::jit
