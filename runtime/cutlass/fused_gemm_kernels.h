// The kernels a build compiled in (C++17, for nvcc): the tables of fused_gemm.cu and
// fused_gemm_training.cu (nvcc, CUTLASS), or none (fused_gemm_off.cpp); fused_gemm.cpp implements
// fused_gemm.h over them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
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
GatedKernels compiled_gated_kernels();           // inference: fused_gemm.cu
GatedKernels compiled_gated_training_kernels();  // training: fused_gemm_training.cu

// interleave_gated_rows (fused_gemm.h) as one kernel over 16-byte vectors: rows even, row_bytes a
// multiple of 16, both pointers 16-byte aligned (checked by the caller); cudaErrorNotSupported in
// a build without CUTLASS GEMMs, where the caller copies with cudaMemcpy2DAsync instead.
cudaError_t launch_interleave_rows(const void* src, void* dst, int64_t rows, int64_t row_bytes,
                                   cudaStream_t stream);

}  // namespace opfuse::gpu::fused_gemm_detail
