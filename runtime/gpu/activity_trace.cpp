#include "gpu/activity_trace.h"

#include <cupti_activity.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "gpu/dynamic_library.h"
#include "opfuse/error.h"

namespace opfuse::gpu {

namespace {

constexpr const char* kWhatToDo =
    "install the CUDA toolkit's CUPTI (libcupti.so.13) or set "
    "OPFUSE_CUPTI_LIBRARY=/path/to/libcupti.so";

// The CUPTI functions a trace calls, with the signatures of the header this was built with.
struct CuptiLibrary {
  std::string path;
  decltype(&::cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&::cuptiActivityEnable) enable = nullptr;
  decltype(&::cuptiActivityDisable) disable = nullptr;
  decltype(&::cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&::cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&::cuptiActivityGetNumDroppedRecords) dropped_records = nullptr;
  decltype(&::cuptiGetResultString) result_string = nullptr;
  decltype(&::cuptiGetTimestamp) timestamp = nullptr;
};

// Loads CUPTI on the first call (the search order of activity_trace.h); throws UsageError naming
// what was tried when nothing usable loads. Later calls return the same library.
const CuptiLibrary& cupti() {
  static std::mutex mutex;
  static std::unique_ptr<CuptiLibrary> loaded;
  const std::lock_guard<std::mutex> lock(mutex);
  if (loaded) return *loaded;
  std::vector<std::string> candidates;
  const std::string exact = environment_value("OPFUSE_CUPTI_LIBRARY");
  if (!exact.empty()) {
    candidates.push_back(exact);
  } else {
    candidates = {"libcupti.so.13", "libcupti.so"};
    std::vector<std::string> roots;
    if (const std::string home = environment_value("CUDA_HOME"); !home.empty()) {
      roots.push_back(home);
    }
    roots.emplace_back("/usr/local/cuda");
    for (const std::string& root : roots) {
      candidates.push_back(root + "/lib64/libcupti.so");
      candidates.push_back(root + "/extras/CUPTI/lib64/libcupti.so");
    }
  }
  std::string tried;
  for (const std::string& candidate : candidates) {
    void* handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      tried += fmt::format("\n  {}: {}", candidate, dlerror_text());
      continue;
    }
    auto library = std::make_unique<CuptiLibrary>();
    std::string missing;
    resolve_symbol(handle, "cuptiActivityRegisterCallbacks", library->register_callbacks, missing);
    resolve_symbol(handle, "cuptiActivityEnable", library->enable, missing);
    resolve_symbol(handle, "cuptiActivityDisable", library->disable, missing);
    resolve_symbol(handle, "cuptiActivityFlushAll", library->flush_all, missing);
    resolve_symbol(handle, "cuptiActivityGetNextRecord", library->next_record, missing);
    resolve_symbol(handle, "cuptiActivityGetNumDroppedRecords", library->dropped_records, missing);
    resolve_symbol(handle, "cuptiGetResultString", library->result_string, missing);
    resolve_symbol(handle, "cuptiGetTimestamp", library->timestamp, missing);
    library->path = loaded_library_path(handle, candidate);
    if (!missing.empty()) {
      // Why no dlclose: CUPTI may have hooked the driver on load; unloading it is not safe.
      throw UsageError(
          fmt::format("CUPTI library {} lacks {}; {}", library->path, missing, kWhatToDo));
    }
    loaded = std::move(library);
    return *loaded;
  }
  throw UsageError(
      fmt::format("cannot load CUPTI for a GPU trace; {}. Tried:{}", kWhatToDo, tried));
}

std::string result_text(const CuptiLibrary& library, CUptiResult result) {
  const char* text = nullptr;
  if (library.result_string(result, &text) != CUPTI_SUCCESS || text == nullptr) {
    return fmt::format("CUPTI error {}", static_cast<int>(result));
  }
  return text;
}

// The records of completed buffers, gathered by CUPTI's callbacks (which may run on CUPTI's own
// thread), for the one live trace.
struct Collector {
  std::mutex mutex;
  std::vector<TraceEvent> events;
  std::size_t dropped = 0;
  bool live = false;
};
Collector& collector() {
  static Collector c;
  return c;
}

constexpr std::size_t kBufferBytes = 8u << 20;
constexpr std::size_t kBufferAlignment = 8;  // CUPTI's ACTIVITY_RECORD_ALIGNMENT

const char* copy_kind_name(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

// The fields every kept record has (CUPTI's kernel, memcpy and memset records name them alike).
template <typename Record>
void copy_interval(const Record& r, TraceEvent& event) {
  event.start_ns = r.start;
  event.end_ns = r.end;
  event.device = r.deviceId;
  event.stream = r.streamId;
}

// One record as an event; false for kinds a trace does not keep.
bool to_event(const CUpti_Activity* record, TraceEvent& event) {
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      event.kind = TraceEvent::Kind::Kernel;
      event.name = demangle_kernel_name(k->name);
      copy_interval(*k, event);
      event.grid[0] = static_cast<std::uint32_t>(k->gridX);
      event.grid[1] = static_cast<std::uint32_t>(k->gridY);
      event.grid[2] = static_cast<std::uint32_t>(k->gridZ);
      event.block[0] = static_cast<std::uint32_t>(k->blockX);
      event.block[1] = static_cast<std::uint32_t>(k->blockY);
      event.block[2] = static_cast<std::uint32_t>(k->blockZ);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      event.kind = TraceEvent::Kind::Memcpy;
      event.name = copy_kind_name(m->copyKind);
      copy_interval(*m, event);
      event.bytes = m->bytes;
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      event.kind = TraceEvent::Kind::Memset;
      event.name = "memset";
      copy_interval(*m, event);
      event.bytes = m->bytes;
      return true;
    }
    default:
      return false;
  }
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(kBufferAlignment, kBufferBytes));
  *size = *buffer == nullptr ? 0 : kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, std::uint32_t stream, std::uint8_t* buffer,
                               std::size_t /*size*/, std::size_t valid_size) {
  const CuptiLibrary& library = cupti();
  Collector& c = collector();
  std::vector<TraceEvent> events;
  CUpti_Activity* record = nullptr;
  while (library.next_record(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    TraceEvent event;
    if (to_event(record, event)) events.push_back(std::move(event));
  }
  std::size_t dropped = 0;
  if (library.dropped_records(context, stream, &dropped) != CUPTI_SUCCESS) dropped = 0;
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.live) return;  // a late buffer of a finished trace
  c.events.insert(c.events.end(), std::make_move_iterator(events.begin()),
                  std::make_move_iterator(events.end()));
  c.dropped += dropped;
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

std::string demangle_kernel_name(const char* name) {
  if (name == nullptr) return "(unnamed kernel)";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> demangled(
      abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && demangled ? std::string(demangled.get()) : std::string(name);
}

std::string ActivityTrace::library_path() { return cupti().path; }

ActivityTrace::ActivityTrace() {
  const CuptiLibrary& library = cupti();
  Collector& c = collector();
  {
    const std::lock_guard<std::mutex> lock(c.mutex);
    if (c.live) throw UsageError("a GPU trace is already recording in this process");
    c.events.clear();
    c.dropped = 0;
    c.live = true;
  }
  auto fail = [&](const char* what, CUptiResult result) {
    for (const CUpti_ActivityKind kind : kKinds) library.disable(kind);
    const std::lock_guard<std::mutex> lock(c.mutex);
    c.live = false;
    throw UsageError(fmt::format("CUPTI ({}) refused to {}: {}", library.path, what,
                                 result_text(library, result)));
  };
  if (const CUptiResult r = library.register_callbacks(buffer_requested, buffer_completed);
      r != CUPTI_SUCCESS) {
    fail("register its buffer callbacks", r);
  }
  for (const CUpti_ActivityKind kind : kKinds) {
    if (const CUptiResult r = library.enable(kind); r != CUPTI_SUCCESS) {
      fail("record the GPU's activity", r);
    }
  }
  active_ = true;
}

ActivityTrace::~ActivityTrace() {
  if (!active_) return;
  try {
    (void)finish();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing
  }
}

std::vector<TraceEvent> events_from(std::vector<TraceEvent> events, std::uint64_t ns) {
  std::erase_if(events, [ns](const TraceEvent& e) { return e.start_ns < ns; });
  return events;
}

std::uint64_t ActivityTrace::now_ns() const {
  std::uint64_t ns = 0;
  if (const CUptiResult result = cupti().timestamp(&ns); result != CUPTI_SUCCESS)
    throw CudaError(fmt::format("cuptiGetTimestamp failed ({})", int(result)), "CUPTI",
                    int(result));
  return ns;
}

std::vector<TraceEvent> ActivityTrace::finish() {
  if (!active_) return {};
  active_ = false;
  const CuptiLibrary& library = cupti();
  const CUptiResult flushed = library.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (const CUpti_ActivityKind kind : kKinds) library.disable(kind);
  Collector& c = collector();
  std::vector<TraceEvent> events;
  {
    const std::lock_guard<std::mutex> lock(c.mutex);
    events.swap(c.events);
    dropped_ = c.dropped;
    c.live = false;
  }
  if (flushed != CUPTI_SUCCESS) {
    throw UsageError(fmt::format("CUPTI ({}) could not flush the GPU trace: {}", library.path,
                                 result_text(library, flushed)));
  }
  std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_ns < b.start_ns;
  });
  return events;
}

