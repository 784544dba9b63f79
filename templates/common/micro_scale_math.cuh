// Device arithmetic of the micro-scaled formats (MXFP8's E8M0 exponents, NVFP4's E2M1 codes and
// E4M3 block scales, the random Hadamard transform, stochastic rounding). Every function is the
// device twin of one in runtime/cpu/micro_scaling.h, operation for operation (each fp32 operation
// an explicit __f*_rn, so nothing is contracted), which is what makes the kernels of
// micro_scale.cuh bit-exact with that oracle. quant_stats.cuh uses the E8M0 exponent too.
#ifndef OPFUSE_TEMPLATES_COMMON_MICRO_SCALE_MATH_CUH_
#define OPFUSE_TEMPLATES_COMMON_MICRO_SCALE_MATH_CUH_

#include "fp8.cuh"
#include "launch_rules.h"
#include "types.cuh"

namespace opfuse {

// MXFP8's shared exponent of `value` (amax / fp8_max), rounded up (TE's float_to_e8m0, sm_100's
// cvt.rp.satfinite.ue8m0x2.f32): NaN -> 0xFF, Inf -> 0xFE, 0 -> 0; the biased fp32 exponent, plus
// 1 if a mantissa bit is set, except for subnormals <= 2^-127 (E8M0's 0); at most 0xFE.
__device__ __forceinline__ int e8m0_round_up(float value) {
  if (is_nan_float(value)) return 0xFF;
  const unsigned int bits = __float_as_uint(value) & 0x7FFFFFFFu;
  if (bits == 0x7F800000u) return 0xFE;
  if (bits == 0) return 0;
  int e = static_cast<int>(bits >> 23);
  const unsigned int mantissa = bits & 0x7FFFFFu;
  if (mantissa != 0 && e != 0xFE && !(e == 0 && mantissa <= 0x400000u)) ++e;
  return e;
}

// 2^k for -127 <= k <= 127, from its bits (2^-127 is subnormal).
__device__ __forceinline__ float pow2_float(int k) {
  return k >= -126 ? __uint_as_float(static_cast<unsigned int>(k + 127) << 23)
                   : __uint_as_float(0x00400000u);
}

// The E2M1 code of v rounded to nearest even with saturation (cuda_fp4.h's rules: sign kept,
// NaN -> +6). Hopper has no E2M1 convert instruction; sm_100's cvt.rn.satfinite.e2m1x2.f32 gives
// the same codes.
__device__ __forceinline__ unsigned int e2m1_rne(float v) {
  if (is_nan_float(v)) return 0x7u;
  const float a = fabsf(v);
  unsigned int code = a <= 0.25f ? 0u : 1u;
  code += a >= 0.75f ? 1u : 0u;
  code += a > 1.25f ? 1u : 0u;
  code += a >= 1.75f ? 1u : 0u;
  code += a > 2.5f ? 1u : 0u;
  code += a >= 3.5f ? 1u : 0u;
  code += a > 5.0f ? 1u : 0u;
  return code | ((__float_as_uint(v) >> 28) & 0x8u);
}

// Stochastic rounding (runtime/cpu/micro_scaling.h, e2m1_stochastic): |v| in [lo, hi) rounds up
// when float(bits >> 8) * 2^-24 < (|v| - lo) * (1 / (hi - lo)); all exact.
__device__ __forceinline__ unsigned int e2m1_stochastic(float v, unsigned int bits) {
  if (is_nan_float(v)) return 0x7u;
  const float a = fabsf(v);
  unsigned int code = 7u;
  if (a < 6.0f) {
    // The magnitude below a: lo, its code k, and 1 / (hi - lo).
    unsigned int k;
    float lo, inverse_step;
    if (a < 2.0f) {
      k = static_cast<unsigned int>(__float2int_rz(__fmul_rn(a, 2.0f)));  // 0..3
      lo = __fmul_rn(static_cast<float>(k), 0.5f);
      inverse_step = 2.0f;
    } else if (a < 4.0f) {
      k = a < 3.0f ? 4u : 5u;
      lo = a < 3.0f ? 2.0f : 3.0f;
      inverse_step = 1.0f;
    } else {
      k = 6u;
      lo = 4.0f;
      inverse_step = 0.5f;
    }
    const float fraction = __fmul_rn(__fsub_rn(a, lo), inverse_step);
    const float draw = __fmul_rn(static_cast<float>(bits >> 8), 5.9604644775390625e-08f);  // 2^-24
    code = draw < fraction ? k + 1u : k;
  }
  return code | ((__float_as_uint(v) >> 28) & 0x8u);
}

// The value of an E2M1 code (low 4 bits).
__device__ __forceinline__ float e2m1_to_float(unsigned int code) {
  const unsigned int magnitude = code & 0x7u;
  // 0, 0.5, 1, 1.5 are magnitude / 2; 2, 3, 4, 6 are (2 + (m & 1)) * 2^((m >> 1) - 2).
  const float value = magnitude < 4u
                          ? __fmul_rn(static_cast<float>(magnitude), 0.5f)
                          : static_cast<float>((2u + (magnitude & 1u)) << ((magnitude >> 1) - 2u));
  return (code & 0x8u) != 0u ? -value : value;
}

// fl(1 / 6), TE's fp4_max_inv.
inline constexpr float kInverseE2m1Max = 1.0f / 6.0f;
// TE's fixed signs of the random Hadamard transform: bit k set, D[k][k] = -1.
inline constexpr unsigned int kRhtSignMask = 0xD7E8u;

// NVFP4's E4M3 block scale s_b of a block (TE's compute_decoding_scaling_factor):
// e4m3_satfinite_rne(block_amax * (S_enc * fl(1/6))).
__device__ __forceinline__ __nv_fp8_storage_t nvfp4_block_scale(float block_amax,
                                                                float tensor_scale) {
  const float multiplier = __fmul_rn(tensor_scale, kInverseE2m1Max);
  return __nv_cvt_float_to_fp8(__fmul_rn(block_amax, multiplier), __NV_SATFINITE, __NV_E4M3);
}

// The block's encode multiplier min(1 / (float(s_b) * S_dec), FLT_MAX) (TE's block_scale_inverse).
__device__ __forceinline__ float nvfp4_encode_multiplier(float block_scale, float tensor_decode) {
  return fminf(__fdiv_rn(1.0f, __fmul_rn(block_scale, tensor_decode)), kFloatMax);
}

// (H16 D / 4) v in place: signs, four butterfly stages (h = 1, 2, 4, 8: (v[j], v[j + h]) ->
// (v[j] + v[j + h], v[j] - v[j + h]) for (j & h) == 0), then * 0.25; runtime/cpu's rht16.
__device__ __forceinline__ void rht16(float (&v)[16]) {
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    if (((kRhtSignMask >> k) & 1u) != 0u) v[k] = -v[k];
  }
#pragma unroll
  for (int h = 1; h < 16; h *= 2) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if ((j & h) == 0) {
        const float a = v[j], b = v[j + h];
        v[j] = __fadd_rn(a, b);
        v[j + h] = __fsub_rn(a, b);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 16; ++k) v[k] = __fmul_rn(v[k], 0.25f);
}

