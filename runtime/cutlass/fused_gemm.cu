// The inference forward's fused gated GEMMs (fused_gemm_kernel.cuh): the E4M3 output and its amax;
// and the kernel that interleaves B's gate and linear rows for them all.
#include <algorithm>
#include <iterator>

#include "fused_gemm_kernel.cuh"

namespace opfuse::gpu::fused_gemm_detail {
namespace {

#define OPFUSE_GATED_GEMM_ENTRY(functor, name) \
  GatedKernel{name, &GatedGemm<functor, false>::launch},
constexpr GatedKernel kKernels[] = {OPFUSE_GATED_FUNCTORS(OPFUSE_GATED_GEMM_ENTRY)};
#undef OPFUSE_GATED_GEMM_ENTRY

// dst row r = src row r / 2 (even r, gate) or rows / 2 + r / 2 (odd r, linear), 16 bytes a thread.
__global__ void interleave_rows_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                       int64_t half, int64_t vectors_per_row) {
  const int64_t total = 2 * half * vectors_per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / vectors_per_row, v = i % vectors_per_row;
    const int64_t from = (row & 1) != 0 ? half + (row >> 1) : (row >> 1);
    dst[i] = src[from * vectors_per_row + v];
  }
}

}  // namespace

GatedKernels compiled_gated_kernels() { return {kKernels, std::size(kKernels)}; }

// One pass over 16-byte vectors. cudaMemcpy2DAsync with 16-byte aligned rows was the first
// implementation: it ran at the copy engine's pace, about 70 GB/s for the large MLP's fc1 weight
// (3.3 ms per training step, which recasts the weight every step).
cudaError_t launch_interleave_rows(const void* src, void* dst, int64_t rows, int64_t row_bytes,
                                   cudaStream_t stream) {
  const int64_t vectors_per_row = row_bytes / 16;
  const int64_t total = rows * vectors_per_row;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads,
                                                              int64_t(1) << 16));
  interleave_rows_kernel<<<blocks, kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), rows / 2, vectors_per_row);
  return cudaGetLastError();
}

}  // namespace opfuse::gpu::fused_gemm_detail
