// Statistics of one tensor for the precision-debug features (docs/debugging.md, "Statistics on the
// device"): the moments LogTensorStats needs, reduced into one record per tensor without a host
// sync and deterministically (the same input gives the same bits: every sum runs in an order
// fixed by the launch shape, never by atomics or scheduling).
//
// Entry points: tensor_stats_partial<Input> (one record per thread block, into `partials`) and
// tensor_stats_final (sums the partials in a fixed order into the slot's record, or into one
// record per block for a second launch). Without blockwise ranges a block reads its rows as one
// contiguous range with 16-byte loads (memory-bound: no division or 64-bit index math per element).
// StatRecord has the layout of debug::TensorMoments (debug/stats.h): keep the two identical.
#ifndef OPFUSE_TEMPLATES_TENSOR_STATS_CUH_
#define OPFUSE_TEMPLATES_TENSOR_STATS_CUH_

#include "common/launch_rules.h"
#include "common/stat_record.cuh"
#include "common/types.cuh"
#include "common/vec.cuh"

namespace opfuse {

template <typename Input>
struct TensorStatsParams {
  const Input* x;  // rows x cols, row-major
  long long rows;
  int cols;
  int block_size;        // max_blockwise_dynamic_range's blocks; 0: not measured
  int dims;              // 1: blocks of block_size along a row; 2: block_size x block_size tiles
  int rows_per_block;    // rows one thread block reduces (a multiple of block_size when dims == 2)
  StatRecord* partials;  // gridDim.x records
};

struct TensorStatsFinalParams {
  const StatRecord* partials;
  int count;           // records in partials
  StatRecord* record;  // gridDim.x records: block b merges the b-th of gridDim.x equal runs
};

// The elements [begin, end) of x, one thread's share of a block's contiguous range: 16-byte
// loads, four in flight, when the range's start is 16-byte aligned, else one element at a time.
template <typename Input>
__device__ __forceinline__ void accumulate_range(const Input* x, long long begin, long long end,
                                                 StatAccumulator& acc) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(Input));
  constexpr int kUnroll = 4;
  const int threads = static_cast<int>(blockDim.x);
  long long i = begin;
  if (reinterpret_cast<unsigned long long>(x + begin) % 16 == 0) {
    const long long stride = static_cast<long long>(threads) * kVec;
    long long v = begin + static_cast<long long>(threadIdx.x) * kVec;
    for (; v + (kUnroll - 1) * stride + kVec <= end; v += kUnroll * stride) {
      Vec<Input, kVec> chunk[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) chunk[u] = load_vec<Input, kVec>(x + v + u * stride);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) acc.add_vec(chunk[u]);
    }
    for (; v + kVec <= end; v += stride) {
      acc.add_vec(load_vec<Input, kVec>(x + v));
    }
    // What no whole vector covers: the tail after the last full vector of the range.
    i = begin + ((end - begin) / kVec) * kVec;
  }
  for (long long e = i + threadIdx.x; e < end; e += threads) acc.add(to_float(x[e]));
}

