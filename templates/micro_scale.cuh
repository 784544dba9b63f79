// Micro-scaled casts: MXFP8 (E8M0 scale per 32 elements) and NVFP4 (E2M1 codes, E4M3 scale per
// 16 elements, an FP32 tensor scale), with NVFP4's 2-D blocks, random Hadamard transform and
// stochastic rounding. On Hopper these recipes are emulated: the GEMM reads the decoded copy
// (`y`, the quantized values dequantized and rounded to Output), and the codes and compact scales
// (TE's layouts) are there for tests, checkpoints and sm_100.
//
// Entry points: micro_scale_cast<Input, Output, kFormat, kColumnwise, kTwoD, kRht, kStochastic,
// kWriteCodes> and micro_scale_rht_amax<Input>. Numerics, layouts, launch rules and shape
// requirements are in templates/README.md ("Micro-scaled casts"); the CPU oracle, bit for bit, is
// runtime/cpu/micro_scaling.h; the per-element arithmetic is common/micro_scale_math.cuh.
//
// Geometry (launch_rules.h): the rowwise 1-D copy gives each thread one scale block of a row
// (16-byte loads and stores, everything in registers); the other copies give each lane two
// adjacent columns of a block of rows (32 for MXFP8, 16 for NVFP4), a warp 64 columns (coalesced
// 4-byte (bf16) or 8-byte (fp32) loads per row), all loaded before any is used. No shared memory.
#ifndef OPFUSE_TEMPLATES_MICRO_SCALE_CUH_
#define OPFUSE_TEMPLATES_MICRO_SCALE_CUH_

#include "common/fp8.cuh"
#include "common/launch_rules.h"
#include "common/micro_scale_math.cuh"
#include "common/philox.cuh"
#include "common/quantizer_record.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"

