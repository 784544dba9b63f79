// Asynchronous copies from global to shared memory (cp.async, sm_80 and later), for kernels that
// stage a whole tile in shared memory (block_activation.cuh). A header of its own: the host
// emulation of tests/support/cuda_host_emulation.h, which other templates run under, has no
// cp.async.
#ifndef OPFUSE_TEMPLATES_COMMON_ASYNC_COPY_CUH_
#define OPFUSE_TEMPLATES_COMMON_ASYNC_COPY_CUH_

namespace opfuse {

// 16-byte copies: in flight they hold no registers, so a block can have a whole tile's loads
// outstanding. Both addresses 16-byte aligned; `valid` false writes 16 zero bytes and reads nothing
// (src must still be a mapped address). The copies a thread issued are visible to that thread after
// copy_async_wait; to other threads only after a barrier as well.
__device__ __forceinline__ void copy_async_16(void* shared_dst, const void* global_src,
                                              bool valid) {
  const unsigned int dst = static_cast<unsigned int>(__cvta_generic_to_shared(shared_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global_src),
               "r"(src_bytes)
               : "memory");
}
// Closes the group of the copies issued since the last commit.
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending committed groups (the newest) are still in flight.
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// The same for a count that folds to a constant (an unrolled loop's index) but is no template
// argument; more than 7 waits for 7.
__device__ __forceinline__ void copy_async_wait(int pending) {
  if (pending <= 0) return copy_async_wait<0>();
  if (pending == 1) return copy_async_wait<1>();
  if (pending == 2) return copy_async_wait<2>();
  if (pending == 3) return copy_async_wait<3>();
  if (pending == 4) return copy_async_wait<4>();
  if (pending == 5) return copy_async_wait<5>();
  if (pending == 6) return copy_async_wait<6>();
  copy_async_wait<7>();
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_ASYNC_COPY_CUH_
