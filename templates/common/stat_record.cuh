// The record of a tensor's moments and extrema that the precision-debug statistics reduce
// (docs/debugging.md, "Statistics on the device"), its deterministic merge, and the per-thread
// accumulator: shared by tensor_stats.cuh (a kernel of its own reading the tensor) and the tiled
// elementwise kernels that compute the statistics of a tensor they already read or produce
// (common/elementwise_tile.cuh, kStats). StatRecord has the layout of debug::TensorMoments
// (debug/stats.h): keep the two identical.
#ifndef OPFUSE_TEMPLATES_COMMON_STAT_RECORD_CUH_
#define OPFUSE_TEMPLATES_COMMON_STAT_RECORD_CUH_

#include "types.cuh"
#include "vec.cuh"

namespace opfuse {

struct StatRecord {
  long long count;
  double mean;
  double m2;  // sum of squared deviations from mean (Chan's M2)
  double min;
  double max;
  double sum_abs;
  double sum_sq;
  double amax;
  double min_nonzero_abs;  // +inf: no nonzero value
  double max_nonzero_abs;
  double max_blockwise_dynamic_range;
};

// NaN-propagating min and max: a NaN anywhere makes the statistic NaN, whatever the order.
__device__ __forceinline__ double stat_min(double a, double b) {
  return isnan(a) ? a : (isnan(b) ? b : fmin(a, b));
}
__device__ __forceinline__ double stat_max(double a, double b) {
  return isnan(a) ? a : (isnan(b) ? b : fmax(a, b));
}

__device__ __forceinline__ StatRecord empty_stat_record() {
  StatRecord r;
  r.count = 0;
  r.mean = 0;
  r.m2 = 0;
  r.min = __longlong_as_double(0x7FF0000000000000LL);  // +inf
  r.max = -r.min;
  r.sum_abs = 0;
  r.sum_sq = 0;
  r.amax = 0;
  r.min_nonzero_abs = r.min;
  r.max_nonzero_abs = 0;
  r.max_blockwise_dynamic_range = 0;
  return r;
}

// The moments of pieces being merged, about one reference value `ref` they share: merging is then
// plain sums, with no division per merge (Chan's update of mean and M2 divides by the merged count
// at every merge, and a tree of such merges kept the one-block merges of the partial records
// waiting on that latency: 17-19 us per record on an H100). A record enters with sums_about (two
// multiplies) and leaves with record_of (one division). In double, the final M2 = s2 - s1^2 / n
// loses nothing that matters: ref is the mean of one of the pieces (a thread's thousands of
// values), so s1 is small against the spread.
struct StatSums {
  long long count;
  double ref;
  double s1;  // sum of (v - ref)
  double s2;  // sum of (v - ref)^2
  double min;
  double max;
  double sum_abs;
  double sum_sq;
  double amax;
  double min_nonzero_abs;
  double max_nonzero_abs;
  double max_blockwise_dynamic_range;
};

// The reference of a merge: the mean of a record, or 0 when it has none or it is not finite (its
// sums then carry the infinity or NaN, as a Chan merge would).
__device__ __forceinline__ double stat_reference(const StatRecord& r) {
  return r.count > 0 && isfinite(r.mean) ? r.mean : 0.0;
}

// The fields a record and its sums hold alike (all but the moments).
template <typename From, typename To>
__device__ __forceinline__ void copy_unmerged_fields(const From& from, To& to) {
  to.min = from.min;
  to.max = from.max;
  to.sum_abs = from.sum_abs;
  to.sum_sq = from.sum_sq;
  to.amax = from.amax;
  to.min_nonzero_abs = from.min_nonzero_abs;
  to.max_nonzero_abs = from.max_nonzero_abs;
  to.max_blockwise_dynamic_range = from.max_blockwise_dynamic_range;
}

__device__ __forceinline__ StatSums sums_about(const StatRecord& r, double ref) {
  StatSums s;
  s.count = r.count;
  s.ref = ref;
  if (r.count > 0) {
    const double n = static_cast<double>(r.count);
    const double d = r.mean - ref;
    s.s1 = n * d;
    s.s2 = fma(s.s1, d, r.m2);
  } else {
    s.s1 = 0;
    s.s2 = 0;
  }
  copy_unmerged_fields(r, s);
  return s;
}

// Two disjoint pieces about the same reference. Commutative bit for bit (IEEE addition and the
// NaN-propagating extrema are), so both lanes of a butterfly hold the same result.
__device__ __forceinline__ StatSums add_stat_sums(const StatSums& a, const StatSums& b) {
  StatSums r;
  r.count = a.count + b.count;
  r.ref = a.ref;
  r.s1 = a.s1 + b.s1;
  r.s2 = a.s2 + b.s2;
  r.min = stat_min(a.min, b.min);
  r.max = stat_max(a.max, b.max);
  r.sum_abs = a.sum_abs + b.sum_abs;
  r.sum_sq = a.sum_sq + b.sum_sq;
  r.amax = stat_max(a.amax, b.amax);
  r.min_nonzero_abs = stat_min(a.min_nonzero_abs, b.min_nonzero_abs);
  r.max_nonzero_abs = stat_max(a.max_nonzero_abs, b.max_nonzero_abs);
  r.max_blockwise_dynamic_range =
      stat_max(a.max_blockwise_dynamic_range, b.max_blockwise_dynamic_range);
  return r;
}

__device__ __forceinline__ StatRecord record_of(const StatSums& s) {
  StatRecord r = empty_stat_record();
  if (s.count == 0) return r;
  const double q = s.s1 / static_cast<double>(s.count);
  r.count = s.count;
  r.mean = s.ref + q;
  const double m2 = s.s2 - s.s1 * q;
  r.m2 = m2 > 0 ? m2 : (isnan(m2) ? m2 : 0.0);
  copy_unmerged_fields(s, r);
  return r;
}

__device__ __forceinline__ StatSums shuffle_xor(const StatSums& s, int mask) {
  StatSums o;
  o.count = __shfl_xor_sync(0xFFFFFFFFu, s.count, mask);
  o.ref = s.ref;  // shared by the whole reduction
  o.s1 = __shfl_xor_sync(0xFFFFFFFFu, s.s1, mask);
  o.s2 = __shfl_xor_sync(0xFFFFFFFFu, s.s2, mask);
  o.min = __shfl_xor_sync(0xFFFFFFFFu, s.min, mask);
  o.max = __shfl_xor_sync(0xFFFFFFFFu, s.max, mask);
  o.sum_abs = __shfl_xor_sync(0xFFFFFFFFu, s.sum_abs, mask);
  o.sum_sq = __shfl_xor_sync(0xFFFFFFFFu, s.sum_sq, mask);
  o.amax = __shfl_xor_sync(0xFFFFFFFFu, s.amax, mask);
  o.min_nonzero_abs = __shfl_xor_sync(0xFFFFFFFFu, s.min_nonzero_abs, mask);
  o.max_nonzero_abs = __shfl_xor_sync(0xFFFFFFFFu, s.max_nonzero_abs, mask);
  o.max_blockwise_dynamic_range = __shfl_xor_sync(0xFFFFFFFFu, s.max_blockwise_dynamic_range, mask);
  return o;
}

// The sums of a block about one reference: each warp's in a butterfly, then thread 0 adds the
// warps' in warp order (a fixed order: the same inputs give the same bits). Must be called by
// every thread of the block; the result is valid in thread 0. `scratch` holds kThreads / 32.
template <int kThreads>
__device__ __forceinline__ StatSums block_stat_sums(StatSums s, StatSums* scratch) {
  static_assert(kThreads % 32 == 0, "whole warps");
  const int lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) s = add_stat_sums(s, shuffle_xor(s, mask));
  if (lane == 0) scratch[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) s = add_stat_sums(s, scratch[w]);
  }
  return s;
}

