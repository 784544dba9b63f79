// The host call depends on the template parameter: only an instantiation resolves it, so only
// the checker's instantiation of the table's example (amax_reduce<__nv_bfloat16>) can see it.
#include <cuda_bf16.h>

namespace opfuse {

template <typename Input>
struct AmaxParams {
  const Input* x;
  long long count;
  float* amax;
};

float host_widen(__nv_bfloat16 value);
float host_widen(float value);

template <typename Input>
__global__ void amax_reduce(AmaxParams<Input> params) {
  *params.amax = host_widen(params.x[0]);
}

}  // namespace opfuse
