// Device-callable by CUDA's rules, not allowed in kernel templates: the standard library (NVRTC
// has none), the device heap and printf. The std::max in `larger` depends on T: only the
// instantiation of the table's example resolves it.
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>

namespace opfuse {

template <typename Input>
struct AmaxParams {
  const Input* x;
  long long count;
  float* amax;
};

template <typename T>
__device__ T larger(T a, T b) {
  return std::max(a, b);
}

template <typename Input>
__global__ void amax_reduce(AmaxParams<Input> params) {
  float* scratch = static_cast<float*>(malloc(sizeof(float)));
  *scratch = std::max(*params.amax, 0.0f);
  printf("amax %f\n", *scratch);
  free(scratch);
  int* counter = new int(0);
  delete counter;
  *params.amax = static_cast<float>(larger(params.x[0], params.x[1]));
}

}  // namespace opfuse
