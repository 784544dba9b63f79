#include "gpu/memory_plan.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "opfuse/error.h"

namespace opfuse::gpu {
namespace {

std::size_t round_up(std::size_t bytes, std::size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

bool overlap(const BufferLifetime& a, const BufferLifetime& b) {
  return a.first <= b.last && b.first <= a.last;
}

void check(const std::vector<BufferLifetime>& lifetimes, std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw UsageError("plan_memory: the alignment must be a power of two");
  }
  for (const BufferLifetime& lifetime : lifetimes) {
    if (lifetime.bytes != 0 && lifetime.first > lifetime.last) {
      throw UsageError("plan_memory: a buffer's lifetime ends before it starts");
    }
  }
}

}  // namespace

MemoryPlan plan_memory(const std::vector<BufferLifetime>& lifetimes, std::size_t alignment) {
  check(lifetimes, alignment);
  std::vector<std::size_t> order(lifetimes.size());
  std::iota(order.begin(), order.end(), 0);
  // Why largest first (ties: longest-lived, then earliest): big buffers fragment the most when
  // they have to fit into gaps left by small ones.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const BufferLifetime& x = lifetimes[a];
    const BufferLifetime& y = lifetimes[b];
    if (x.bytes != y.bytes) return x.bytes > y.bytes;
    if (x.last - x.first != y.last - y.first) return x.last - x.first > y.last - y.first;
    return x.first < y.first;
  });
  MemoryPlan plan;
  plan.offsets.assign(lifetimes.size(), 0);
  std::vector<std::size_t> placed;
  for (std::size_t i : order) {
    const BufferLifetime& lifetime = lifetimes[i];
    if (lifetime.bytes == 0) continue;
    const std::size_t size = round_up(lifetime.bytes, alignment);
    // The byte ranges taken during this buffer's interval, by start.
    std::multimap<std::size_t, std::size_t> taken;
    for (std::size_t j : placed) {
      if (overlap(lifetime, lifetimes[j])) {
        taken.emplace(plan.offsets[j], plan.offsets[j] + round_up(lifetimes[j].bytes, alignment));
      }
    }
    std::size_t offset = 0;
    for (const auto& [begin, end] : taken) {
      if (begin >= offset + size) break;  // the gap before this range fits
      offset = std::max(offset, end);
    }
    plan.offsets[i] = offset;
    plan.bytes = std::max(plan.bytes, offset + size);
    placed.push_back(i);
  }
  return plan;
}

std::size_t peak_live_bytes(const std::vector<BufferLifetime>& lifetimes, std::size_t alignment) {
  check(lifetimes, alignment);
  std::map<int, long long> change;  // step -> bytes starting minus bytes ended before it
  for (const BufferLifetime& lifetime : lifetimes) {
    if (lifetime.bytes == 0) continue;
    const auto size = static_cast<long long>(round_up(lifetime.bytes, alignment));
    change[lifetime.first] += size;
    change[lifetime.last + 1] -= size;
  }
  long long live = 0, peak = 0;
  for (const auto& [step, delta] : change) {
    live += delta;
    peak = std::max(peak, live);
  }
  return static_cast<std::size_t>(peak);
}

}  // namespace opfuse::gpu
