// Bit-exact CPU emulation of the storage dtypes the GPU kernels write: bf16, fp16 and the two FP8
// formats. This is the oracle GPU kernels are checked against bit for bit, so every rule below
// copies what CUDA's own conversions do (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h), without needing
// those headers (docs/design.md, "FP8 facts"). The narrowing and widening rules were
// also checked exhaustively, all 2^32 floats, against the H200's cvt instructions: no difference.
//
// Rounding is always to nearest, ties to even. Where the formats differ:
//   - bf16 / fp16 (like __float2bfloat16_rn / __float2half_rn): overflow gives +-Inf, any NaN
//     gives the canonical quiet NaN 0x7FFF (sign and payload dropped).
//   - FP8 (like __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt)): |x| beyond the format's max and
//     +-Inf give +-max; any NaN gives 0x7F in both formats (cuda_fp8.h canonicalises the input
//     NaN first, so sign and payload are dropped); subnormals are produced; -0 stays -0.
//   - Widening to float is exact; a NaN read from fp16 or FP8 becomes the canonical 0x7FFFFFFF
//     (cuda_fp16.h drops its sign and payload); bf16 widens by a plain shift, keeping both.
#pragma once

#include <cstdint>
#include <span>

namespace opfuse::cpu {

enum class Fp8Format { E4M3, E5M2 };

uint16_t float_to_bf16(float value);
float bf16_to_float(uint16_t bits);

uint16_t float_to_fp16(float value);
float fp16_to_float(uint16_t bits);

uint8_t float_to_fp8(float value, Fp8Format format);
float fp8_to_float(uint8_t bits, Fp8Format format);

// Largest finite value: 448 for E4M3, 57344 for E5M2.
float fp8_max(Fp8Format format);

// In place: every element becomes the float value of its bf16 (fp16) rounding, i.e. what a kernel
// storing the tensor in that dtype and reading it back would see.
void round_to_bf16(std::span<float> values);
void round_to_fp16(std::span<float> values);

// out[i] = fp8(in[i] * scale), the product taken in fp32 as TE's cast kernels do. When amax_out is
// not null it receives max |in[i]| over this call (0 for an empty input), reduced with fmaxf
// semantics like TE's amax (fmaxf(fabsf(x), amax) from 0): a NaN element is skipped, never
// returned, and an Inf element gives Inf, which the scale update then refuses to use.
// `out` must have the size of `in`.
void quantize_fp8(std::span<const float> in, float scale, Fp8Format format, std::span<uint8_t> out,
                  float* amax_out);

// out[i] = float(in[i]) * scale_inv in fp32 (TE's dequantize). `out` must have the size of `in`.
void dequantize_fp8(std::span<const uint8_t> in, float scale_inv, Fp8Format format,
                    std::span<float> out);

}  // namespace opfuse::cpu
