// amax of a whole tensor (current scaling: the amax and, with a scale_record, the scale derived
// from it by the last block; then the cast).
//
// Entry point: amax_reduce<Input>. The amax buffer must hold 0 (or a smaller running maximum)
// before the launch: the kernel only raises it, with one atomicMax per block. With a
// scale_record, amax is that record's running max (0 between launches; quantizer_record.cuh).
#ifndef OPFUSE_TEMPLATES_AMAX_CUH_
#define OPFUSE_TEMPLATES_AMAX_CUH_

#include "common/fp8.cuh"
#include "common/launch_rules.h"
#include "common/quantizer_record.cuh"
#include "common/vec.cuh"

namespace opfuse {

template <typename Input>
struct AmaxParams {
  const Input* x;   // count elements, 16-byte aligned
  long long count;  // any value >= 0 (a tail that is not a whole vector is handled)
  float* amax;      // max over |x| (NaN ignored) is atomically merged into *amax
  const QuantizerRecord* scale_record;  // current scaling: the last block derives the scale from
                                        // *amax (derive_current_scale); nullptr: not derived
};

// Block: launch::kAmaxThreads (512). Grid: any gridDim.x >= 1; recommended
// min(ceil(count / (vector_elems * 512 * 4)), 4 * SMs): each thread keeps 4 loads in flight.
template <typename Input>
__global__ void __launch_bounds__(launch::kAmaxThreads,
                                  launch::min_blocks(launch::kAmaxThreads,
                                                     launch::kSmallKernelRegisterBudget))
    amax_reduce(AmaxParams<Input> params) {
  constexpr int kVec = launch::vector_elems(sizeof(Input));
  constexpr int kUnroll = 4;
  __shared__ float scratch[launch::kAmaxThreads / 32];

  const long long vector_count = params.count / kVec;
  const long long stride = static_cast<long long>(gridDim.x) * launch::kAmaxThreads;
  float amax = 0.0f;
  for (long long base = static_cast<long long>(blockIdx.x) * launch::kAmaxThreads + threadIdx.x;
       base < vector_count; base += kUnroll * stride) {
    Vec<Input, kVec> vectors[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * stride < vector_count) {
        vectors[u] = load_vec<Input, kVec>(params.x + (base + u * stride) * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * stride < vector_count) {
        float values[kVec];
        vec_to_float(vectors[u], values);
#pragma unroll
        for (int j = 0; j < kVec; ++j) amax = accumulate_amax(amax, values[j]);
      }
    }
  }
  // The last count % kVec elements: block 0 reads them one by one.
  if (blockIdx.x == 0) {
    for (long long i = vector_count * kVec + threadIdx.x; i < params.count;
         i += launch::kAmaxThreads) {
      amax = accumulate_amax(amax, to_float(params.x[i]));
    }
  }
  commit_block_amax<launch::kAmaxThreads>(amax, params.amax, scratch);
  derive_current_scale(params.scale_record);  // thread 0, after its block's amax atomic
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_AMAX_CUH_
