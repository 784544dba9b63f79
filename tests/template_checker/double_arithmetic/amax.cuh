// Double-precision arithmetic in device code: a warning, an error under --Werror (which the
// template_checker test uses).
#include <cuda_bf16.h>

namespace opfuse {

template <typename Input>
struct AmaxParams {
  const Input* x;
  long long count;
  float* amax;
};

__device__ inline float halve(float value) { return value * 0.5; }

template <typename Input>
__global__ void amax_reduce(AmaxParams<Input> params) {
  *params.amax = halve(*params.amax);
}

}  // namespace opfuse
