// LogFp8TensorStats on the device (docs/debugging.md, "LogFp8TensorStats"): one cast of a
// high-precision tensor, the layer's own or a what-if one, measured against the tensor into one
// record per slot without a host sync, deterministically (every sum in an order fixed by the
// launch shape, double accumulation, as tensor_stats.cuh).
//
// Entry points: quant_stats_partial<Input, Fp8> (one record per thread block, into `partials`)
// and quant_stats_final<kThreads> (one thread merges the partials in block order into the slot's
// record). QuantStatRecord has the layout of debug::QuantizedMoments (debug/stats.h): keep the
// two identical. The CPU reference (reference/quant_stats.cpp) forms every scale and every
// dequantized value with the same fp32 operations, so counts match it exactly.
#ifndef OPFUSE_TEMPLATES_QUANT_STATS_CUH_
#define OPFUSE_TEMPLATES_QUANT_STATS_CUH_

#include "common/fp8.cuh"
#include "common/launch_rules.h"
#include "common/micro_scale_math.cuh"
#include "common/quantizer_record.cuh"
#include "common/types.cuh"
#include "tensor_stats.cuh"

namespace opfuse {

struct QuantStatRecord {
  long long count;
  long long underflows;  // x != 0 whose FP8 value is 0
  long long overflows;   // per-tensor delayed scale: |x| > fp8_max * scale_inv
  double sq_err;         // sum of (x - dequantized)^2
  double scale_inv_min;
  double scale_inv_max;
  long long blocks;            // block casts: real blocks (a partial last block counts, no padding)
  long long underflow_blocks;  // blocks with at least one underflow
  long long scaled_blocks;     // blocks whose amax is finite and nonzero
  double log2_sum;             // over the scaled blocks: sum of log2(scale_inv)
  double log2_sq_sum;          // and of its square
};

// Which cast (plan::QuantStatCast, in its order).
enum QuantStatCastMode : int {
  kQuantStatQuantizer = 0,    // the layer's quantizer: its scale (delayed) or current scaling
  kQuantStatCurrent = 1,      // what-if per-tensor current scaling (epsilon 0)
  kQuantStatFloat8Block = 2,  // what-if Float8BlockScaling: power-of-2 FP32 scale per block
  kQuantStatMxfp8 = 3,        // what-if MXFP8: E8M0 scale per block, rounded up
};

// Fp8 (the format cast to) is a parameter of the struct too, as codegen spells every kernel's
// params type with all its dtype parameters.
template <typename Input, typename Fp8>
struct QuantStatsParams {
  const Input* x;  // rows x cols, row-major
  long long rows;
  int cols;
  int cast;        // QuantStatCastMode
  int block_rows;  // block casts: the scale block (1 x 128, 128 x 1, 128 x 128, 1 x 32, 32 x 1)
  int block_cols;
  int rows_per_block;  // rows one thread block reduces (a multiple of block_rows)
  // kQuantStatFloat8Block: the blocks' amax floor and power-of-2 rounding (TE's defaults 0 and 1
  // for the what-if; a block-scaled quantizer's own settings for its own cast).
  float block_epsilon;
  int block_power_of_2;
  const QuantizerRecord* quantizer;  // kQuantStatQuantizer: the layer's quantizer of x
  const StatRecord* moments;         // per-tensor casts: x's moments record (its amax)
  QuantStatRecord* partials;         // gridDim.x records
  // Block casts whose scale-exponent histogram is logged: kQuantStatExponentBins counts per
  // thread block (gridDim.x x 256); nullptr: none.
  unsigned int* histogram;
};

struct QuantStatsFinalParams {
  const QuantStatRecord* partials;
  int count;  // the partial kernel's gridDim.x
  QuantStatRecord* record;
  // The partial kernel's histogram counts, or nullptr. The sums go to the records after `record`
  // (its ExponentHistogram parts: 256 long long counts, debug::ExponentHistogram).
  const unsigned int* histogram_partials;
};

// debug::kExponentBins and debug::kNonFiniteBin (debug/stats.h): a block's bin is the biased
// exponent field of its fp32 scale_inv; a block whose amax is NaN or Inf goes to the last bin,
// a block of zeros to none.
enum : int { kQuantStatExponentBins = 256, kQuantStatNonFiniteBin = 255 };

__device__ __forceinline__ int exponent_bin(float amax, float scale_inv) {
  if (!isfinite(amax) || isnan(scale_inv)) return kQuantStatNonFiniteBin;
  if (amax == 0.0f) return -1;
  return static_cast<int>((__float_as_uint(scale_inv) >> 23) & 0xFFu);
}

__device__ __forceinline__ QuantStatRecord empty_quant_stat_record() {
  QuantStatRecord r;
  r.count = 0;
  r.underflows = 0;
  r.overflows = 0;
  r.sq_err = 0;
  r.scale_inv_min = __longlong_as_double(0x7FF0000000000000LL);  // +inf: no scale yet
  r.scale_inv_max = -r.scale_inv_min;
  r.blocks = 0;
  r.underflow_blocks = 0;
  r.scaled_blocks = 0;
  r.log2_sum = 0;
  r.log2_sq_sum = 0;
  return r;
}

__device__ __forceinline__ QuantStatRecord merge_quant_stat_records(const QuantStatRecord& a,
                                                                    const QuantStatRecord& b) {
  QuantStatRecord r;
  r.count = a.count + b.count;
  r.underflows = a.underflows + b.underflows;
  r.overflows = a.overflows + b.overflows;
  r.sq_err = a.sq_err + b.sq_err;
  r.scale_inv_min = stat_min(a.scale_inv_min, b.scale_inv_min);
  r.scale_inv_max = stat_max(a.scale_inv_max, b.scale_inv_max);
  r.blocks = a.blocks + b.blocks;
  r.underflow_blocks = a.underflow_blocks + b.underflow_blocks;
  r.scaled_blocks = a.scaled_blocks + b.scaled_blocks;
  r.log2_sum = a.log2_sum + b.log2_sum;
  r.log2_sq_sum = a.log2_sq_sum + b.log2_sq_sum;
  return r;
}

__device__ __forceinline__ QuantStatRecord shuffle_xor(const QuantStatRecord& r, int mask) {
  QuantStatRecord o;
  o.count = __shfl_xor_sync(0xFFFFFFFFu, r.count, mask);
  o.underflows = __shfl_xor_sync(0xFFFFFFFFu, r.underflows, mask);
  o.overflows = __shfl_xor_sync(0xFFFFFFFFu, r.overflows, mask);
  o.sq_err = __shfl_xor_sync(0xFFFFFFFFu, r.sq_err, mask);
  o.scale_inv_min = __shfl_xor_sync(0xFFFFFFFFu, r.scale_inv_min, mask);
  o.scale_inv_max = __shfl_xor_sync(0xFFFFFFFFu, r.scale_inv_max, mask);
  o.blocks = __shfl_xor_sync(0xFFFFFFFFu, r.blocks, mask);
  o.underflow_blocks = __shfl_xor_sync(0xFFFFFFFFu, r.underflow_blocks, mask);
  o.scaled_blocks = __shfl_xor_sync(0xFFFFFFFFu, r.scaled_blocks, mask);
  o.log2_sum = __shfl_xor_sync(0xFFFFFFFFu, r.log2_sum, mask);
  o.log2_sq_sum = __shfl_xor_sync(0xFFFFFFFFu, r.log2_sq_sum, mask);
  return o;
}

struct QuantScale {
  float scale;      // multiplier before the FP8 cast
  float scale_inv;  // dequantization factor
};

// The scale of one block (or of the whole tensor under current scaling) from its amax (NaN when
// it held a NaN). Matches reference/quant_stats.cpp's block_scale.
__device__ __forceinline__ QuantScale quant_stat_scale(int cast, float amax, float fp8_max,
                                                       float epsilon, bool power_of_2) {
  if (cast == kQuantStatMxfp8) {
    const int e = e8m0_round_up(__fdiv_rn(amax, fp8_max));
    if (e == 0xFF) {
      const float nan = __uint_as_float(0x7FC00000u);
      return {nan, nan};
    }
    return {pow2_float(127 - e), pow2_float(e - 127)};
  }
  const float scale = current_scaling_scale(amax, fp8_max, epsilon, power_of_2);
  return {scale, __fdiv_rn(1.0f, scale)};
}

// One element's cast: whether it underflows, and its squared error (dequantized in fp32).
template <typename Fp8>
__device__ __forceinline__ double cast_error(float v, const QuantScale& s, bool& underflow) {
  Fp8 q;
  q.__x = float_to_fp8_bits<Fp8>(apply_scale(v, s.scale));
  const float qf = to_float(q);
  const float dq = __fmul_rn(qf, s.scale_inv);
  underflow = v != 0.0f && qf == 0.0f;  // a NaN casts to NaN: not an underflow
  const double err = static_cast<double>(v) - static_cast<double>(dq);
  return err * err;
}

// Block: launch::kTensorStatsThreads. Grid: at most launch::kTensorStatsMaxBlocks blocks, each
// over rows_per_block rows. A warp takes one unit at a time: a scale block (block casts: first its
// amax, then the cast of each element) or a stretch of up to 1024 elements of one row.
template <typename Input, typename Fp8>
__global__ void __launch_bounds__(launch::kTensorStatsThreads,
                                  launch::min_blocks(launch::kTensorStatsThreads,
                                                     launch::kTensorStatsRegisterBudget))
    quant_stats_partial(QuantStatsParams<Input, Fp8> params) {
  constexpr int kWarps = launch::kTensorStatsThreads / 32;
  constexpr float kFp8Max = DtypeTraits<Fp8>::kMax;
  __shared__ QuantStatRecord warp_records[kWarps];
  __shared__ unsigned int histogram[kQuantStatExponentBins];
  const bool with_histogram = params.histogram != nullptr;
  if (with_histogram) {
    for (int b = threadIdx.x; b < kQuantStatExponentBins; b += blockDim.x) histogram[b] = 0;
    __syncthreads();
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const bool blocked = params.cast == kQuantStatFloat8Block || params.cast == kQuantStatMxfp8;

  // Per-tensor casts: one scale for every element.
  QuantScale tensor_scale{1.0f, 1.0f};
  bool count_overflows = false;
  if (!blocked) {
    const QuantizerRecord* q = params.quantizer;
    if (params.cast == kQuantStatQuantizer && q->mode != kCurrentScaling) {
      tensor_scale = {*q->scale, *q->scale_inv};
      count_overflows = true;
    } else {
      const double a = params.moments->amax;
      const float amax = isnan(a) ? __uint_as_float(0x7FC00000u) : static_cast<float>(a);
      const bool own = params.cast == kQuantStatQuantizer;
      tensor_scale = quant_stat_scale(kQuantStatCurrent, amax, kFp8Max, own ? q->epsilon : 0.0f,
                                      own && q->power_of_2_scale != 0);
    }
  }
  const float overflow_above = __fmul_rn(kFp8Max, tensor_scale.scale_inv);

  const long long row_begin = static_cast<long long>(blockIdx.x) * params.rows_per_block;
  const long long row_end = row_begin + params.rows_per_block < params.rows
                                ? row_begin + params.rows_per_block
                                : params.rows;
  const int unit_cols = blocked ? params.block_cols : 1024;
  const int unit_rows = blocked ? params.block_rows : 1;
  const long long col_units = (params.cols + unit_cols - 1) / unit_cols;
  const long long row_units =
      row_end > row_begin ? (row_end - row_begin + unit_rows - 1) / unit_rows : 0;

  QuantStatRecord acc = empty_quant_stat_record();
  for (long long u = warp; u < row_units * col_units; u += kWarps) {
    const long long r0 = row_begin + (u / col_units) * unit_rows;
    const int c0 = static_cast<int>((u % col_units) * unit_cols);
    const int h = static_cast<int>(row_end - r0 < unit_rows ? row_end - r0 : unit_rows);
    const int w = params.cols - c0 < unit_cols ? params.cols - c0 : unit_cols;
    QuantScale s = tensor_scale;
    float unit_amax = 0.0f;
    if (blocked) {
      bool unit_nan = false;
      for (int e = lane; e < h * w; e += 32) {
        const float v = to_float(params.x[(r0 + e / w) * params.cols + c0 + e % w]);
        unit_nan |= isnan(v);
        unit_amax = fmaxf(unit_amax, fabsf(v));
      }
#pragma unroll
      for (int mask = 16; mask > 0; mask >>= 1)
        unit_amax = fmaxf(unit_amax, __shfl_xor_sync(0xFFFFFFFFu, unit_amax, mask));
      if (__any_sync(0xFFFFFFFFu, unit_nan)) unit_amax = __uint_as_float(0x7FC00000u);
      s = quant_stat_scale(params.cast, unit_amax, kFp8Max, params.block_epsilon,
                           params.block_power_of_2 != 0);
    }
    bool unit_underflow = false;
    for (int e = lane; e < h * w; e += 32) {
      const float v = to_float(params.x[(r0 + e / w) * params.cols + c0 + e % w]);
      bool underflow = false;
      acc.sq_err += cast_error<Fp8>(v, s, underflow);
      ++acc.count;
      acc.underflows += underflow;
      unit_underflow |= underflow;
      if (count_overflows && fabsf(v) > overflow_above) ++acc.overflows;
    }
    unit_underflow = __any_sync(0xFFFFFFFFu, unit_underflow);
    if (blocked && lane == 0) {
      ++acc.blocks;
      acc.underflow_blocks += unit_underflow;
      const double inv = static_cast<double>(s.scale_inv);
      acc.scale_inv_min = stat_min(acc.scale_inv_min, inv);
      acc.scale_inv_max = stat_max(acc.scale_inv_max, inv);
      if (isfinite(unit_amax) && unit_amax > 0.0f) {
        const double l = log2(inv);
        ++acc.scaled_blocks;
        acc.log2_sum += l;
        acc.log2_sq_sum += l * l;
      }
      if (with_histogram) {
        const int bin = exponent_bin(unit_amax, s.scale_inv);
        if (bin >= 0) atomicAdd(&histogram[bin], 1u);  // integer counts: any order, same sums
      }
    }
  }
  if (with_histogram) {
    __syncthreads();
    for (int b = threadIdx.x; b < kQuantStatExponentBins; b += blockDim.x)
      params.histogram[static_cast<long long>(blockIdx.x) * kQuantStatExponentBins + b] =
          histogram[b];
  }
  if (!blocked && blockIdx.x == 0 && threadIdx.x == 0) {
    acc.scale_inv_min = static_cast<double>(tensor_scale.scale_inv);
    acc.scale_inv_max = acc.scale_inv_min;
  }
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1)
    acc = merge_quant_stat_records(acc, shuffle_xor(acc, mask));
  if (lane == 0) warp_records[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    QuantStatRecord total = empty_quant_stat_record();
    for (int v = 0; v < kWarps; ++v) total = merge_quant_stat_records(total, warp_records[v]);
    params.partials[blockIdx.x] = total;
  }
}

// Block: kThreads (one warp), grid: 1. Thread 0 merges the partials in block order; with a
// histogram, the threads first add its bins over the blocks.
template <int kThreads = 32>
__global__ void __launch_bounds__(kThreads,
                                  launch::min_blocks(kThreads, launch::kTensorStatsRegisterBudget))
    quant_stats_final(QuantStatsFinalParams params) {
  if (params.histogram_partials != nullptr) {
    long long* bins = reinterpret_cast<long long*>(params.record + 1);
    for (int b = threadIdx.x; b < kQuantStatExponentBins; b += blockDim.x) {
      long long sum = 0;
      for (int k = 0; k < params.count; ++k)
        sum += params.histogram_partials[static_cast<long long>(k) * kQuantStatExponentBins + b];
      bins[b] = sum;
    }
  }
  if (threadIdx.x != 0) return;
  QuantStatRecord total = empty_quant_stat_record();
  for (int b = 0; b < params.count; ++b)
    total = merge_quant_stat_records(total, params.partials[b]);
  *params.record = total;
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_QUANT_STATS_CUH_