// Block: launch::kTensorStatsThreads. Grid: ceil(rows / rows_per_block) blocks, at most
// launch::kTensorStatsMaxBlocks. A warp reduces one unit at a time (a blockwise block, else a
// stretch of one row), its lanes reading consecutive elements.
template <typename Input>
__global__ void __launch_bounds__(launch::kTensorStatsThreads,
                                  launch::min_blocks(launch::kTensorStatsThreads,
                                                     launch::kTensorStatsRegisterBudget))
    tensor_stats_partial(TensorStatsParams<Input> params) {
  constexpr int kWarps = launch::kTensorStatsThreads / 32;
  __shared__ StatSums warp_sums[kWarps];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const long long row_begin = static_cast<long long>(blockIdx.x) * params.rows_per_block;
  const long long row_end = row_begin + params.rows_per_block < params.rows
                                ? row_begin + params.rows_per_block
                                : params.rows;
  const bool blockwise = params.block_size > 0;
  const int unit_cols = blockwise ? params.block_size : 1024;
  const int unit_rows = blockwise && params.dims == 2 ? params.block_size : 1;
  const long long col_units = (params.cols + unit_cols - 1) / unit_cols;
  const long long row_units =
      row_end > row_begin ? (row_end - row_begin + unit_rows - 1) / unit_rows : 0;
  StatAccumulator acc;
  double block_range = 0;
  if (!blockwise && row_end > row_begin) {
    accumulate_range(params.x, row_begin * params.cols, row_end * params.cols, acc);
  }
  for (long long u = warp; blockwise && u < row_units * col_units; u += kWarps) {
    const long long r0 = row_begin + (u / col_units) * unit_rows;
    const int c0 = static_cast<int>((u % col_units) * unit_cols);
    const int h = static_cast<int>(row_end - r0 < unit_rows ? row_end - r0 : unit_rows);
    const int w = params.cols - c0 < unit_cols ? params.cols - c0 : unit_cols;
    float unit_amax = 0.0f;
    float unit_min = __int_as_float(0x7F800000);  // +inf: no nonzero value yet
    bool unit_nan = false;
    for (int e = lane; e < h * w; e += 32) {
      const long long row = r0 + e / w;
      const float v = to_float(params.x[row * params.cols + c0 + e % w]);
      acc.add(v);
      const float a = fabsf(v);
      unit_nan |= isnan(v);
      unit_amax = fmaxf(unit_amax, a);
      if (a != 0.0f) unit_min = fminf(unit_min, a);
    }
    if (blockwise) {
#pragma unroll
      for (int mask = 16; mask > 0; mask >>= 1) {
        unit_amax = fmaxf(unit_amax, __shfl_xor_sync(0xFFFFFFFFu, unit_amax, mask));
        unit_min = fminf(unit_min, __shfl_xor_sync(0xFFFFFFFFu, unit_min, mask));
      }
      unit_nan = __any_sync(0xFFFFFFFFu, unit_nan);
      if (lane == 0) {
        if (unit_nan) {
          block_range = __longlong_as_double(0x7FF8000000000000LL);  // NaN
        } else if (unit_amax > 0.0f && !isnan(block_range)) {
          const double range =
              log2(static_cast<double>(unit_amax)) - log2(static_cast<double>(unit_min));
          block_range = range > block_range ? range : block_range;
        }
      }
    }
  }
  StatRecord r = acc.record();
  // With blockwise ranges, lane 0 holds its warp's blockwise range (it reads element 0 of every
  // unit, so its count is not 0 when the warp had a unit: merging cannot drop the range with an
  // empty record).
  r.max_blockwise_dynamic_range = block_range;
  const StatRecord total = block_stat_record<launch::kTensorStatsThreads>(r, warp_sums);
  if (threadIdx.x == 0) params.partials[blockIdx.x] = total;
}

// Block: kThreads (a multiple of 32). Grid: 1 (every partial into the slot's record), or more to
// merge a run of partials per block into an array of records that a launch of grid 1 merges next
// (the tens of thousands of partials of a tiled kernel's statistics). The partials are summed
// about the mean of the run's first record (StatSums: no division per merge): thread t adds the
// records t, t + kThreads, ... of the block's run in order (a warp's loads are contiguous), each
// warp's sums meet in a fixed butterfly, then thread 0 adds the warps' in warp order: the same
// partials give the same bits.
template <int kThreads = 32>
__global__ void __launch_bounds__(kThreads,
                                  launch::min_blocks(kThreads, launch::kTensorStatsRegisterBudget))
    tensor_stats_final(TensorStatsFinalParams params) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  __shared__ StatSums warp_sums[kThreads / 32];
  const int t = static_cast<int>(threadIdx.x);
  const int run = (params.count + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  const int begin = static_cast<int>(blockIdx.x) * run;
  const int end = begin + run < params.count ? begin + run : params.count;
  const double ref = begin < end ? stat_reference(params.partials[begin]) : 0.0;
  StatSums total = sums_about(empty_stat_record(), ref);
#pragma unroll 4
  for (int b = begin + t; b < end; b += kThreads)
    total = add_stat_sums(total, sums_about(params.partials[b], ref));
  total = block_stat_sums<kThreads>(total, warp_sums);
  if (t == 0) params.record[blockIdx.x] = record_of(total);
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_TENSOR_STATS_CUH_
