// The device-resident record of one FP8 quantizer, the current-scaling scale formula, and the
// arrival count that lets the kernel measuring a current-scaling amax derive the scale itself.
//
// A current-scaling quantizer's amax_history holds four words:
//   [0] the measured amax (what the quantizer state reports; the scale's input),
//   [1] the arrival count of derive_current_scale (an unsigned int),
//   [2] the running max the measuring kernel's blocks raise (its `amax` pointer),
//   [3] the number of measurements so far (an unsigned int, wrapping): NVFP4's stochastic
//       rounding draws the Philox bits of a cast with it as the step (micro_scale.cuh), so every
//       cast draws fresh bits and the CPU reference, counting alike, draws the same.
//   (16 bytes in all.)
// Words 1 and 2 hold 0 between launches: the runtime zeroes them once, and the last block of every
// measuring launch returns them to 0, so no memset precedes a measurement.
#ifndef OPFUSE_TEMPLATES_COMMON_QUANTIZER_RECORD_CUH_
#define OPFUSE_TEMPLATES_COMMON_QUANTIZER_RECORD_CUH_

#include "types.cuh"

namespace opfuse {

inline constexpr int kCurrentScalingWords = 4;
inline constexpr int kArrivalsWord = 1;
inline constexpr int kRunningAmaxWord = 2;
inline constexpr int kMeasurementsWord = 3;

enum ScalingMode : int {
  kDelayedScalingMax = 0,         // amax = fmaxf over the history from 0 (a NaN slot is skipped)
  kDelayedScalingMostRecent = 1,  // amax = history[0] (this step's amax)
  kCurrentScaling = 2,            // scale from amax_history[0] (the amax just measured)
};

// Device-resident state of one quantizer; the runtime keeps an array of these (one per quantized
// tensor of the sequence) in device memory. 56 bytes, 8-byte aligned; host code mirrors it field
// for field (runtime/gpu/quantizer_state.h).
struct QuantizerRecord {
  // Delayed scaling: this step's amax (the cast kernels atomicMax into it), in the state's amax
  // section, where every quantizer's amax sits in one 16-byte slot of one contiguous array, so a
  // tensor-parallel run max-reduces them all with one all-reduce. Current scaling: word 0 of
  // amax_history (the measured amax).
  float* amax;
  float* amax_history;   // delayed: the history_length - 1 older amaxes, oldest last (slot k of
                         // TE's history is amax_history[k - 1]; slot 0 is *amax); current: [4],
                         // see the top of this file
  float* scale;          // [1] read by the cast kernels: fp8 = cast(value * scale)
  float* scale_inv;      // [1] = 1 / scale, given to the GEMM as the operand's dequant factor
  int history_length;    // delayed: >= 1 (any length); current: ignored
  int mode;              // ScalingMode
  float fp8_max;         // largest finite value of the format: 448 (E4M3) or 57344 (E5M2)
  int margin;            // delayed: scale is divided by 2^margin
  float epsilon;         // current: amax is clamped to at least epsilon
  int power_of_2_scale;  // current: nonzero rounds the scale down to a power of 2
};

// Current scaling: 1 for a non-finite amax or max(amax, epsilon) == 0, else
// fp8_max / max(amax, epsilon), an infinite result clamped to FLT_MAX, optionally rounded down to
// a power of 2 by masking the mantissa bits.
__device__ __forceinline__ float current_scaling_scale(float amax, float fp8_max, float epsilon,
                                                       bool power_of_2) {
  if (!is_finite_float(amax)) return 1.0f;
  const float clamped = fmaxf(amax, epsilon);
  if (clamped == 0.0f) return 1.0f;
  float scale = __fdiv_rn(fp8_max, clamped);
  if (is_inf_float(scale)) scale = kFloatMax;
  if (power_of_2) scale = __uint_as_float(__float_as_uint(scale) & 0xFF800000u);
  return scale;
}

// Writes a current-scaling quantizer's scale and scale_inv from its measured amax.
__device__ __forceinline__ void store_current_scale(const QuantizerRecord& record, float amax) {
  const float scale =
      current_scaling_scale(amax, record.fp8_max, record.epsilon, record.power_of_2_scale != 0);
  *record.scale = scale;
  *record.scale_inv = __fdiv_rn(1.0f, scale);
}

// Current scaling fused into the kernel that measures the amax (amax_reduce, or the kernel that
// produces the tensor), whose `amax` pointer is word kRunningAmaxWord of the record's history:
// thread 0 of every block calls this once, after its block's atomicMax; the block that arrives
// last takes the running max (resetting it to 0), stores it as the measured amax, returns the
// arrival count to 0 and derives scale and scale_inv. No launch before or after is needed. Any
// grid; record == nullptr: nothing.
__device__ __forceinline__ void derive_current_scale(const QuantizerRecord* record) {
  if (record == nullptr || threadIdx.x != 0) return;
  float* words = record->amax_history;
  unsigned int* arrivals = reinterpret_cast<unsigned int*>(words + kArrivalsWord);
  const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
  __threadfence();  // this block's atomicMax is visible to whichever block arrives last
  if (atomicAdd(arrivals, 1u) != blocks - 1) return;
  __threadfence();
  // An atomic exchange: it sees every block's atomicMax (a non-negative float, never NaN) and
  // leaves 0 for the next measurement.
  const float measured =
      __int_as_float(atomicExch(reinterpret_cast<int*>(words + kRunningAmaxWord), 0));
  *arrivals = 0u;
  words[0] = measured;
  reinterpret_cast<unsigned int*>(words)[kMeasurementsWord] += 1u;
  store_current_scale(*record, measured);
}

}  // namespace opfuse

#endif  // OPFUSE_TEMPLATES_COMMON_QUANTIZER_RECORD_CUH_