TraceSummary summarize_trace(const std::vector<TraceEvent>& events, std::size_t gaps) {
  TraceSummary summary;
  summary.activities = events.size();
  std::vector<const TraceEvent*> order;
  order.reserve(events.size());
  for (const TraceEvent& e : events) {
    if (e.kind == TraceEvent::Kind::Kernel) ++summary.kernels;
    order.push_back(&e);
  }
  if (order.empty()) return summary;
  std::stable_sort(order.begin(), order.end(), [](const TraceEvent* a, const TraceEvent* b) {
    return a->start_ns < b->start_ns;
  });
  const auto end_of = [](const TraceEvent* e) { return std::max(e->end_ns, e->start_ns); };
  std::uint64_t busy_start = order.front()->start_ns;
  std::uint64_t busy_end = end_of(order.front());
  const TraceEvent* last_to_end = order.front();
  std::vector<TraceGap> all_gaps;
  for (std::size_t i = 1; i < order.size(); ++i) {
    const TraceEvent* e = order[i];
    if (e->start_ns > busy_end) {
      summary.busy_ns += busy_end - busy_start;
      all_gaps.push_back({busy_end, e->start_ns - busy_end, last_to_end->name, e->name});
      busy_start = e->start_ns;
    }
    if (end_of(e) >= busy_end) {
      busy_end = end_of(e);
      last_to_end = e;
    }
  }
  summary.busy_ns += busy_end - busy_start;
  summary.span_ns = busy_end - order.front()->start_ns;
  std::stable_sort(all_gaps.begin(), all_gaps.end(),
                   [](const TraceGap& a, const TraceGap& b) { return a.ns > b.ns; });
  if (all_gaps.size() > gaps) all_gaps.resize(gaps);
  summary.largest_gaps = std::move(all_gaps);
  return summary;
}

