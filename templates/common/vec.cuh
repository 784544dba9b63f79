// Aligned vector types: N elements loaded or stored with the widest global access their size
// allows (16 bytes -> LDG.128/STG.128), and their conversion to and from fp32.
//
// Callers guarantee alignment: the pointer of a Vec<T, N> access is aligned to N * sizeof(T)
// (templates/README.md lists, per family, the shape rules that make this true).
#ifndef OPFUSE_TEMPLATES_COMMON_VEC_CUH_
#define OPFUSE_TEMPLATES_COMMON_VEC_CUH_

#include "fp8.cuh"
#include "types.cuh"

namespace opfuse {

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  static_assert((N & (N - 1)) == 0, "vector length must be a power of two");
  T elems[N];
};

namespace detail {

// The unsigned type of a raw access of kBytes bytes (kBytes <= 16).
template <int kBytes>
struct RawAccess;
template <>
struct RawAccess<16> {
  using Type = uint4;
};
template <>
struct RawAccess<8> {
  using Type = uint2;
};
template <>
struct RawAccess<4> {
  using Type = unsigned int;
};
template <>
struct RawAccess<2> {
  using Type = unsigned short;
};
template <>
struct RawAccess<1> {
  using Type = unsigned char;
};

template <typename T, int N>
__host__ __device__ constexpr int vec_chunk_bytes() {
  return sizeof(T) * N < 16 ? static_cast<int>(sizeof(T) * N) : 16;
}

}  // namespace detail

// Makes the compiler treat a vector's bits as unknown (an empty asm that "changes" each 32-bit
// word): values computed from it before and after are not recognised as equal, so a kernel that
// recomputes them after a barrier does not get them held in registers across it instead.
template <typename T, int N>
__device__ __forceinline__ void hide_from_optimizer(Vec<T, N>& value) {
  static_assert(sizeof(Vec<T, N>) % 4 == 0, "whole 32-bit words");
  unsigned int* words = reinterpret_cast<unsigned int*>(&value);
#pragma unroll
  for (int w = 0; w < static_cast<int>(sizeof(Vec<T, N>) / 4); ++w) {
    asm("" : "+r"(words[w]));
  }
}
// The same for an int (e.g. an offset of zero that makes a later load a new one).
__device__ __forceinline__ void hide_from_optimizer(int& value) { asm("" : "+r"(value)); }

// Read-only load through the non-coherent path (the inputs of a kernel are never written by it).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* ptr) {
  constexpr int kChunk = detail::vec_chunk_bytes<T, N>();
  using Raw = typename detail::RawAccess<kChunk>::Type;
  Vec<T, N> result;
  const Raw* src = reinterpret_cast<const Raw*>(ptr);
  Raw* dst = reinterpret_cast<Raw*>(&result);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) * N) / kChunk; ++i) dst[i] = __ldg(src + i);
  return result;
}

// All-zero vector, written as raw words (element-wise writes of 2-byte types can force the
// vector into local memory).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> zero_vec() {
  constexpr int kChunk = detail::vec_chunk_bytes<T, N>();
  using Raw = typename detail::RawAccess<kChunk>::Type;
  Vec<T, N> result;
  Raw* dst = reinterpret_cast<Raw*>(&result);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) * N) / kChunk; ++i) dst[i] = Raw{};
  return result;
}

// Plain load (for buffers the same kernel may have written, e.g. shared memory).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec_coherent(const T* ptr) {
  constexpr int kChunk = detail::vec_chunk_bytes<T, N>();
  using Raw = typename detail::RawAccess<kChunk>::Type;
  Vec<T, N> result;
  const Raw* src = reinterpret_cast<const Raw*>(ptr);
  Raw* dst = reinterpret_cast<Raw*>(&result);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) * N) / kChunk; ++i) dst[i] = src[i];
  return result;
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* ptr, const Vec<T, N>& value) {
  constexpr int kChunk = detail::vec_chunk_bytes<T, N>();
  using Raw = typename detail::RawAccess<kChunk>::Type;
  Raw* dst = reinterpret_cast<Raw*>(ptr);
  const Raw* src = reinterpret_cast<const Raw*>(&value);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) * N) / kChunk; ++i) dst[i] = src[i];
}

// Widening of a whole vector; pairs convert with one instruction where the dtype has one.
template <typename T, int N>
__device__ __forceinline__ void vec_to_float(const Vec<T, N>& value, float (&out)[N]) {
  if constexpr (kIsSame<T, __nv_bfloat16> && N % 2 == 0) {
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&value);
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float2 pair = __bfloat1622float2(pairs[i / 2]);
      out[i] = pair.x;
      out[i + 1] = pair.y;
    }
  } else if constexpr (kIsSame<T, __half> && N % 2 == 0) {
    const __half2* pairs = reinterpret_cast<const __half2*>(&value);
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float2 pair = __half22float2(pairs[i / 2]);
      out[i] = pair.x;
      out[i + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(value.elems[i]);
  }
}

// Narrowing of a whole vector. Non-FP8 dtypes round to nearest even; FP8 dtypes convert
// apply_scale(in[i], scale) with saturation (scale is ignored for non-FP8 dtypes).
template <typename T, int N>
__device__ __forceinline__ Vec<T, N> float_to_vec(const float (&in)[N], float scale) {
  Vec<T, N> result;
  if constexpr (DtypeTraits<T>::kIsFp8) {
    static_assert(N % 2 == 0, "FP8 vectors convert in pairs");
    __nv_fp8x2_storage_t* pairs = reinterpret_cast<__nv_fp8x2_storage_t*>(&result);
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      pairs[i / 2] =
          float2_to_fp8x2_bits<T>(apply_scale(in[i], scale), apply_scale(in[i + 1], scale));
    }
  } else if constexpr (kIsSame<T, __nv_bfloat16> && N % 2 == 0) {
    __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&result);
#pragma unroll
    for (int i = 0; i < N; i += 2)
      pairs[i / 2] = __float22bfloat162_rn(make_float2(in[i], in[i + 1]));
  } else if constexpr (kIsSame<T, __half> && N % 2 == 0) {
    __half2* pairs = reinterpret_cast<__half2*>(&result);
#pragma unroll
    for (int i = 0; i < N; i += 2) pairs[i / 2] = __float22half2_rn(make_float2(in[i], in[i + 1]));
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) result.elems[i] = from_float<T>(in[i]);
  }
  return result;
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_VEC_CUH_