__device__ __forceinline__ float stat_inf() { return __int_as_float(0x7F800000); }

// One thread's running sums: shifted by the first finite value it sees, so the variance does not
// cancel catastrophically, then turned into a record. A vector of elements is summed in float
// first (error far below the 1e-5 the statistics promise), then added to double sums; minima and
// maxima run in float (exact: every input type converts to float exactly) without NaN checks, a
// NaN being remembered on the side and made the result of every extremum at the end.
//
// Statistics make the fused kernels bound by instruction issue (templates/README.md,
// "Statistics"), so bf16 vectors (add_vec) take their extrema on the packed pairs as loaded, two
// values per instruction: min and max with min.bf16x2 / max.bf16x2 and the smallest nonzero
// magnitude with one add-and-min of the pairs' 16-bit halves (sm_90's VIADDMNMX), folded into the
// float extrema by record(). Both give the same values as the float path: a bf16 converts to float
// exactly and in order.
struct StatAccumulator {
  // Float partial sums are moved into the double sums every kFlushCalls calls of add() (a 32- to
  // 64-bit conversion runs at 1/8 of the float rate on sm_90: per call it cost more than the
  // elements' own arithmetic); a float partial of kFlushCalls vectors of at most 8 elements errs
  // by at most 64 roundings (4e-6 relative; ~5e-7 typically, the errors of the partials being
  // independent), below the 1e-5 the statistics promise.
  static constexpr int kFlushCalls = 8;
  long long n = 0;
  float shift = 0;
  bool shifted = false;
  int pending = 0;
  float p1 = 0, p2 = 0, pa = 0, pq = 0;
  double s1 = 0, s2 = 0, sum_abs = 0, sum_sq = 0;
  float min = stat_inf(), max = -stat_inf();
  // The bits of the smallest nonzero |v|, less one: nonnegative floats order as their bits, and
  // 0 - 1 wraps to the largest value, so an unsigned min skips zeros with no compare and select.
  unsigned int min_nonzero_bits = 0xFFFFFFFFu;
  // The packed extrema of bf16 pairs (add_vec): per 16-bit half, the min, the max, and the bits of
  // the smallest nonzero |v| less one (as min_nonzero_bits, in bf16 bits). Neutral at the start.
  unsigned int pair_min = 0x7F807F80u;  // +inf, +inf
  unsigned int pair_max = 0xFF80FF80u;  // -inf, -inf
  unsigned int pair_nonzero_bits = 0xFFFFFFFFu;

