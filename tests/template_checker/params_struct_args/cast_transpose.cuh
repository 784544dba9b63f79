// cast_transpose's params struct with its type arguments swapped: codegen spells the struct
// with the kernel's dtype parameters in order (CastParams<Input, Output>).
#include <cuda_bf16.h>

namespace opfuse {

template <typename Output, typename Input>
struct CastParams {
  const Input* x;
  Output* y;
  int rows;
};

template <typename Input, typename Output, bool kWriteTranspose = true, bool kDbias = false>
__global__ void cast_transpose(CastParams<Output, Input> params) {
  if (params.rows == 0 && kWriteTranspose && kDbias) params.y = nullptr;
}

}  // namespace opfuse
