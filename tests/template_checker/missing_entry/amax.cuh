// amax_reduce is spelled amax_max here: the table's entry is missing, and the kernel that is
// there is not in the table.
#include <cuda_bf16.h>

namespace opfuse {

template <typename Input>
struct AmaxParams {
  const Input* x;
  long long count;
  float* amax;
};

template <typename Input>
__global__ void amax_max(AmaxParams<Input> params) {
  if (params.count == 0) *params.amax = 0.0f;
}

}  // namespace opfuse
