// Micro-scaled formats on the CPU: MXFP8 (OCP microscaling, E8M0 scales per 32 elements) and
// NVFP4 (E2M1 values, E4M3 scales per 16 elements and one FP32 tensor scale), with NVFP4's random
// Hadamard transform and stochastic rounding. On H100/H200 these recipes run by emulation: each
// GEMM operand is quantized and dequantized (fake_quantize below), then a BF16 GEMM runs. This is
// the oracle the GPU kernels of templates/micro_scale.cuh are checked against bit for bit, and the
// CPU reference's cast. Every rule is a sequence of IEEE fp32 operations, each rounded once (no
// contraction), so the device can repeat it exactly; templates/README.md ("Micro-scaled casts")
// states the same rules for the kernels.
//
// Sources are row-major [rows, cols] float arrays whose values are already rounded to the source
// dtype. Block amaxes are fmaxf over |x| from 0: a NaN element is skipped (it still casts, below).
//
// MXFP8 (TE's quantize_mxfp8 and float_to_e8m0; OCP MX v1.0):
//   e = e8m0_round_up(block_amax / fp8_max) (IEEE division), q = fp8_satfinite_rne(x * 2^(127-e))
//   (the multiplier exact, the product rounded once), decoded fp8(q) * 2^(e - 127) in fp32.
//   A zero block: e = 0, codes 0. An Inf element: amax Inf, e = 0xFE, the Inf saturates to
//   +-fp8_max and every finite element of its block becomes 0 (x * 2^-127 underflows). A NaN
//   element casts to NaN (0x7F) and leaves the block's scale to the others. e = 0xFF (a NaN amax)
//   cannot come out of a cast (the amax skips NaN); as an exponent it decodes to NaN.
//   Rowwise copy: 1 x 32 blocks along the rows; data [rows, cols]; scales [rows][cols / 32].
//   Columnwise copy: 32 x 1 blocks down the columns, data NOT transposed [rows, cols]; scales
//   [rows / 32][cols]. (TE's layouts, before any swizzle.)
//
// NVFP4 (TE's quantize_transpose_nvfp4 kernel and its reference NVFP4QuantizerRef; S_enc from
// opfuse's current-scaling formula):
//   S_enc = nvfp4_tensor_scale(global amax) (argument of the casts, measured by the runtime).
//   S_dec = 1 / S_enc. Per block: s_b = e4m3_satfinite_rne(block_amax * (S_enc * fl(1/6)))
//   (TE's compute_decoding_scaling_factor: the two products in that order, each rounded);
//   the encode multiplier m = min(1 / (float(s_b) * S_dec), FLT_MAX) (TE's block_scale_inverse);
//   q = e2m1(x * m), RNE (or stochastic) with saturation to +-6. A block with s_b == 0 stores
//   codes 0 (TE's multiplier would be FLT_MAX and store +-6; both decode to 0).
//   Decoded value: (e2m1(q) * float(s_b)) * S_dec in fp32: the first product is exact (2 x 4
//   significant bits), the second rounded once.
//   E2M1 (cuda_fp4.h's __nv_cvt_float_to_fp4 rules): sign bit kept (so -0 and tiny negatives give
//   0x8), |v| <= 0.25 -> 0, ties to even (0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
//   5 -> 4), |v| > 6 and Inf -> 6, NaN -> +6 (0x7).
//   Rowwise copy: 1 x 16 blocks; data [rows, cols / 2] (element 2i in the low nibble of byte i);
//   scales [rows][cols / 16] (E4M3 bits). Columnwise copy: the rowwise quantization of the
//   transposed source: data [cols, rows / 2], scales [cols][rows / 16].
//   2-D (`two_d`, weights): 16 x 16 blocks of the source, one scale per block, stored repeated on
//   each of the block's 16 rows of the 1-D scale layout (TE's layout); the columnwise copy is then
//   exactly the rowwise codes transposed.
//   Random Hadamard transform (`rht`, columnwise copy only): before quantizing, every 16-row group
//   of each column of the source is replaced by (H16 D / 4) v (rht16 below); the copy's S_enc must
//   come from the amax of the transformed values (rht_amax).
//   Stochastic rounding (`stochastic`): e2m1_stochastic with the Philox bits of
//   templates/common/philox.cuh (micro_scale_random_words), element i being the index of the
//   element in the stored copy, unpacked: rowwise r * cols + c, columnwise c * rows + r.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "numerics.h"  // same directory: works with or without runtime/ on the include path

