// The row shape shared by the norm kernels (templates/norm.cuh, templates/norm_backward.cuh): a
// group of threads per row, 16-byte vectors, the row held in registers; derived from
// launch_rules.h.
#ifndef OPFUSE_TEMPLATES_COMMON_NORM_SHAPE_CUH_
#define OPFUSE_TEMPLATES_COMMON_NORM_SHAPE_CUH_

#include "launch_rules.h"
#include "types.cuh"

namespace opfuse {

// Row shape of a norm kernel, derived from launch_rules.h.
template <typename Input, int kHidden, int kMaxVecsPerThread, int kRowsPerBlockOverride = 0>
struct NormShape {
  static constexpr int kInputBytes = static_cast<int>(sizeof(Input));
  static constexpr int kVec = launch::vector_elems(kInputBytes);
  static constexpr int kVecsPerRow = kHidden / kVec;
  static constexpr int kVecsPerThread =
      launch::norm_vecs_per_thread(kHidden, kInputBytes, kMaxVecsPerThread);
  static constexpr int kThreadsPerRow =
      launch::norm_threads_per_row(kHidden, kInputBytes, kMaxVecsPerThread);
  static constexpr int kRowsPerBlock = kRowsPerBlockOverride > 0
                                           ? kRowsPerBlockOverride
                                           : launch::norm_rows_per_block(kHidden, kInputBytes,
                                                                         kMaxVecsPerThread);
  static constexpr int kBlockThreads = kThreadsPerRow * kRowsPerBlock;
  static constexpr int kWarpsPerRow = kThreadsPerRow / 32;
  // Some threads own fewer vectors when the row does not split evenly.
  static constexpr bool kHasIdleSlots = kThreadsPerRow * kVecsPerThread != kVecsPerRow;

  static_assert(kHidden > 0 && kHidden % kVec == 0,
                "norm hidden size must be a multiple of 16 bytes of the input dtype "
                "(8 elements for bf16/fp16, 4 for fp32)");
  static_assert(kThreadsPerRow <= launch::kNormMaxThreadsPerRow, "row too wide for one block");

  // Vector index (within the row) of slot v of thread t: lanes take consecutive vectors, so
  // every warp access is contiguous.
  __device__ __forceinline__ static int vector_index(int thread_in_row, int slot) {
    return thread_in_row + slot * kThreadsPerRow;
  }
  __device__ __forceinline__ static bool slot_in_row(int vector) {
    return !kHasIdleSlots || vector < kVecsPerRow;
  }
};

template <typename Input, int kHidden, bool kWriteTranspose = false>
using NormFwdShape =
    NormShape<Input, kHidden, launch::kNormFwdMaxVecsPerThread,
              launch::norm_fwd_rows_per_block(kHidden, sizeof(Input), kWriteTranspose)>;
template <typename Input, int kHidden>
using NormBwdShape = NormShape<Input, kHidden, launch::kNormBwdMaxVecsPerThread>;

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_NORM_SHAPE_CUH_