namespace opfuse {

// One params struct for both entry points (field order is the layout; 88 bytes). The amax kernel
// takes MicroScaleParams<Input> (Output unused).
template <typename Input, typename Output = Input>
struct MicroScaleParams {
  const Input* x;  // [rows, cols] row-major
  // Codes (kWriteCodes): MXFP8 [rows, cols] FP8 bytes for both copies; NVFP4 rowwise
  // [rows, cols / 2], columnwise [cols, rows / 2] (element 2i in the low nibble of byte i).
  unsigned char* codes;
  // Compact scales (kWriteCodes): MXFP8 E8M0 rowwise [rows][cols / 32], columnwise
  // [rows / 32][cols]; NVFP4 E4M3 rowwise [rows][cols / 16], columnwise [cols][rows / 16].
  unsigned char* scales;
  Output* y;                  // [rows, cols] decoded values (source orientation); nullptr: none
  const float* tensor_scale;  // NVFP4: S_enc (a current-scaling record's scale, fp8_max 2688)
  const unsigned int* step;   // stochastic rounding's per-cast counter; nullptr: 0
  float* amax;                // micro_scale_rht_amax: raised to the transformed values' amax
  const QuantizerRecord* scale_record;  // micro_scale_rht_amax: derives S_enc; nullptr: none
  unsigned long long seed;              // stochastic rounding's Philox key
  unsigned int stream;                  // stochastic rounding: which quantizer and copy
  int rows;
  int cols;
};

namespace detail {

// S_enc and S_dec = 1 / S_enc (NVFP4), the stochastic rounding step.
struct MicroTensorScale {
  float scale;
  float decode;
};
template <int kFormat>
__device__ __forceinline__ MicroTensorScale micro_tensor_scale(const float* tensor_scale) {
  if constexpr (kFormat == launch::kMicroScaleE2M1) {
    const float scale = *tensor_scale;
    return {scale, __fdiv_rn(1.0f, scale)};
  } else {
    return {1.0f, 1.0f};
  }
}

// Rowwise copy, 1-D blocks: a thread owns one block of kBlock elements of a row.
template <typename Input, typename Output, int kFormat, bool kStochastic, bool kWriteCodes>
__device__ __forceinline__ void micro_scale_rows(const MicroScaleParams<Input, Output>& p) {
  constexpr int kBlock = launch::micro_scale_block_size(kFormat);
  constexpr int kVec = launch::vector_elems(sizeof(Input));
  constexpr bool kFp4 = kFormat == launch::kMicroScaleE2M1;
  const MicroTensorScale tensor = micro_tensor_scale<kFormat>(p.tensor_scale);
  const unsigned int step = kStochastic && p.step != nullptr ? *p.step : 0u;
  const long long blocks = static_cast<long long>(p.rows) * (p.cols / kBlock);
  const long long stride = static_cast<long long>(gridDim.x) * launch::kMicroScaleThreads;
  for (long long item =
           static_cast<long long>(blockIdx.x) * launch::kMicroScaleThreads + threadIdx.x;
       item < blocks; item += stride) {
    // cols % kBlock == 0: block `item` starts at element item * kBlock.
    const long long first = item * kBlock;
    float v[kBlock];
#pragma unroll
    for (int i = 0; i < kBlock; i += kVec) {
      const Vec<Input, kVec> vec = load_vec<Input, kVec>(p.x + first + i);
      float part[kVec];
      vec_to_float(vec, part);
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[i + j] = part[j];
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlock; ++i) amax = accumulate_amax(amax, v[i]);
    const MicroBlockScale s = micro_block_scale<kFormat>(amax, tensor.scale, tensor.decode);
    unsigned int codes[kFp4 ? kBlock / 8 : kBlock / 4];  // packed 32-bit words
#pragma unroll
    for (int w = 0; w < (kFp4 ? kBlock / 8 : kBlock / 4); ++w) codes[w] = 0u;
#pragma unroll
    for (int i = 0; i < kBlock; i += 4) {
      Philox4x32 random{{0u, 0u, 0u, 0u}};
      if constexpr (kStochastic) {
        random = micro_scale_random_words(static_cast<unsigned long long>(first + i) / 4, p.seed,
                                          p.stream, step);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const unsigned int code = micro_encode<kFormat, kStochastic>(v[i + j], s, random.v[j]);
        if constexpr (kFp4) {
          codes[(i + j) / 8] |= code << (4 * ((i + j) % 8));
        } else {
          codes[(i + j) / 4] |= code << (8 * ((i + j) % 4));
        }
        v[i + j] = micro_decode<kFormat>(code, s, tensor.decode);
      }
    }
    if constexpr (kWriteCodes) {
      if constexpr (kFp4) {
        *reinterpret_cast<uint2*>(p.codes + first / 2) = make_uint2(codes[0], codes[1]);
      } else {
        uint4* out = reinterpret_cast<uint4*>(p.codes + first);
        out[0] = make_uint4(codes[0], codes[1], codes[2], codes[3]);
        out[1] = make_uint4(codes[4], codes[5], codes[6], codes[7]);
      }
      p.scales[item] = static_cast<unsigned char>(s.bits);
    }
    if (p.y != nullptr) {
#pragma unroll
      for (int i = 0; i < kBlock; i += kVec) {
        float part[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) part[j] = v[i + j];
        store_vec(p.y + first + i, float_to_vec<Output, kVec>(part, 1.0f));
      }
    }
  }
}

// A column patch: kBlock rows x 2 columns of x at (r0, c). With kRht the transformed values are
// held as floats; NVFP4 holds its 16 rows as loaded; MXFP8's 32 rows are loaded again for the
// second pass (held, ptxas spills them at 64 registers), the reload made opaque to the compiler
// so that it is not merged with the first (it hits L1).
template <typename Input, int kBlock, bool kRht>
struct MicroPatch {
  static constexpr bool kHold = kRht || kBlock <= 16;
  const Input* x;
  long long r0;
  int c;
  int cols;
  bool active;
  Vec<Input, 2> raw[kHold && !kRht ? kBlock : 1];
  float transformed[2][kRht ? kBlock : 1];  // [column][row]

