// The fused dgrad GEMMs (fused_gemm_kernel.cuh): fc2's dgrad with the gated activation's backward,
// the gradient's FP8 cast, its amax and transposed copy in the epilogue; E5M2 (format hybrid) and
// E4M3 gradients.
#include <iterator>

#include "fused_gemm_kernel.cuh"

namespace opfuse::gpu::fused_gemm_detail {
namespace {

constexpr int kDgradTileN = 192;

#define OPFUSE_GATED_DGRAD_ENTRY(functor, name)                                                   \
  GatedDgradKernel{name, false,                                                                   \
                   &GatedDgradGemm<functor, cutlass::float_e5m2_t, kDgradTileN>::launch},         \
      GatedDgradKernel{name, true,                                                                \
                       &GatedDgradGemm<functor, cutlass::float_e4m3_t, kDgradTileN>::launch},
constexpr GatedDgradKernel kKernels[] = {OPFUSE_GATED_FUNCTORS(OPFUSE_GATED_DGRAD_ENTRY)};
#undef OPFUSE_GATED_DGRAD_ENTRY

}  // namespace

GatedDgradKernels compiled_gated_dgrad_kernels() { return {kKernels, std::size(kKernels)}; }

}  // namespace opfuse::gpu::fused_gemm_detail
