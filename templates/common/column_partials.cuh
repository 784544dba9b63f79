// Second stage of the deterministic column reductions (dgamma, dbeta, dbias).
//
// First-stage kernels (norm backward, the tiled families with dbias) write one fp32 row of column
// partial sums per block (or per row group) instead of using atomics; this kernel adds those rows
// in a fixed order, so the result is bit-identical from run to run.
#ifndef OPFUSE_TEMPLATES_COMMON_COLUMN_PARTIALS_CUH_
#define OPFUSE_TEMPLATES_COMMON_COLUMN_PARTIALS_CUH_

#include "launch_rules.h"
#include "types.cuh"
#include "vec.cuh"

namespace opfuse {

template <typename Output>
struct ColumnPartialsParams {
  const float*
      partials[2];     // each [num_partials, cols] fp32, row-major; [1] used if gridDim.y == 2
  Output* outputs[2];  // each [cols]: outputs[i][c] = sum over r of partials[i][r, c]
  int num_partials;
  int cols;        // multiple of 4
  int accumulate;  // nonzero: outputs[i][c] += sum (gradient accumulation); zero: overwrite
};

// Grid: (launch::column_reduce_grid_x(cols), number of arrays (1 or 2)); block: 256 threads.
// Each block covers 128 columns: 32 lanes x 4 columns, and 8 warps that each add every 8th
// partial row; the 8 warp sums are then added in warp order.
template <typename Output>
__global__ void __launch_bounds__(launch::kColumnReduceThreads,
                                  launch::min_blocks(launch::kColumnReduceThreads,
                                                     launch::kSmallKernelRegisterBudget))
    reduce_column_partials(ColumnPartialsParams<Output> params) {
  constexpr int kSlices = launch::kColumnReduceThreads / 32;
  __shared__ float4 slice_sums[kSlices][32];

  const int lane = threadIdx.x & 31;
  const int slice = threadIdx.x >> 5;
  const int col = blockIdx.x * launch::kColumnReduceColsPerBlock + lane * 4;
  // Select with a branch, not params.partials[blockIdx.y]: a runtime index into a kernel
  // parameter array would copy the whole struct to local memory.
  const bool second = blockIdx.y != 0;
  const float* partials = second ? params.partials[1] : params.partials[0];

  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (col < params.cols) {
#pragma unroll 4
    for (int r = slice; r < params.num_partials; r += kSlices) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(
          partials + static_cast<long long>(r) * params.cols + col));
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
  }
  slice_sums[slice][lane] = sum;
  __syncthreads();
  if (slice != 0 || col >= params.cols) return;

  float total[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
  for (int s = 1; s < kSlices; ++s) {
    const float4 v = slice_sums[s][lane];
    total[0] += v.x;
    total[1] += v.y;
    total[2] += v.z;
    total[3] += v.w;
  }
  Output* out = (second ? params.outputs[1] : params.outputs[0]) + col;
  if (params.accumulate) {
    float previous[4];
    vec_to_float(load_vec_coherent<Output, 4>(out), previous);
#pragma unroll
    for (int i = 0; i < 4; ++i) total[i] += previous[i];
  }
  store_vec(out, float_to_vec<Output, 4>(total, 1.0f));
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_COLUMN_PARTIALS_CUH_