// One block's scale and one element's code and decoded value, shared by micro_scale.cuh's casts
// and the norm that writes its output's MXFP8 copy (norm.cuh).
namespace detail {

template <int kFormat>
struct MicroFp8;
template <>
struct MicroFp8<launch::kMicroScaleE4M3> {
  using Type = __nv_fp8_e4m3;
};
template <>
struct MicroFp8<launch::kMicroScaleE5M2> {
  using Type = __nv_fp8_e5m2;
};
template <>
struct MicroFp8<launch::kMicroScaleE2M1> {
  using Type = __nv_fp8_e4m3;  // the block scales' type
};

// The value of FP8 bits.
template <typename Fp8>
__device__ __forceinline__ float fp8_bits_to_float(unsigned int bits) {
  Fp8 value;
  value.__x = static_cast<__nv_fp8_storage_t>(bits);
  return to_float(value);
}

// The scale of one block and what decoding needs of it.
struct MicroBlockScale {
  unsigned int bits;  // E8M0 exponent or E4M3 bits, as stored
  float multiplier;   // x * multiplier is cast
  float decode;       // MXFP8: 2^(e - 127); NVFP4: float(s_b)
  bool zero;          // NVFP4: s_b == 0, the block's codes are 0
};

// An MXFP8 block's scale from its E8M0 exponent e (what micro_block_scale derives from the amax).
__device__ __forceinline__ MicroBlockScale mxfp8_block_scale(int e) {
  return {static_cast<unsigned int>(e), pow2_float(127 - e), pow2_float(e - 127), false};
}

template <int kFormat>
__device__ __forceinline__ MicroBlockScale micro_block_scale(float amax, float tensor_scale,
                                                             float tensor_decode) {
  if constexpr (kFormat == launch::kMicroScaleE2M1) {
    const unsigned int bits = nvfp4_block_scale(amax, tensor_scale);
    const float block = fp8_bits_to_float<__nv_fp8_e4m3>(bits);
    return {bits, nvfp4_encode_multiplier(block, tensor_decode), block, block == 0.0f};
  } else {
    constexpr float kFp8Max = DtypeTraits<typename MicroFp8<kFormat>::Type>::kMax;
    // Never 0xFF: amax skips NaN.
    return mxfp8_block_scale(e8m0_round_up(__fdiv_rn(amax, kFp8Max)));
  }
}

// One element: its code (FP8 bits, or the E2M1 code in the low 4 bits) and decoded value.
template <int kFormat, bool kStochastic>
__device__ __forceinline__ unsigned int micro_encode(float v, const MicroBlockScale& s,
                                                     unsigned int random_bits) {
  const float scaled = __fmul_rn(v, s.multiplier);
  if constexpr (kFormat == launch::kMicroScaleE2M1) {
    if (s.zero) return 0u;
    return kStochastic ? e2m1_stochastic(scaled, random_bits) : e2m1_rne(scaled);
  } else {
    return float_to_fp8_bits<typename MicroFp8<kFormat>::Type>(scaled);
  }
}
template <int kFormat>
__device__ __forceinline__ float micro_decode(unsigned int code, const MicroBlockScale& s,
                                              float tensor_decode) {
  if constexpr (kFormat == launch::kMicroScaleE2M1) {
    return __fmul_rn(__fmul_rn(e2m1_to_float(code), s.decode), tensor_decode);
  } else {
    return __fmul_rn(fp8_bits_to_float<typename MicroFp8<kFormat>::Type>(code), s.decode);
  }
}

// Each of kN values of one block quantized with `s` (no stochastic rounding, no tensor scale:
// MXFP8) and decoded back: the decoded copy the producers of note "Emulated micro-scaling" write.
template <int kFormat, int kN>
__device__ __forceinline__ void micro_fake_quantize(float (&values)[kN], const MicroBlockScale& s) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
    values[j] = micro_decode<kFormat>(micro_encode<kFormat, false>(values[j], s, 0u), s, 1.0f);
}

}  // namespace detail

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_MICRO_SCALE_MATH_CUH_
