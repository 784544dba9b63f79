// Dtype traits and scalar float conversions for the kernel templates.
//
// Kernels compute in fp32; storage dtypes are bf16 (__nv_bfloat16), fp16 (__half), fp32 and the
// two FP8 formats (__nv_fp8_e4m3, __nv_fp8_e5m2). Only CUDA's own fp headers are included so the
// file compiles under NVRTC as well as with nvcc.
#ifndef OPFUSE_TEMPLATES_COMMON_TYPES_CUH_
#define OPFUSE_TEMPLATES_COMMON_TYPES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace opfuse {

// Type equality without <type_traits> (NVRTC has no host standard library).
template <typename A, typename B>
struct IsSame {
  static constexpr bool value = false;
};
template <typename A>
struct IsSame<A, A> {
  static constexpr bool value = true;
};
template <typename A, typename B>
constexpr bool kIsSame = IsSame<A, B>::value;

// Largest finite float; an infinite scale is clamped to it (TE's convention).
inline constexpr float kFloatMax = 3.402823466e+38f;

// Compile-time facts about a storage dtype. FP8 formats also carry their largest finite value and
// the cuda_fp8.h interpretation used for conversions.
template <typename T>
struct DtypeTraits;

template <>
struct DtypeTraits<float> {
  static constexpr bool kIsFp8 = false;
  static constexpr int kBytes = 4;
};
template <>
struct DtypeTraits<__nv_bfloat16> {
  static constexpr bool kIsFp8 = false;
  static constexpr int kBytes = 2;
};
template <>
struct DtypeTraits<__half> {
  static constexpr bool kIsFp8 = false;
  static constexpr int kBytes = 2;
};
template <>
struct DtypeTraits<__nv_fp8_e4m3> {
  static constexpr bool kIsFp8 = true;
  static constexpr int kBytes = 1;
  static constexpr float kMax = 448.0f;
  static constexpr __nv_fp8_interpretation_t kInterpretation = __NV_E4M3;
};
template <>
struct DtypeTraits<__nv_fp8_e5m2> {
  static constexpr bool kIsFp8 = true;
  static constexpr int kBytes = 1;
  static constexpr float kMax = 57344.0f;
  static constexpr __nv_fp8_interpretation_t kInterpretation = __NV_E5M2;
};

// Scalar widening to fp32 (exact for every supported dtype).
__device__ __forceinline__ float to_float(float value) { return value; }
__device__ __forceinline__ float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }
__device__ __forceinline__ float to_float(__half value) { return __half2float(value); }
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 value) { return static_cast<float>(value); }
__device__ __forceinline__ float to_float(__nv_fp8_e5m2 value) { return static_cast<float>(value); }

// Scalar narrowing with round-to-nearest-even for the non-FP8 dtypes. FP8 narrowing needs a
// saturation choice and a scale, so it lives in fp8.cuh.
template <typename T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ float from_float<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float value) {
  return __float2half_rn(value);
}

// Bit-level float classification: exact, and independent of fast-math flags or math headers.
__host__ __device__ __forceinline__ unsigned int float_bits(float value) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(value);
#else
  unsigned int bits;
  __builtin_memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}
__host__ __device__ __forceinline__ bool is_finite_float(float value) {
  return (float_bits(value) & 0x7F800000u) != 0x7F800000u;
}
__host__ __device__ __forceinline__ bool is_nan_float(float value) {
  return (float_bits(value) & 0x7FFFFFFFu) > 0x7F800000u;
}
__host__ __device__ __forceinline__ bool is_inf_float(float value) {
  return (float_bits(value) & 0x7FFFFFFFu) == 0x7F800000u;
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_TYPES_CUH_
