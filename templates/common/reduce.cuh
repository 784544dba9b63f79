// Warp and block reductions for the kernel templates.
//
// Every reduction is an all-reduce by butterfly shuffles inside a warp, then (for more than one
// warp) one value per warp through shared memory and a single __syncthreads. The order of the
// additions is fixed by the launch shape, so results are deterministic run to run.
#ifndef OPFUSE_TEMPLATES_COMMON_REDUCE_CUH_
#define OPFUSE_TEMPLATES_COMMON_REDUCE_CUH_

#include "types.cuh"

namespace opfuse {

constexpr unsigned int kFullWarpMask = 0xFFFFFFFFu;

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
// fmaxf ignores a NaN operand: the amax of a tensor is the largest non-NaN magnitude (TE's rule).
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
// All-reduce over the 32 lanes of a warp; every lane receives the result.
template <typename Op>
__device__ __forceinline__ float warp_allreduce(float value, Op op) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) {
    value = op(value, __shfl_xor_sync(kFullWarpMask, value, mask));
  }
  return value;
}

// Maxima of kValues values per lane over each group of kLanes consecutive lanes (a power of 2, at
// most 32, kValues <= kLanes; fmaxf, so NaNs are ignored as by a butterfly), one value per lane at
// the end: each round halves the values a lane holds (of a pair of lanes the upper keeps the
// upper half and sends the lower, the lower the reverse), then the rounds left combine the one
// value. Lane L ends with the group maximum of value (L % kLanes) / LaneGroupMax::kReplicas (zero
// for the padding values >= kValues), which lane group_first + i * kReplicas holds for value i.
// 2 + 1 + 1 + 1 shuffles for 4 values over 16 lanes, 4 + 2 + 1 + 1 for 8, where a butterfly per
// value takes 16 and 32: what the block-scaled kernels spend to give each 1 x 128 block its amax.
// Every lane of the warp must call it.
template <int kValues, int kLanes>
struct LaneGroupMax {
  static constexpr int kPadded = kValues <= 1    ? 1
                                 : kValues <= 2  ? 2
                                 : kValues <= 4  ? 4
                                 : kValues <= 8  ? 8
                                 : kValues <= 16 ? 16
                                                 : 32;
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes: 2^k <= 32");
  static_assert(kValues >= 1 && kPadded <= kLanes, "at most one value per lane of a group");
  static constexpr int kReplicas = kLanes / kPadded;  // lanes ending with the same value

  __device__ __forceinline__ static float reduce(const float (&values)[kValues], int lane) {
    float held[kPadded];
#pragma unroll
    for (int i = 0; i < kPadded; ++i) held[i] = i < kValues ? values[i] : 0.0f;
#pragma unroll
    for (int r = 0; (kLanes >> (r + 1)) >= 1; ++r) {
      const int mask = kLanes >> (r + 1);
      const int count = (kPadded >> r) > 1 ? (kPadded >> r) : 1;  // values each lane still holds
      const bool upper = (lane & mask) != 0;
#pragma unroll
      for (int i = 0; i < (kPadded + 1) / 2; ++i) {
        if (count > 1 && i < count / 2) {
          // The upper lane swaps the halves in place, so both send their upper slot: as few
          // registers live as in a butterfly.
          const float low = held[i];
          held[i] = upper ? held[i + count / 2] : low;
          held[i + count / 2] = upper ? low : held[i + count / 2];
          held[i] = fmaxf(held[i], __shfl_xor_sync(kFullWarpMask, held[i + count / 2], mask));
        } else if (count == 1 && i == 0) {
          held[0] = fmaxf(held[0], __shfl_xor_sync(kFullWarpMask, held[0], mask));
        }
      }
    }
    return held[0];
  }
  // The value whose maximum lane `lane` holds, and the first lane holding value i.
  __device__ __forceinline__ static int value_of_lane(int lane) {
    return (lane & (kLanes - 1)) / kReplicas;
  }
  __device__ __forceinline__ static int lane_of_value(int lane, int i) {
    return (lane & ~(kLanes - 1)) + i * kReplicas;
  }
};

__device__ __forceinline__ float2 warp_allreduce_sum2(float2 value) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) {
    value.x += __shfl_xor_sync(kFullWarpMask, value.x, mask);
    value.y += __shfl_xor_sync(kFullWarpMask, value.y, mask);
  }
  return value;
}