  // Per element: the shifted sums and the |v| and v^2 sums. The amax is max(|min|, |max|) and a
  // NaN shows in the sum of |v| (never NaN otherwise: it adds no two infinities of opposite
  // sign), so neither is tracked per element.
  template <int K>
  __device__ __forceinline__ void add_sums(const float (&values)[K]) {
    if (!shifted) {
#pragma unroll
      for (int e = K - 1; e >= 0; --e) shift = isfinite(values[e]) ? values[e] : shift;
      shifted = true;
    }
    float q1 = 0, q2 = 0, qa = 0, qq = 0;
#pragma unroll
    for (int e = 0; e < K; ++e) {
      const float v = values[e];
      const float d = v - shift;
      q1 += d;
      q2 = fmaf(d, d, q2);
      qa += fabsf(v);
      qq = fmaf(v, v, qq);
    }
    n += K;
    p1 += q1;
    p2 += q2;
    pa += qa;
    pq += qq;
    if (++pending == kFlushCalls) flush();
  }

  // The sums, min, max and the smallest nonzero |v| of K values.
  template <int K>
  __device__ __forceinline__ void add(const float (&values)[K]) {
    add_sums(values);
#pragma unroll
    for (int e = 0; e < K; ++e) {
      const float v = values[e];
      min = fminf(min, v);
      max = fmaxf(max, v);
      min_nonzero_bits = umin(min_nonzero_bits, __float_as_uint(fabsf(v)) - 1u);
    }
  }

