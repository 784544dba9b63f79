// The build without CUTLASS GEMMs (OPFUSE_CUTLASS_GEMMS=OFF): no kernel is compiled in, so
// gated_gemm_refusal refuses every product with that reason and the executor runs the unfused
// steps.
#include "fused_gemm_kernels.h"

namespace opfuse::gpu::fused_gemm_detail {

GatedKernels compiled_gated_kernels() { return {}; }
GatedKernels compiled_gated_training_kernels() { return {}; }
cudaError_t launch_interleave_rows(const void*, void*, int64_t, int64_t, cudaStream_t) {
  return cudaErrorNotSupported;
}

}  // namespace opfuse::gpu::fused_gemm_detail