// All-reduce over a group of kWarps consecutive warps (e.g. the threads that own one row), one of
// kGroups such groups that make up the block.
//
// Every thread of the GROUP must call it the same number of times (it holds a barrier when
// kWarps > 1). A block of one group uses __syncthreads; with 2 to 15 groups each group syncs on
// its own named barrier (1 + group index, the group's threads only), so a group never waits for
// the others' rows: with block-wide barriers every reduction of every row stalled the whole block
// (more groups than named barriers: __syncthreads, and every thread of the block must call).
// Each group owns two scratch slots of kWarps float2 and alternates between them, so back-to-back
// reductions need only one barrier each: a slot is rewritten two calls later, after the barrier
// of the call in between has ordered every read of it.
// Slot is float2, or float4 for allreduce_sum4.
template <int kWarps, int kGroups = 1, typename Slot = float2>
class GroupReducer {
 public:
  static_assert(kGroups >= 1, "a block holds at least one group");

  // scratch: 2 * kWarps slots owned by this group (unused when kWarps == 1); group: the index of
  // this thread's group in the block (its warps are warps kWarps * group ...).
  __device__ __forceinline__ GroupReducer(Slot* scratch, int group)
      : scratch_(scratch), group_(group) {}

  template <typename Op>
  __device__ __forceinline__ float allreduce(float value, Op op) {
    value = warp_allreduce(value, op);
    if constexpr (kWarps > 1) {
      float2* slot = next_slot();
      const int warp = warp_in_group();
      if ((threadIdx.x & 31) == 0) slot[warp].x = value;
      sync_group();
      value = slot[0].x;
#pragma unroll
      for (int w = 1; w < kWarps; ++w) value = op(value, slot[w].x);
    }
    return value;
  }

  // Two sums in one pass (one barrier instead of two).
  __device__ __forceinline__ float2 allreduce_sum2(float2 value) {
    value = warp_allreduce_sum2(value);
    if constexpr (kWarps > 1) {
      Slot* slot = next_slot();
      const int warp = warp_in_group();
      if ((threadIdx.x & 31) == 0) {
        slot[warp].x = value.x;
        slot[warp].y = value.y;
      }
      sync_group();
      value = make_float2(slot[0].x, slot[0].y);
#pragma unroll
      for (int w = 1; w < kWarps; ++w) {
        value.x += slot[w].x;
        value.y += slot[w].y;
      }
    }
    return value;
  }

  // Four sums in one pass (float4 slots).
  __device__ __forceinline__ float4 allreduce_sum4(float4 value) {
    static_assert(sizeof(Slot) == sizeof(float4), "allreduce_sum4 needs float4 slots");
    const float2 low = warp_allreduce_sum2(make_float2(value.x, value.y));
    const float2 high = warp_allreduce_sum2(make_float2(value.z, value.w));
    value = make_float4(low.x, low.y, high.x, high.y);
    if constexpr (kWarps > 1) {
      Slot* slot = next_slot();
      const int warp = warp_in_group();
      if ((threadIdx.x & 31) == 0) slot[warp] = value;
      sync_group();
      value = slot[0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) {
        value.x += slot[w].x;
        value.y += slot[w].y;
        value.z += slot[w].z;
        value.w += slot[w].w;
      }
    }
    return value;
  }

 private:
  __device__ __forceinline__ Slot* next_slot() {
    Slot* slot = scratch_ + parity_ * kWarps;
    parity_ ^= 1;
    return slot;
  }
  __device__ __forceinline__ static int warp_in_group() { return (threadIdx.x >> 5) % kWarps; }
  // Named barriers 1..15 (0 is __syncthreads); a block of more groups than that syncs whole.
  __device__ __forceinline__ void sync_group() const {
    if constexpr (kGroups == 1 || kGroups > 15) {
      __syncthreads();
    } else {
      asm volatile("bar.sync %0, %1;" ::"r"(1 + group_), "r"(kWarps * 32) : "memory");
    }
  }

  Slot* scratch_;
  int group_;
  int parity_ = 0;
};

// Reduction of one value per thread over a whole block of kThreads threads; the result is valid in
// every thread. scratch: kThreads / 32 floats. Holds two barriers (the second makes the scratch
// reusable by the caller right after).
template <int kThreads, typename Op>
__device__ __forceinline__ float block_allreduce(float value, float* scratch, Op op) {
  static_assert(kThreads % 32 == 0, "block size must be whole warps");
  constexpr int kWarps = kThreads / 32;
  value = warp_allreduce(value, op);
  if constexpr (kWarps > 1) {
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = value;
    __syncthreads();
    value = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) value = op(value, scratch[w]);
    __syncthreads();
  }
  return value;
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_REDUCE_CUH_
