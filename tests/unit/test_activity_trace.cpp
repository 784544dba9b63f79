// The GPU trace's host side (runtime/gpu/activity_trace.h, `fusec bench --trace`): the summary of
// a timeline (busy time over all streams, the largest idle gaps and their neighbours), the Chrome
// trace JSON, kernel names demangled, the per-rank file names, and a clear error when CUPTI cannot
// be loaded. Recording itself needs a GPU: tests/gpu/test_bench_gpu.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "gpu/activity_trace.h"
#include "opfuse/error.h"

namespace opfuse {
namespace {

using gpu::TraceEvent;

TraceEvent kernel(std::string name, std::uint64_t start, std::uint64_t end,
                  std::uint32_t stream = 7) {
  TraceEvent e;
  e.kind = TraceEvent::Kind::Kernel;
  e.name = std::move(name);
  e.start_ns = start;
  e.end_ns = end;
  e.stream = stream;
  e.grid[0] = 132;
  e.block[0] = 256;
  return e;
}

// Two streams: a collective (stream 9) overlapping a GEMM (stream 7), then idle gaps of 400 and
// 1500 ns; the events out of start order, as CUPTI may hand them over.
std::vector<TraceEvent> timeline() {
  TraceEvent copy;
  copy.kind = TraceEvent::Kind::Memcpy;
  copy.name = "memcpy DtoD";
  copy.start_ns = 10'000;
  copy.end_ns = 10'500;
  copy.stream = 7;
  copy.bytes = 1 << 20;
  return {kernel("gemm", 1'000, 4'000), kernel("nccl_all_reduce", 2'000, 5'000, 9),
          kernel("swiglu", 5'400, 8'000), kernel("late_tail", 8'500, 8'500), copy};
}

TEST(ActivityTrace, SummaryJoinsStreamsAndNamesTheLargestGaps) {
  const gpu::TraceSummary s = gpu::summarize_trace(timeline(), 2);
  EXPECT_EQ(s.activities, 5u);
  EXPECT_EQ(s.kernels, 4u);
  EXPECT_EQ(s.span_ns, 10'500u - 1'000u);
  // [1000, 5000) + [5400, 8000) + [8500, 8500) + [10000, 10500)
  EXPECT_EQ(s.busy_ns, 4'000u + 2'600u + 0u + 500u);
  ASSERT_EQ(s.largest_gaps.size(), 2u);
  EXPECT_EQ(s.largest_gaps[0].ns, 1'500u);
  EXPECT_EQ(s.largest_gaps[0].start_ns, 8'500u);
  EXPECT_EQ(s.largest_gaps[0].before, "late_tail");
  EXPECT_EQ(s.largest_gaps[0].after, "memcpy DtoD");
  EXPECT_EQ(s.largest_gaps[1].ns, 500u);
  EXPECT_EQ(s.largest_gaps[1].before, "swiglu");
  EXPECT_EQ(s.largest_gaps[1].after, "late_tail");
  // The third gap (400 ns after the all-reduce, which ended after the GEMM) is left out.
  const gpu::TraceSummary all = gpu::summarize_trace(timeline(), 10);
  ASSERT_EQ(all.largest_gaps.size(), 3u);
  EXPECT_EQ(all.largest_gaps[2].ns, 400u);
  EXPECT_EQ(all.largest_gaps[2].before, "nccl_all_reduce");
  EXPECT_EQ(all.largest_gaps[2].after, "swiglu");
}

// fusec bench's trace pass drops the settling iteration: what started before the point goes,
// whatever it overlaps.
TEST(ActivityTrace, EventsFromAPointKeepOnlyLaterStarts) {
  const std::vector<gpu::TraceEvent> kept = gpu::events_from(timeline(), 5'000);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].name, "swiglu");
  EXPECT_EQ(kept[1].name, "late_tail");
  EXPECT_EQ(kept[2].name, "memcpy DtoD");
  EXPECT_EQ(gpu::events_from(timeline(), 1'000).size(), 5u);  // a start at the point stays
  EXPECT_TRUE(gpu::events_from(timeline(), 20'000).empty());
}

TEST(ActivityTrace, EmptyTimelineSummarizesToZeros) {
  const gpu::TraceSummary s = gpu::summarize_trace({});
  EXPECT_EQ(s.activities, 0u);
  EXPECT_EQ(s.span_ns, 0u);
  EXPECT_EQ(s.busy_ns, 0u);
  EXPECT_TRUE(s.largest_gaps.empty());
}

TEST(ActivityTrace, ChromeJsonHasOneCompleteEventPerActivity) {
  std::vector<TraceEvent> events = timeline();
  events[0].name = "void opfuse::f<\"q\\\\\">()";  // quotes and backslashes stay JSON strings
  const nlohmann::json json =
      nlohmann::json::parse(gpu::chrome_trace_json(events, 3, "sequence mlp (fwdbwd)"));
  const nlohmann::json& list = json.at("traceEvents");
  ASSERT_EQ(list.size(), events.size() + 1);
  EXPECT_EQ(list[0]["ph"], "M");
  EXPECT_EQ(list[0]["pid"], 3);
  EXPECT_EQ(list[0]["args"]["name"], "rank 3: sequence mlp (fwdbwd)");
  for (std::size_t i = 0; i < events.size(); ++i) {
    const nlohmann::json& e = list[i + 1];
    SCOPED_TRACE(e.dump());
    EXPECT_EQ(e["ph"], "X");
    EXPECT_EQ(e["name"], events[i].name);
    EXPECT_EQ(e["pid"], 3);
    EXPECT_EQ(e["tid"], events[i].stream);
    EXPECT_DOUBLE_EQ(e["ts"].get<double>(), double(events[i].start_ns - 1'000) / 1e3)
        << "microseconds from the earliest start";
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(), double(events[i].end_ns - events[i].start_ns) / 1e3);
  }
  EXPECT_EQ(list[1]["cat"], "kernel");
  EXPECT_EQ(list[1]["args"]["grid"], nlohmann::json::array({132, 0, 0}));
  EXPECT_EQ(list[1]["args"]["block"], nlohmann::json::array({256, 0, 0}));
  EXPECT_EQ(json["otherData"]["origin_ns"], 1'000);
  EXPECT_EQ(json["otherData"]["rank"], 3);
  EXPECT_EQ(list[5]["cat"], "memcpy");
  EXPECT_EQ(list[5]["args"]["bytes"], 1 << 20);
}

TEST(ActivityTrace, KernelNamesAreDemangled) {
  EXPECT_EQ(gpu::demangle_kernel_name("_Z3fooi"), "foo(int)");
  EXPECT_EQ(gpu::demangle_kernel_name("_ZN6opfuse3barEv"), "opfuse::bar()");
  EXPECT_EQ(gpu::demangle_kernel_name("nvjet_sm90_tst_128x160"), "nvjet_sm90_tst_128x160");
  EXPECT_EQ(gpu::demangle_kernel_name(nullptr), "(unnamed kernel)");
}

TEST(ActivityTrace, EachRankWritesItsOwnFile) {
  EXPECT_EQ(api::rank_trace_path("out/t.json", 0), "out/t.json");
  EXPECT_EQ(api::rank_trace_path("out/t.json", 1), "out/t.rank1.json");
  EXPECT_EQ(api::rank_trace_path("t", 3), "t.rank3");
  EXPECT_EQ(api::rank_trace_path("out.d/t", 2), "out.d/t.rank2");
  EXPECT_EQ(api::rank_trace_path(".trace", 1), ".trace.rank1");
}

// The library named by OPFUSE_CUPTI_LIBRARY is the only candidate: one that does not load is an
// error naming it and saying what to do, before anything is recorded.
TEST(ActivityTrace, UnloadableCuptiIsAClearError) {
  ASSERT_EQ(::setenv("OPFUSE_CUPTI_LIBRARY", "/nonexistent/libcupti.so", 1), 0);
  try {
    gpu::ActivityTrace trace;
    FAIL() << "a trace started without CUPTI";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/nonexistent/libcupti.so"), std::string::npos) << what;
    EXPECT_NE(what.find("OPFUSE_CUPTI_LIBRARY"), std::string::npos) << what;
  }
  ::unsetenv("OPFUSE_CUPTI_LIBRARY");
}

}  // namespace
}  // namespace opfuse
