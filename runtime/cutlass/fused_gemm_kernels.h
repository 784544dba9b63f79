// The kernels a build compiled in (C++17, for nvcc): fused_gemm.cu's table (nvcc, CUTLASS), or none
// (fused_gemm_off.cpp); fused_gemm.cpp implements fused_gemm.h over it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string_view>

#include "fused_gemm_args.h"

namespace opfuse::gpu::fused_gemm_detail {

struct GatedKernel {
  std::string_view activation;                                     // the functor's name
  void (*launch)(const GatedGemmArgs& args, cudaStream_t stream);  // checked arguments only
};

// C++17 (fused_gemm_args.h says why): a pointer and a count rather than a span.
struct GatedKernels {
  const GatedKernel* data = nullptr;
  size_t size = 0;
};
GatedKernels compiled_gated_kernels();

}  // namespace opfuse::gpu::fused_gemm_detail
