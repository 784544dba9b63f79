// One kernel that updates every FP8 quantizer of a sequence after a step (no per-tensor launches,
// no host sync): delayed scaling rolls the amax history and derives the scale from it; current
// scaling derives the scale from the amax just measured.
//
// Entry point: update_scales<kThreads>. All arithmetic is IEEE (explicit __fdiv_rn, no fast-math)
// so a CPU reference following the formulas in templates/README.md matches bit for bit.
#ifndef OPFUSE_TEMPLATES_SCALE_UPDATE_CUH_
#define OPFUSE_TEMPLATES_SCALE_UPDATE_CUH_

#include "common/launch_rules.h"
#include "common/quantizer_record.cuh"
#include "common/reduce.cuh"
#include "common/types.cuh"

namespace opfuse {

struct ScaleUpdateParams {
  const QuantizerRecord* records;  // [count], device memory
  int count;
};

// Delayed scaling: (fp8_max / amax) / 2^margin when amax is finite and > 0, else the old scale;
// an infinite scale is clamped to FLT_MAX.
__device__ __forceinline__ float delayed_scaling_scale(float amax, float old_scale, float fp8_max,
                                                       int margin) {
  float scale = old_scale;
  if (is_finite_float(amax) && amax > 0.0f) {
    scale = __fdiv_rn(__fdiv_rn(fp8_max, amax), ldexpf(1.0f, margin));
  }
  if (is_inf_float(scale)) scale = kFloatMax;
  return scale;
}

// Block: kThreads (launch::kScaleUpdateThreads = 256). Grid: one block per record
// (gridDim.x = count; a smaller grid strides over the records).
//
// Delayed scaling, for a history old[0..L-1] (old[0] is *record.amax, old[k] is
// record.amax_history[k - 1]): amax = fmaxf over old from 0 (TE's kernel: a NaN slot never wins,
// an Inf slot does and then keeps the old scale), or old[0] as it is; the history becomes new[0] =
// 0, new[k] = old[k + 1] for 1 <= k <= L - 2, new[L - 1] = old[0] (L == 1: new[0] = 0), i.e. TE's
// roll by -1 with the fresh slot 0 zeroed for the next step's atomicMax.
template <int kThreads = launch::kScaleUpdateThreads>
__global__ void __launch_bounds__(kThreads,
                                  launch::min_blocks(kThreads, launch::kSmallKernelRegisterBudget))
    update_scales(ScaleUpdateParams params) {
  __shared__ float scratch[kThreads / 32];
  for (int index = blockIdx.x; index < params.count; index += gridDim.x) {
    const QuantizerRecord record = params.records[index];
    if (record.mode == kCurrentScaling) {
      if (threadIdx.x == 0) store_current_scale(record, *record.amax);
      continue;  // uniform across the block: the record is the same for every thread
    }

    // The older slots old[1..L-1] are older[0..L-2]: they shift left by one, and newest lands
    // last. The shift runs in place, chunk by chunk from the front: a chunk's writes only touch
    // indices below every index the later chunks read, so one barrier per chunk (between its
    // reads and its writes) suffices. Every thread reads newest before thread 0 zeroes it, and
    // the block barrier below orders the two.
    float* older = record.amax_history;
    const int length = record.history_length - 1;  // older slots
    const float newest = *record.amax;
    float window_max = fmaxf(0.0f, newest);
    for (int chunk = 0; chunk < length; chunk += kThreads) {
      const int k = chunk + threadIdx.x;
      float shifted = newest;
      if (k < length) {
        window_max = fmaxf(window_max, older[k]);
        if (k + 1 < length) shifted = older[k + 1];
      }
      __syncthreads();
      if (k < length) older[k] = shifted;
    }
    float amax = block_allreduce<kThreads>(window_max, scratch, MaxOp{});
    if (record.mode == kDelayedScalingMostRecent) amax = newest;
    if (threadIdx.x == 0) {
      *record.amax = 0.0f;
      const float scale = delayed_scaling_scale(amax, *record.scale, record.fp8_max, record.margin);
      *record.scale = scale;
      *record.scale_inv = __fdiv_rn(1.0f, scale);
    }
  }
}

// Current scaling over a tensor-parallel group (runtime/gpu/quantizer_state.h, finish_current):
// the kernel that measured the amax ran without its record, so no block derived a scale from this
// rank's part alone, and the runtime max-reduced the running max over the ranks in place. This
// takes that max as the measured amax, returns the running max to 0 for the next measurement and
// derives scale and scale_inv, as derive_current_scale does in the one-rank case. Block: any
// (thread 0 works); grid: any (strides over the records).
template <int kThreads = 32>
__global__ void __launch_bounds__(kThreads) finish_current_scales(ScaleUpdateParams params) {
  if (threadIdx.x != 0) return;
  for (int index = blockIdx.x; index < params.count; index += gridDim.x) {
    const QuantizerRecord record = params.records[index];
    float* words = record.amax_history;
    const float measured = words[kRunningAmaxWord];
    words[kRunningAmaxWord] = 0.0f;
    words[0] = measured;
    reinterpret_cast<unsigned int*>(words)[kMeasurementsWord] += 1u;
    store_current_scale(record, measured);
  }
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_SCALE_UPDATE_CUH_