  __device__ __forceinline__ Vec<Input, 2> load_pair(int k, int offset) const {
    Vec<Input, 2> pair;
    if (active) {
      // 32-bit offsets from the patch's first element (a patch spans kBlock rows).
      pair = load_vec<Input, 2>(
          x + (r0 * cols + c) +
          (static_cast<unsigned int>(k * cols) + static_cast<unsigned int>(offset)));
    } else {
      pair.elems[0] = from_float<Input>(0.0f);
      pair.elems[1] = from_float<Input>(0.0f);
    }
    return pair;
  }
  // The first pass: calls visit(k, v0, v1) for every row k of the patch.
  template <typename Visit>
  __device__ __forceinline__ void load(Visit visit) {
#pragma unroll
    for (int k = 0; k < kBlock; ++k) {
      const Vec<Input, 2> pair = load_pair(k, 0);
      if constexpr (kRht) {
        transformed[0][k] = to_float(pair.elems[0]);
        transformed[1][k] = to_float(pair.elems[1]);
      } else {
        if constexpr (kHold) raw[k] = pair;
        visit(k, to_float(pair.elems[0]), to_float(pair.elems[1]));
      }
    }
    if constexpr (kRht) {
      static_assert(kBlock == 16, "the Hadamard transform is 16 x 16");
      rht16(transformed[0]);
      rht16(transformed[1]);
#pragma unroll
      for (int k = 0; k < 16; ++k) visit(k, transformed[0][k], transformed[1][k]);
    }
  }
  // The second pass: the values of rows k .. k + 3.
  __device__ __forceinline__ void rows4(int k, float (&v)[4][2]) const {
    int offset = 0;
    if constexpr (!kHold) hide_from_optimizer(offset);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (kRht) {
        v[kk][0] = transformed[0][k + kk];
        v[kk][1] = transformed[1][k + kk];
      } else {
        const Vec<Input, 2> pair = kHold ? raw[k + kk] : load_pair(k + kk, offset);
        v[kk][0] = to_float(pair.elems[0]);
        v[kk][1] = to_float(pair.elems[1]);
      }
    }
  }
};

// NVFP4's part of a column patch: first the codes (both columns, 16 rows, packed as they are
// stored: code of row k in bits 4 (k % 8) of word k / 8), then the decoded values from the codes,
// so the patch's values and the random words are dead before the stores of y begin.
template <typename Input, typename Output, bool kColumnwise, bool kRht, bool kStochastic,
          bool kWriteCodes, typename Patch>
__device__ __forceinline__ void micro_fp4_patch(const MicroScaleParams<Input, Output>& p,
                                                const Patch& patch, const MicroBlockScale (&s)[2],
                                                float tensor_decode, long long base, long long r0,
                                                int c, long long group, unsigned int step) {
  constexpr int kFormat = launch::kMicroScaleE2M1;
  unsigned int packed[2][2] = {{0u, 0u}, {0u, 0u}};
  if constexpr (kStochastic && kColumnwise) {
    // Element i = (c + j) * rows + r of the stored copy: one Philox call per column and 4 rows.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int k = 0; k < 16; k += 4) {
        float v[4][2];
        patch.rows4(k, v);
        const unsigned long long i =
            static_cast<unsigned long long>(c + j) * static_cast<unsigned int>(p.rows) +
            static_cast<unsigned long long>(r0 + k);
        const Philox4x32 random = micro_scale_random_words(i / 4, p.seed, p.stream, step);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          packed[j][(k + kk) / 8] |= micro_encode<kFormat, true>(v[kk][j], s[j], random.v[kk])
                                     << (4 * ((k + kk) % 8));
        }
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < 16; k += 4) {
      float v[4][2];
      patch.rows4(k, v);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        unsigned int bits[2] = {0u, 0u};
        if constexpr (kStochastic) {
          // Rowwise 2-D: element i = r * cols + c + j; c is even, so c and c + 1 share a call.
          const unsigned long long i =
              static_cast<unsigned long long>(base) + static_cast<unsigned int>((k + kk) * p.cols);
          const Philox4x32 random = micro_scale_random_words(i / 4, p.seed, p.stream, step);
          bits[0] = random.v[i % 4];
          bits[1] = random.v[(i + 1) % 4];
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          packed[j][(k + kk) / 8] |= micro_encode<kFormat, kStochastic>(v[kk][j], s[j], bits[j])
                                     << (4 * ((k + kk) % 8));
        }
      }
    }
  }
  if constexpr (kWriteCodes) {
    if constexpr (kColumnwise) {
      // Column c + j of the stored [cols, rows / 2] copy: 8 bytes at row r0 (rows % 16 == 0);
      // its scale at [c + j][group].
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        *reinterpret_cast<uint2*>(p.codes + static_cast<long long>(c + j) * (p.rows / 2) + r0 / 2) =
            make_uint2(packed[j][0], packed[j][1]);
        p.scales[static_cast<long long>(c + j) * (p.rows / 16) + group] =
            static_cast<unsigned char>(s[j].bits);
      }
    } else {
      // 2-D rowwise: cols % 16 == 0 and c even, so base / 2 and (c % 16 == 0) base / 16 are
      // exact: byte (r, c / 2) and scale (r, c / 16) of every row r of the block.
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const unsigned int row_offset = static_cast<unsigned int>(k * p.cols);
        const unsigned int pair = ((packed[0][k / 8] >> (4 * (k % 8))) & 0xFu) |
                                  (((packed[1][k / 8] >> (4 * (k % 8))) & 0xFu) << 4);
        p.codes[base / 2 + row_offset / 2] = static_cast<unsigned char>(pair);
        if (c % 16 == 0)
          p.scales[base / 16 + row_offset / 16] = static_cast<unsigned char>(s[0].bits);
      }
    }
  }
  if (p.y != nullptr) {
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      float value[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        value[j] =
            micro_decode<kFormat>((packed[j][k / 8] >> (4 * (k % 8))) & 0xFu, s[j], tensor_decode);
      }
      store_vec(p.y + base + static_cast<unsigned int>(k * p.cols),
                float_to_vec<Output, 2>(value, 1.0f));
    }
  }
}