std::string chrome_trace_json(const std::vector<TraceEvent>& events, int rank,
                              std::string_view label) {
  nlohmann::ordered_json trace_events = nlohmann::ordered_json::array();
  trace_events.push_back({{"name", "process_name"},
                          {"ph", "M"},
                          {"pid", rank},
                          {"args", {{"name", fmt::format("rank {}: {}", rank, label)}}}});
  // Microseconds from the first start: a double keeps nanoseconds there, where CUPTI's absolute
  // clock (about 1e18 ns) would keep a quarter microsecond.
  std::uint64_t origin = events.empty() ? 0 : events.front().start_ns;
  for (const TraceEvent& e : events) origin = std::min(origin, e.start_ns);
  for (const TraceEvent& e : events) {
    nlohmann::ordered_json args = {{"device", e.device}};
    const char* category = "kernel";
    if (e.kind == TraceEvent::Kind::Kernel) {
      args["grid"] = {e.grid[0], e.grid[1], e.grid[2]};
      args["block"] = {e.block[0], e.block[1], e.block[2]};
    } else {
      category = e.kind == TraceEvent::Kind::Memcpy ? "memcpy" : "memset";
      args["bytes"] = e.bytes;
    }
    const std::uint64_t end = std::max(e.end_ns, e.start_ns);
    trace_events.push_back({{"name", e.name},
                            {"cat", category},
                            {"ph", "X"},
                            {"ts", static_cast<double>(e.start_ns - origin) / 1e3},
                            {"dur", static_cast<double>(end - e.start_ns) / 1e3},
                            {"pid", rank},
                            {"tid", e.stream},
                            {"args", std::move(args)}});
  }
  nlohmann::ordered_json root = {{"traceEvents", std::move(trace_events)},
                                 {"displayTimeUnit", "ns"},
                                 {"otherData", {{"rank", rank}, {"origin_ns", origin}}}};
  return root.dump(1) + "\n";
}

}  // namespace opfuse::gpu