namespace opfuse::cpu {

inline constexpr int kMxfp8BlockSize = 32;
inline constexpr int kNvfp4BlockSize = 16;
// NVFP4's per-tensor scale is current scaling with this in place of fp8_max: E4M3's max 448
// times E2M1's max 6.
inline constexpr float kNvfp4TensorScaleMax = 2688.0f;
// TE's fixed signs of the random Hadamard transform (get_wgrad_sign_vector): bit k set means the
// k-th diagonal entry of D is -1.
inline constexpr uint16_t kRhtSignMask = 0xD7E8;

// ------------------------------------------------------------------------------------------------
// MXFP8

// MXFP8's shared exponent of `value` (amax / fp8_max), rounded up so nothing clips (TE's
// float_to_e8m0, the behaviour of sm_100's cvt.rp.satfinite.ue8m0x2.f32): NaN -> 0xFF, Inf ->
// 0xFE, 0 -> 0; else the biased fp32 exponent, plus 1 if a mantissa bit is set, except that a
// subnormal value <= 2^-127 gives 0 (E8M0's 0 is 2^-127), and the result is at most 0xFE.
uint8_t e8m0_round_up(float value);
// 2^(e - 127) as a float (2^-127 is subnormal); NaN for 0xFF.
float e8m0_to_float(uint8_t e);

struct Mxfp8Copy {
  int64_t rows = 0;  // of the source: data is [rows, cols] for both copies
  int64_t cols = 0;
  bool columnwise = false;
  Fp8Format format = Fp8Format::E4M3;
  std::vector<uint8_t> data;    // [rows, cols] FP8 bits
  std::vector<uint8_t> scales;  // E8M0: rowwise [rows][cols / 32], columnwise [rows / 32][cols]
};

// Throws std::invalid_argument unless x.size() == rows * cols and the blocked dimension (rowwise:
// cols, columnwise: rows) is a multiple of 32.
Mxfp8Copy mxfp8_quantize(std::span<const float> x, int64_t rows, int64_t cols, Fp8Format format,
                         bool columnwise);
// The decoded values, [rows, cols]. Throws std::invalid_argument for a copy whose data or scales
// do not fit its shape.
std::vector<float> mxfp8_dequantize(const Mxfp8Copy& copy);
// Quantize, then dequantize: what the emulated GEMM reads.
std::vector<float> mxfp8_fake_quantize(std::span<const float> x, int64_t rows, int64_t cols,
                                       Fp8Format format, bool columnwise);

// ------------------------------------------------------------------------------------------------
// E2M1

// The E2M1 code (4 bits: sign, 2 exponent, 1 mantissa) of v, rounded to nearest even, saturated.
uint8_t e2m1_rne(float v);
// Stochastic rounding: |v| in [lo, hi) between two neighbouring E2M1 magnitudes rounds to hi when
// float(bits >> 8) * 2^-24 < (|v| - lo) * (1 / (hi - lo)) (every operation exact in fp32, so the
// probability is the fraction up to 2^-24), else to lo. |v| >= 6 and Inf give 6, NaN +6 (0x7),
// the sign bit is v's.
uint8_t e2m1_stochastic(float v, uint32_t bits);
// The value of a code (its low 4 bits): +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
float e2m1_to_float(uint8_t code);

// ------------------------------------------------------------------------------------------------
// NVFP4

// S_enc of a tensor whose amax is global_amax: opfuse's current-scaling scale with fp8_max 2688
// (compute_current_scale: 2688 / amax, IEEE; 1 for a NaN, Inf or 0 amax; FLT_MAX when the quotient
// overflows; no epsilon, no power of 2). TE's compute_global_encode_scaling_factor_FP4 agrees
// except for a NaN amax (TE: FLT_MAX).
float nvfp4_tensor_scale(float global_amax);
// The E4M3 bits of a block's decode scale s_b, and the block's encode multiplier (header note).
uint8_t nvfp4_block_scale(float block_amax, float tensor_scale);
float nvfp4_encode_multiplier(uint8_t block_scale, float tensor_scale);

struct Nvfp4Params {
  bool columnwise = false;
  bool two_d = false;       // 16 x 16 blocks (weights); not with rht
  bool rht = false;         // random Hadamard transform; columnwise copy only
  bool stochastic = false;  // stochastic rounding (gradients)
  uint64_t seed = 0;        // stochastic rounding's Philox key
  uint32_t stream = 0;      // which quantizer and copy
  uint32_t step = 0;        // a per-cast counter
};

struct Nvfp4Copy {
  int64_t rows = 0;  // of the source
  int64_t cols = 0;
  Nvfp4Params params;
  float tensor_scale = 1.0f;    // S_enc
  std::vector<uint8_t> data;    // rowwise [rows, cols / 2], columnwise [cols, rows / 2]
  std::vector<uint8_t> scales;  // E4M3 bits: rowwise [rows][cols / 16], columnwise
                                // [cols][rows / 16]
};

// Throws std::invalid_argument unless x.size() == rows * cols, the blocked dimension (rowwise:
// cols, columnwise: rows) is a multiple of 16, two_d has both dimensions multiples of 16, and rht
// is columnwise without two_d.
Nvfp4Copy nvfp4_quantize(std::span<const float> x, int64_t rows, int64_t cols, float tensor_scale,
                         const Nvfp4Params& params);
// The decoded values in the source's orientation [rows, cols] (the columnwise copy transposed
// back; with rht the transformed values, not inverted). Throws std::invalid_argument for a copy
// whose data or scales do not fit its shape.
std::vector<float> nvfp4_dequantize(const Nvfp4Copy& copy);
std::vector<float> nvfp4_fake_quantize(std::span<const float> x, int64_t rows, int64_t cols,
                                       float tensor_scale, const Nvfp4Params& params);

// ------------------------------------------------------------------------------------------------
// Random Hadamard transform

// v <- (H16 D / 4) v in place, D = diag(signs of kRhtSignMask), H16 the Sylvester Hadamard matrix.
// Exact operation order (the device repeats it): negate v[k] where bit k of the mask is set; four
// butterfly stages h = 1, 2, 4, 8, each replacing (v[j], v[j + h]) by (v[j] + v[j + h],
// v[j] - v[j + h]) for every j with (j & h) == 0 (fp32, rounded); finally every v[j] * 0.25f.
void rht16(std::span<float, 16> v);
// The transpose (and inverse) (D H16 / 4) v: the butterflies, * 0.25f, then the signs.
void rht16_transpose(std::span<float, 16> v);
// x [rows, cols] with every column's 16-row groups transformed (rows % 16 == 0, else throws).
std::vector<float> rht_columns(std::span<const float> x, int64_t rows, int64_t cols);
// The global amax (fmaxf over |.|, NaN skipped) of rht_columns(x): what S_enc of an RHT copy
// derives from.
float rht_amax(std::span<const float> x, int64_t rows, int64_t cols);

// ------------------------------------------------------------------------------------------------
// sm_100 scale layouts (cuBLASLt VEC32_UE8M0 / VEC16_UE4M3). CPU only: Hopper cannot run these
// GEMM modes. A compact scale array [outer][inner] (outer: the rows of the stored data, M or N;
// inner: its K blocks) is padded to 128 x 4 tiles, tiles stored one after another with the inner
// tile index fastest ((outer / 128) * ceil(inner / 4) + inner / 4), 512 bytes each; within a
// tile, entry (outer, inner) is at (outer % 32) * 16 + ((outer % 128) / 32) * 4 + inner % 4.
// Padding entries are 0. Out-of-range entries and sizes that do not match throw
// std::invalid_argument.
int64_t swizzled_scales_size(int64_t outer, int64_t inner);
int64_t swizzled_scale_offset(int64_t outer_index, int64_t inner_index, int64_t inner);
std::vector<uint8_t> swizzle_scales(std::span<const uint8_t> compact, int64_t outer, int64_t inner);

}  // namespace opfuse::cpu