// Columnwise copies and 2-D blocks: lane `lane` of warp `warp` owns columns c, c + 1 of the row
// group (kBlock rows) blockIdx.y * 8 + warp (strided by gridDim.y * 8).
template <typename Input, typename Output, int kFormat, bool kColumnwise, bool kTwoD, bool kRht,
          bool kStochastic, bool kWriteCodes>
__device__ __forceinline__ void micro_scale_patches(const MicroScaleParams<Input, Output>& p) {
  constexpr int kBlock = launch::micro_scale_block_size(kFormat);
  constexpr bool kFp4 = kFormat == launch::kMicroScaleE2M1;
  const MicroTensorScale tensor = micro_tensor_scale<kFormat>(p.tensor_scale);
  const unsigned int step = kStochastic && p.step != nullptr ? *p.step : 0u;
  const int lane = threadIdx.x & 31;
  const int c = (blockIdx.x * launch::kWarpSize + lane) * launch::kMicroScalePatchCols;
  const bool active = c < p.cols;
  const long long groups = p.rows / kBlock;
  for (long long group =
           static_cast<long long>(blockIdx.y) * launch::kMicroScaleWarps + (threadIdx.x >> 5);
       group < groups; group += static_cast<long long>(gridDim.y) * launch::kMicroScaleWarps) {
    const long long r0 = group * kBlock;
    MicroPatch<Input, kBlock, kRht> patch{p.x, r0, c, p.cols, active};
    float amax[2] = {0.0f, 0.0f};
    patch.load([&](int, float v0, float v1) {
      amax[0] = accumulate_amax(amax[0], v0);
      amax[1] = accumulate_amax(amax[1], v1);
    });
    if constexpr (kTwoD) {
      // A 16 x 16 block is 8 lanes (cols % 16 == 0: all of them active or none).
      float block = fmaxf(amax[0], amax[1]);
#pragma unroll
      for (int offset = 1; offset < 8; offset <<= 1)
        block = fmaxf(block, __shfl_xor_sync(0xFFFFFFFFu, block, offset));
      amax[0] = block;
      amax[1] = block;
    }
    if (!active) continue;
    MicroBlockScale s[2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
      s[j] = micro_block_scale<kFormat>(amax[j], tensor.scale, tensor.decode);
    // Element (r0, c) of the source; rows of the patch are 32-bit offsets from it (few 64-bit
    // addresses live at once: sm_100a's ptxas spilled them).
    const long long base = r0 * p.cols + c;
    if constexpr (kFp4) {
      micro_fp4_patch<Input, Output, kColumnwise, kRht, kStochastic, kWriteCodes>(
          p, patch, s, tensor.decode, base, r0, c, group, step);
    } else {
#pragma unroll
      for (int k = 0; k < kBlock; k += 4) {
        float v[4][2];
        patch.rows4(k, v);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const unsigned int row_offset = static_cast<unsigned int>((k + kk) * p.cols);
          unsigned int code[2];
          float value[2];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            code[j] = micro_encode<kFormat, false>(v[kk][j], s[j], 0u);
            value[j] = micro_decode<kFormat>(code[j], s[j], tensor.decode);
          }
          if constexpr (kWriteCodes) {
            *reinterpret_cast<unsigned short*>(p.codes + base + row_offset) =
                static_cast<unsigned short>(code[0] | (code[1] << 8));
          }
          if (p.y != nullptr) {
            store_vec(p.y + base + row_offset, float_to_vec<Output, 2>(value, 1.0f));
          }
        }
      }
      if constexpr (kWriteCodes) {
        // [rows / 32][cols]: this group's two entries.
        *reinterpret_cast<unsigned short*>(p.scales + group * p.cols + c) =
            static_cast<unsigned short>(s[0].bits | (s[1].bits << 8));
      }
    }
  }
}

}  // namespace detail