  // A vector as loaded: bf16 pairs take their extrema packed (above), other dtypes widen first.
  template <typename T, int K>
  __device__ __forceinline__ void add_vec(const Vec<T, K>& value) {
    float values[K];
    vec_to_float(value, values);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (kIsSame<T, __nv_bfloat16> && K % 2 == 0) {
      add_sums(values);
      const unsigned int* pairs = reinterpret_cast<const unsigned int*>(&value);
#pragma unroll
      for (int p = 0; p < K / 2; ++p) {
        asm("min.bf16x2 %0, %0, %1;" : "+r"(pair_min) : "r"(pairs[p]));
        asm("max.bf16x2 %0, %0, %1;" : "+r"(pair_max) : "r"(pairs[p]));
        // Per half: min(|v| - 1, running), the subtraction wrapping a zero to 0xFFFF.
        pair_nonzero_bits =
            __viaddmin_u16x2(pairs[p] & 0x7FFF7FFFu, 0xFFFFFFFFu, pair_nonzero_bits);
      }
      return;
    }
#endif
    add(values);
  }
  __device__ __forceinline__ void add(float value) {
    const float one[1] = {value};
    add(one);
  }
  __device__ __forceinline__ void flush() {
    s1 += static_cast<double>(p1);
    s2 += static_cast<double>(p2);
    sum_abs += static_cast<double>(pa);
    sum_sq += static_cast<double>(pq);
    p1 = p2 = pa = pq = 0;
    pending = 0;
  }
  // The packed bf16 extrema into the float ones: a bf16's float has its bits in the upper half.
  __device__ __forceinline__ void fold_pairs() {
    min =
        fminf(min, fminf(__uint_as_float(pair_min << 16), __uint_as_float(pair_min & 0xFFFF0000u)));
    max =
        fmaxf(max, fmaxf(__uint_as_float(pair_max << 16), __uint_as_float(pair_max & 0xFFFF0000u)));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const unsigned int bits = (pair_nonzero_bits >> (16 * half)) & 0xFFFFu;
      if (bits != 0xFFFFu) min_nonzero_bits = umin(min_nonzero_bits, ((bits + 1u) << 16) - 1u);
    }
    pair_min = 0x7F807F80u;
    pair_max = 0xFF80FF80u;
    pair_nonzero_bits = 0xFFFFFFFFu;
  }

  __device__ __forceinline__ StatRecord record() const {
    StatAccumulator all = *this;
    all.flush();
    all.fold_pairs();
    StatRecord out = empty_stat_record();
    out.count = n;
    if (n > 0) {
      const double dn = static_cast<double>(n);
      out.mean = static_cast<double>(shift) + all.s1 / dn;
      const double m2 = all.s2 - all.s1 * (all.s1 / dn);
      out.m2 = m2 > 0 ? m2 : (isnan(m2) ? m2 : 0.0);
      const bool nan = isnan(all.sum_abs);
      const double quiet_nan = __longlong_as_double(0x7FF8000000000000LL);
      out.min = nan ? quiet_nan : all.min;
      out.max = nan ? quiet_nan : all.max;
      out.sum_abs = all.sum_abs;
      out.sum_sq = all.sum_sq;
      out.amax = nan ? quiet_nan : fmaxf(fabsf(all.min), fabsf(all.max));
      // The largest nonzero magnitude is the amax (0 when every value is 0).
      const float min_nonzero_abs = all.min_nonzero_bits == 0xFFFFFFFFu
                                        ? stat_inf()
                                        : __uint_as_float(all.min_nonzero_bits + 1u);
      out.min_nonzero_abs = nan ? quiet_nan : min_nonzero_abs;
      out.max_nonzero_abs = out.amax;
    }
    return out;
  }
};

// The record of a block's accumulators (block_stat_sums about thread 0's mean, shared through
// shared memory). Must be called by every thread of the block; the result is valid in thread 0.
// `scratch` holds kThreads / 32 sums.
template <int kThreads>
__device__ __forceinline__ StatRecord block_stat_record(const StatRecord& r, StatSums* scratch) {
  __shared__ double reference;
  if (threadIdx.x == 0) reference = stat_reference(r);
  __syncthreads();
  const StatSums total = block_stat_sums<kThreads>(sums_about(r, reference), scratch);
  return record_of(total);
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_STAT_RECORD_CUH_
