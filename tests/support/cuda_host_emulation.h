// Kernel templates (templates/) run on the host, for CPU tests of their indexing and arithmetic
// where no GPU is present: the device built-ins they use, emulated. Include this header first,
// then the template; emulate_launch runs a kernel over a grid, the blocks one after another, the
// threads of a block as std::threads at once (so __syncthreads is a block barrier and
// __shfl_xor_sync an exchange between the 32 threads of a warp). The arithmetic intrinsics are the
// host's IEEE fp32 operations (__fmul_rn(a, b) is a * b, rounded once: x86-64 has no extended
// precision in SSE and no contraction without FMA code generation); the bf16/fp16/FP8 conversions
// are cuda_*.h's own host paths, which runtime/cpu/numerics.h checks against the device's. So a
// kernel's results here equal its results on a GPU wherever the kernel's logic is right; what this
// cannot catch is a device-only fault (alignment, races between blocks, warp divergence).
// `__shared__` variables become function statics: one copy for all blocks (they run in turn).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

// cuda_runtime's host definitions turn these into attributes the host compiler ignores (with a
// warning); plain functions are what the emulation needs.
#undef __device__
#define __device__
#undef __global__
#define __global__
#undef __host__
#define __host__
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)

namespace opfuse::test::emulation {

struct Dim3 {
  unsigned int x = 0, y = 0, z = 0;
};

// One block's synchronization: a barrier for the block, one per warp, a slot per thread for
// shuffles.
struct Block {
  std::unique_ptr<std::barrier<>> block_barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<float> exchange;
};
inline thread_local Block* current_block = nullptr;

}  // namespace opfuse::test::emulation

inline thread_local opfuse::test::emulation::Dim3 threadIdx;
inline thread_local opfuse::test::emulation::Dim3 blockIdx;
inline opfuse::test::emulation::Dim3 gridDim;
inline opfuse::test::emulation::Dim3 blockDim;

inline void __syncthreads() {
  opfuse::test::emulation::current_block->block_barrier->arrive_and_wait();
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// Every thread of the warp must call it (as on the device with a full mask).
inline float __shfl_xor_sync(unsigned int /*mask*/, float value, int lane_mask) {
  auto& block = *opfuse::test::emulation::current_block;
  const unsigned int t = threadIdx.x;
  std::barrier<>& warp = *block.warp_barriers[t / 32];
  block.exchange[t] = value;
  warp.arrive_and_wait();
  const float other =
      block.exchange[(t & ~31u) | ((t & 31u) ^ static_cast<unsigned int>(lane_mask))];
  warp.arrive_and_wait();
  return other;
}
inline unsigned int __shfl_xor_sync(unsigned int mask, unsigned int value, int lane_mask) {
  float bits;
  std::memcpy(&bits, &value, 4);
  bits = __shfl_xor_sync(mask, bits, lane_mask);  // moved as bits: a copy never changes them
  std::memcpy(&value, &bits, 4);
  return value;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline unsigned int __float_as_uint(float value) {
  unsigned int bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}
inline float __uint_as_float(unsigned int bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}
inline int __float_as_int(float value) { return static_cast<int>(__float_as_uint(value)); }
inline float __int_as_float(int bits) { return __uint_as_float(static_cast<unsigned int>(bits)); }
inline int __float2int_rz(float value) { return static_cast<int>(value); }
// Byte i of the result is byte (selector >> 4i) & 7 of the eight bytes y:x (x the low four).
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int selector) {
  const unsigned long long both = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned int result = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned int from = (selector >> (4 * i)) & 7u;
    result |= static_cast<unsigned int>((both >> (8 * from)) & 0xFFu) << (8 * i);
  }
  return result;
}
template <typename T>
inline T __ldg(const T* address) {
  return *address;
}
inline int atomicMax(int* address, int value) {
  std::atomic_ref<int> target(*address);
  int old = target.load();
  while (old < value && !target.compare_exchange_weak(old, value)) {
  }
  return old;
}
inline unsigned int atomicMax(unsigned int* address, unsigned int value) {
  std::atomic_ref<unsigned int> target(*address);
  unsigned int old = target.load();
  while (old < value && !target.compare_exchange_weak(old, value)) {
  }
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return std::atomic_ref<unsigned long long>(*address).fetch_add(value);
}
inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  return std::atomic_ref<unsigned int>(*address).fetch_add(value);
}
inline int atomicExch(int* address, int value) {
  return std::atomic_ref<int>(*address).exchange(value);
}

namespace opfuse::test::emulation {

// kernel(params) over grid x threads (1-D blocks). One std::thread per thread of a block, each
// running the blocks one after another (all threads finish a block before any starts the next).
template <typename Params>
void emulate_launch(void (*kernel)(Params), Dim3 grid, unsigned int threads, const Params& params) {
  gridDim = grid;
  blockDim = {threads, 1, 1};
  Block block;
  block.block_barrier = std::make_unique<std::barrier<>>(threads);
  for (unsigned int w = 0; w < (threads + 31) / 32; ++w)
    block.warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
  block.exchange.assign(threads, 0.0f);
  std::barrier<> between_blocks(threads);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned int t = 0; t < threads; ++t) {
    pool.emplace_back([&block, &between_blocks, &params, kernel, grid, t] {
      threadIdx = {t, 0, 0};
      current_block = &block;
      for (unsigned int by = 0; by < grid.y; ++by) {
        for (unsigned int bx = 0; bx < grid.x; ++bx) {
          blockIdx = {bx, by, 0};
          kernel(params);
          between_blocks.arrive_and_wait();
        }
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
}

}  // namespace opfuse::test::emulation
