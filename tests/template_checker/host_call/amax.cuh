// Host functions called from device code: fopen from a __device__ function (Clang itself
// rejects it), a host helper from a __host__ __device__ one (Clang accepts the definition; the
// checker does not) and a constexpr function without __device__ (Clang accepts it, nvcc does not).
#include <cuda_bf16.h>
#include <stdio.h>

namespace opfuse {

template <typename Input>
struct AmaxParams {
  const Input* x;
  long long count;
  float* amax;
};

inline float host_clamp(float value) { return value > 1.0f ? 1.0f : value; }

__device__ inline void open_log() { (void)fopen("/tmp/amax.log", "w"); }

__host__ __device__ inline float clamped_amax(float value) { return host_clamp(value); }

constexpr float twice(float value) { return 2.0f * value; }

template <typename Input>
__global__ void amax_reduce(AmaxParams<Input> params) {
  open_log();
  *params.amax = twice(clamped_amax(*params.amax));
}

}  // namespace opfuse