// The cast. kFormat: launch::kMicroScaleE4M3 (0), kMicroScaleE5M2 (1) (MXFP8), kMicroScaleE2M1
// (2, NVFP4). kColumnwise: the columnwise copy. kTwoD, kRht, kStochastic: NVFP4 only (kRht needs
// kColumnwise and not kTwoD). kWriteCodes = false writes only y.
template <typename Input, typename Output, int kFormat, bool kColumnwise, bool kTwoD = false,
          bool kRht = false, bool kStochastic = false, bool kWriteCodes = true>
__global__ void __launch_bounds__(
    launch::kMicroScaleThreads,
    launch::min_blocks(launch::kMicroScaleThreads,
                       launch::micro_scale_register_budget(static_cast<int>(sizeof(Input)),
                                                           kStochastic, kRht)))
    micro_scale_cast(MicroScaleParams<Input, Output> p) {
  static_assert(kFormat == launch::kMicroScaleE4M3 || kFormat == launch::kMicroScaleE5M2 ||
                    kFormat == launch::kMicroScaleE2M1,
                "kFormat: 0 (MXFP8 E4M3), 1 (MXFP8 E5M2) or 2 (NVFP4)");
  static_assert(kFormat == launch::kMicroScaleE2M1 || (!kTwoD && !kRht && !kStochastic),
                "2-D blocks, the Hadamard transform and stochastic rounding are NVFP4's");
  static_assert(!kRht || (kColumnwise && !kTwoD), "the Hadamard transform: columnwise, 1-D");
  static_assert(!DtypeTraits<Output>::kIsFp8, "y holds the decoded values: bf16, fp16 or fp32");
  if constexpr (launch::micro_scale_uses_patches(kColumnwise, kTwoD)) {
    detail::micro_scale_patches<Input, Output, kFormat, kColumnwise, kTwoD, kRht, kStochastic,
                                kWriteCodes>(p);
  } else {
    detail::micro_scale_rows<Input, Output, kFormat, kStochastic, kWriteCodes>(p);
  }
}

// The amax of the Hadamard-transformed columns (the NVFP4 columnwise RHT copy's global amax):
// raises *p.amax (atomicMax on the bits, one per block; fmaxf, NaN skipped) and, with a
// scale_record, the last block derives S_enc (derive_current_scale). Column patches of 16 rows;
// p.codes, p.scales, p.y, p.tensor_scale, p.step are ignored.
template <typename Input>
__global__ void __launch_bounds__(
    launch::kMicroScaleThreads,
    launch::min_blocks(launch::kMicroScaleThreads,
                       launch::micro_scale_register_budget(static_cast<int>(sizeof(Input)), false,
                                                           true)))
    micro_scale_rht_amax(MicroScaleParams<Input> p) {
  __shared__ float scratch[launch::kMicroScaleWarps];
  const int lane = threadIdx.x & 31;
  const int c = (blockIdx.x * launch::kWarpSize + lane) * launch::kMicroScalePatchCols;
  const bool active = c < p.cols;
  const long long groups = p.rows / 16;
  float amax = 0.0f;
  for (long long group =
           static_cast<long long>(blockIdx.y) * launch::kMicroScaleWarps + (threadIdx.x >> 5);
       group < groups; group += static_cast<long long>(gridDim.y) * launch::kMicroScaleWarps) {
    if (!active) continue;
    detail::MicroPatch<Input, 16, true> patch{p.x, group * 16, c, p.cols, true};
    patch.load([&](int, float v0, float v1) {
      amax = accumulate_amax(amax, v0);
      amax = accumulate_amax(amax, v1);
    });
  }
  commit_block_amax<launch::kMicroScaleThreads>(amax, p.amax, scratch);
  derive_current_scale(p.scale_record);  // thread 0, after its block's amax atomic
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_MICRO_SCALE_CUH_
