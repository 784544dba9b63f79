// The training forward's fused gated GEMMs (fused_gemm_kernel.cuh): the E4M3 output, its amax,
// its transposed copy and the GEMM's BF16 output that backward reads.
#include <iterator>

#include "fused_gemm_kernel.cuh"

namespace opfuse::gpu::fused_gemm_detail {
namespace {

#define OPFUSE_GATED_GEMM_ENTRY(functor, name) GatedKernel{name, &GatedGemm<functor, true>::launch},
constexpr GatedKernel kKernels[] = {OPFUSE_GATED_FUNCTORS(OPFUSE_GATED_GEMM_ENTRY)};
#undef OPFUSE_GATED_GEMM_ENTRY

}  // namespace

GatedKernels compiled_gated_training_kernels() { return {kKernels, std::size(kKernels)}; }

}  // namespace opfuse::gpu::fused_gemm_detail
