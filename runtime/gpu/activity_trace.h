// A GPU timeline through CUPTI's activity API: every kernel, copy and memset the GPU runs while a
// trace is on, with its device start and end time and its stream (`fusec bench --trace`:
// docs/embedding.md, "Timelines"). What a per-step event pair cannot show: the gaps between
// kernels, a collective's kernel waiting for the other ranks, two streams overlapping.
//
// CUPTI (libcupti, part of the CUDA toolkit) is loaded with dlopen when a trace starts and never
// linked, so the runtime starts where it is not installed (docs/design.md, "GPU-less machines");
// cupti_activity.h is read at build time for the record layouts alone. Search order (the first
// library that loads is used):
//   1. $OPFUSE_CUPTI_LIBRARY, an exact path; when set it is the only candidate.
//   2. "libcupti.so.13", then "libcupti.so", through the dynamic loader's own search.
//   3. $CUDA_HOME/lib64, $CUDA_HOME/extras/CUPTI/lib64, /usr/local/cuda/lib64,
//      /usr/local/cuda/extras/CUPTI/lib64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace opfuse::gpu {

// One activity of the GPU, times in CUPTI's nanosecond clock (cuptiGetTimestamp's).
struct TraceEvent {
  enum class Kind : std::uint8_t { Kernel, Memcpy, Memset };
  Kind kind = Kind::Kernel;
  std::string name;  // kernels: the demangled name; copies: "memcpy HtoD" etc.; sets: "memset"
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  std::uint32_t device = 0;
  std::uint32_t stream = 0;  // CUPTI's stream id
  std::uint64_t bytes = 0;   // copies and sets
  // Kernels: grid and block sizes.
  std::uint32_t grid[3] = {0, 0, 0};
  std::uint32_t block[3] = {0, 0, 0};
};

// Records while it lives; one at a time per process (CUPTI's activity buffers are global).
// Construction loads CUPTI if needed and enables the kernel, memcpy and memset records; it throws
// UsageError when CUPTI cannot be loaded or refuses (another tracer holds it, no driver), before
// anything is recorded. finish() flushes and returns the events by start time.
// The events that started at or after `ns`: a trace without the work before a point (the first
// iteration after recording starts pays for CUPTI's setup: fusec bench's trace pass drops it).
std::vector<TraceEvent> events_from(std::vector<TraceEvent> events, std::uint64_t ns);

class ActivityTrace {
 public:
  ActivityTrace();
  ~ActivityTrace();
  ActivityTrace(const ActivityTrace&) = delete;
  ActivityTrace& operator=(const ActivityTrace&) = delete;

  // Waits for the records of finished work (synchronize the streams first), stops recording and
  // returns every event in start order. Call once.
  std::vector<TraceEvent> finish();
  // CUPTI's clock now, in the events' time base (the start of work enqueued after this call is
  // later).
  std::uint64_t now_ns() const;
  // Records CUPTI dropped for want of buffer space (0 normally); known after finish().
  std::size_t dropped() const { return dropped_; }
  // The CUPTI library that loaded.
  static std::string library_path();

 private:
  bool active_ = false;
  std::size_t dropped_ = 0;
};

// The events as Chrome trace JSON (the "traceEvents" array format, which chrome://tracing and
// Perfetto open): one complete ("X") event per activity, ts and dur in microseconds, ts from the
// earliest start, whose CUPTI time is "otherData"."origin_ns" (the ranks of one host share that
// clock: their files line up by it), pid the rank, tid the stream, args the device, bytes or grid
// and block. `label` names the process (the sequence, mode, recipe). Names are JSON strings.
std::string chrome_trace_json(const std::vector<TraceEvent>& events, int rank,
                              std::string_view label);

// Where the GPU was idle: the union of the events' intervals (any stream) against their span.
struct TraceGap {
  std::uint64_t start_ns = 0;  // the end of the busy interval before it
  std::uint64_t ns = 0;
  std::string before;  // the activity that ended last before the gap
  std::string after;   // the activity that starts it again
};
struct TraceSummary {
  std::size_t activities = 0;
  std::size_t kernels = 0;
  std::uint64_t span_ns = 0;           // the first start to the last end
  std::uint64_t busy_ns = 0;           // time with at least one activity running
  std::vector<TraceGap> largest_gaps;  // longest first
};
TraceSummary summarize_trace(const std::vector<TraceEvent>& events, std::size_t gaps = 3);

// A kernel's demangled name (the mangled one when it does not demangle).
std::string demangle_kernel_name(const char* name);

}  // namespace opfuse::gpu
