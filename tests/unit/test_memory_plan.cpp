// The executor's static buffer placement (runtime/gpu/memory_plan.h): buffers live at the same
// time never share bytes, buffers live at different times do, and the allocation stays at the
// live peak for the shapes a plan produces.
#include "gpu/memory_plan.h"

#include <gtest/gtest.h>

#include <random>

#include "opfuse/error.h"

namespace opfuse::gpu {
namespace {

void expect_no_overlap(const std::vector<BufferLifetime>& lifetimes, const MemoryPlan& plan,
                       std::size_t alignment) {
  ASSERT_EQ(plan.offsets.size(), lifetimes.size());
  for (std::size_t i = 0; i < lifetimes.size(); ++i) {
    if (lifetimes[i].bytes == 0) continue;
    EXPECT_EQ(plan.offsets[i] % alignment, 0u) << "buffer " << i;
    EXPECT_LE(plan.offsets[i] + lifetimes[i].bytes, plan.bytes) << "buffer " << i;
    for (std::size_t j = i + 1; j < lifetimes.size(); ++j) {
      if (lifetimes[j].bytes == 0) continue;
      const bool same_time =
          lifetimes[i].first <= lifetimes[j].last && lifetimes[j].first <= lifetimes[i].last;
      const bool same_bytes = plan.offsets[i] < plan.offsets[j] + lifetimes[j].bytes &&
                              plan.offsets[j] < plan.offsets[i] + lifetimes[i].bytes;
      EXPECT_FALSE(same_time && same_bytes) << "buffers " << i << " and " << j;
    }
  }
}

TEST(MemoryPlan, BuffersLiveAtDifferentTimesShareMemory) {
  // A forward chain: each intermediate dies when the next step has read it.
  const std::vector<BufferLifetime> chain = {
      {1000, 0, 1}, {1000, 1, 2}, {1000, 2, 3}, {1000, 3, 4}};
  const MemoryPlan plan = plan_memory(chain, 256);
  expect_no_overlap(chain, plan, 256);
  EXPECT_EQ(plan.bytes, 2048u);
  EXPECT_EQ(peak_live_bytes(chain, 256), 2048u);
}

TEST(MemoryPlan, BuffersLiveTogetherNeverOverlap) {
  const std::vector<BufferLifetime> together = {{100, 0, 5}, {300, 2, 3}, {17, 3, 9}, {0, 0, 9}};
  const MemoryPlan plan = plan_memory(together, 16);
  expect_no_overlap(together, plan, 16);
  EXPECT_EQ(plan.bytes, 112u + 304u + 32u);
  EXPECT_EQ(plan.offsets[3], 0u) << "an empty buffer takes no space";
}

TEST(MemoryPlan, TrainingShapedLifetimesStayNearTheLivePeak) {
  // Saved activations live from forward into backward, gradients from backward to the end, and
  // short-lived workspaces come and go: random plans of that shape.
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int steps = 40;
    std::vector<BufferLifetime> lifetimes;
    const int count = 5 + int(random() % 40);
    for (int b = 0; b < count; ++b) {
      const int first = int(random() % steps);
      const int length = (random() % 4 == 0) ? int(random() % steps) : int(random() % 3);
      lifetimes.push_back(
          {std::size_t(1 + random() % (1 << 20)), first, std::min(steps, first + length)});
    }
    const MemoryPlan plan = plan_memory(lifetimes, 256);
    SCOPED_TRACE(trial);
    expect_no_overlap(lifetimes, plan, 256);
    const std::size_t peak = peak_live_bytes(lifetimes, 256);
    EXPECT_GE(plan.bytes, peak);
    // First fit by size is not optimal, but on these shapes it stays within half again the peak.
    EXPECT_LE(double(plan.bytes), 1.5 * double(peak));
  }
}

TEST(MemoryPlan, RejectsBadInput) {
  EXPECT_THROW(plan_memory({{10, 0, 1}}, 24), UsageError);
  EXPECT_THROW(plan_memory({{10, 3, 1}}, 16), UsageError);
  EXPECT_NO_THROW(plan_memory({}, 16));
  EXPECT_EQ(plan_memory({}, 16).bytes, 0u);
}

}  // namespace
}  // namespace opfuse::gpu
