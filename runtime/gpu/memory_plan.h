// Static placement of an executor's buffers in one device allocation (note "Executor buffers" in
// plan_executor.cpp): each buffer is live over an interval of plan steps, and two buffers whose
// intervals overlap never share bytes. Pure host code: the CPU tests check it.
#pragma once

#include <cstddef>
#include <vector>

namespace opfuse::gpu {

struct BufferLifetime {
  std::size_t bytes = 0;  // 0: not placed (offset 0, takes no space)
  int first = 0;          // the first step that touches it
  int last = 0;           // the last step it must survive (inclusive)
};

struct MemoryPlan {
  std::vector<std::size_t> offsets;  // per lifetime, multiples of the alignment
  std::size_t bytes = 0;             // the allocation the offsets fit in
};

// Places the largest buffers first, each at the lowest aligned offset free over its interval.
// The result is never below the most bytes live at one step (rounded to the alignment) and is
// usually that; `alignment` must be a power of two.
MemoryPlan plan_memory(const std::vector<BufferLifetime>& lifetimes, std::size_t alignment);

// The most bytes live at any one step, each buffer rounded up to `alignment`.
std::size_t peak_live_bytes(const std::vector<BufferLifetime>& lifetimes, std::size_t alignment);

}  // namespace opfuse::gpu
