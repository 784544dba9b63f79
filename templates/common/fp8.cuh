// FP8 conversion and amax helpers.
//
// Conversions go through cuda_fp8.h's __nv_cvt_* functions with __NV_SATFINITE and
// round-to-nearest-even: on sm_89+ they lower to the hardware cvt.rn.satfinite instruction, and the
// same functions are __host__ __device__, so a CPU reference calling them gets identical bits.
// The value converted is always __fmul_rn(value, scale): an explicitly rounded product that the
// compiler cannot contract into a neighbouring FMA, so the CPU reference can form it the same way.
#ifndef OPFUSE_TEMPLATES_COMMON_FP8_CUH_
#define OPFUSE_TEMPLATES_COMMON_FP8_CUH_

#include "reduce.cuh"
#include "types.cuh"

namespace opfuse {

// value * scale, rounded once (never fused with another operation).
__device__ __forceinline__ float apply_scale(float value, float scale) {
  return __fmul_rn(value, scale);
}

// One already-scaled float to FP8 bits, saturating to the format's finite range.
template <typename Fp8>
__host__ __device__ __forceinline__ __nv_fp8_storage_t float_to_fp8_bits(float scaled) {
  static_assert(DtypeTraits<Fp8>::kIsFp8, "float_to_fp8_bits needs an FP8 type");
  return __nv_cvt_float_to_fp8(scaled, __NV_SATFINITE, DtypeTraits<Fp8>::kInterpretation);
}

// Two already-scaled floats to FP8 in one instruction; `low` lands in the low byte.
template <typename Fp8>
__device__ __forceinline__ __nv_fp8x2_storage_t float2_to_fp8x2_bits(float low, float high) {
  static_assert(DtypeTraits<Fp8>::kIsFp8, "float2_to_fp8x2_bits needs an FP8 type");
  return __nv_cvt_float2_to_fp8x2(make_float2(low, high), __NV_SATFINITE,
                                  DtypeTraits<Fp8>::kInterpretation);
}

// Running amax of one thread: largest |value| seen (NaN is ignored, as fmaxf does in TE).
__device__ __forceinline__ float accumulate_amax(float amax, float value) {
  return fmaxf(amax, fabsf(value));
}

// The amax a kernel publishes for its output: of the values before scaling for an FP8 output
// (delayed scaling's definition), else of the values as stored. Rounding to nearest is monotone
// and odd, so the rounded running max equals the max of the rounded values: what amax_reduce
// measures reading the output back (current scaling's amax of the cast's input).
template <typename Output>
__device__ __forceinline__ float published_amax(float amax) {
  if constexpr (DtypeTraits<Output>::kIsFp8) {
    return amax;
  } else {
    return to_float(from_float<Output>(amax));
  }
}

// atomicMax on the int bits of a float: for non-negative floats (every amax) the int order of the
// bit patterns equals the float order, and an int atomic is a single native instruction.
__device__ __forceinline__ void atomic_max_nonnegative(float* address, float value) {
  atomicMax(reinterpret_cast<int*>(address), __float_as_int(value));
}

// Reduces each thread's amax over the block and publishes it with one atomic from thread 0.
// Every thread of the block must call it (it holds barriers); amax == nullptr publishes nothing.
// scratch: kThreads / 32 floats.
template <int kThreads>
__device__ __forceinline__ void commit_block_amax(float thread_amax, float* amax, float* scratch) {
  if (amax == nullptr) return;  // uniform across the block: a kernel parameter
  const float block_amax = block_allreduce<kThreads>(thread_amax, scratch, MaxOp{});
  // A zero would not change the stored maximum (amax buffers start at 0): skip the atomic.
  if (threadIdx.x == 0 && block_amax > 0.0f) atomic_max_nonnegative(amax, block_amax);
}

// A block's amax commit split around a barrier the kernel holds anyway: every thread calls
// publish_warp_amax before the barrier (each warp's max into scratch[warp]), then
// commit_published_amax after it (thread 0 takes the max over the warps and raises *amax). Same
// result as commit_block_amax, without its two barriers. scratch: one float per warp.
__device__ __forceinline__ void publish_warp_amax(float thread_amax, float* scratch) {
  const float warp_amax = warp_allreduce(thread_amax, MaxOp{});
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = warp_amax;
}
template <int kWarps>
__device__ __forceinline__ void commit_published_amax(float* amax, const float* scratch) {
  if (threadIdx.x != 0) return;
  float block_amax = scratch[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) block_amax = fmaxf(block_amax, scratch[w]);
  if (block_amax > 0.0f) atomic_max_nonnegative(amax, block_amax);
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_FP8_CUH_
