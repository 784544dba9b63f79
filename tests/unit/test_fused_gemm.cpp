// The fused-epilogue GEMMs' host side (runtime/cutlass/fused_gemm.h): which activations a build
// has and why a product is refused. tests/gpu/test_fused_gemm_gpu.cpp runs the kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cutlass/fused_gemm.h"
#include "ir/pointwise_ops.h"

namespace opfuse {
namespace {

constexpr std::string_view kSwiglu = "opfuse::pointwise_swiglu";

// The built-in gated activations without attributes: the ones gen_gated_functors compiles in.
std::vector<std::string> registry_gated_functors() {
  std::vector<std::string> names;
  for (const ir::PointwiseDef* def : ir::pointwise_defs())
    if (def->gated && def->attrs.empty() && !def->user_defined)  // spelled out, not the rule's
      names.push_back(ir::pointwise_functor_name(*def, {}));
  return names;
}

TEST(FusedGemm, CompiledActivationsAreTheRegistrysGatedOpsWithoutAttributes) {
  std::vector<std::string> compiled(gpu::gated_gemm_activations().begin(),
                                    gpu::gated_gemm_activations().end());
  if (!OPFUSE_CUTLASS_GEMMS_BUILT) {
    EXPECT_TRUE(compiled.empty());
    return;
  }
  std::vector<std::string> expected = registry_gated_functors();
  std::sort(compiled.begin(), compiled.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(compiled, expected);
  EXPECT_NE(std::find(compiled.begin(), compiled.end(), kSwiglu), compiled.end());
}

TEST(FusedGemm, RefusalsSayWhy) {
  if (!OPFUSE_CUTLASS_GEMMS_BUILT) {
    EXPECT_NE(gpu::gated_gemm_refusal(kSwiglu, 64, 64, 64, 90).find("OPFUSE_CUTLASS_GEMMS=OFF"),
              std::string::npos);
    return;
  }
  EXPECT_EQ(gpu::gated_gemm_refusal(kSwiglu, 16384, 28672, 4096, 90), "");
  EXPECT_EQ(gpu::gated_gemm_refusal(kSwiglu, 1, 32, 16, 90), "");  // ragged: any m, n % 32
  const struct {
    std::string_view activation;
    int64_t m, n, k;
    int sm;
    std::string_view says;
  } refused[] = {
      {kSwiglu, 64, 64, 64, 80, "this GPU is sm_80"},
      {kSwiglu, 64, 64, 64, 100, "this GPU is sm_100"},
      {kSwiglu, 64, 100, 64, 90, "n=100 is not a multiple of 32"},
      {kSwiglu, 64, 64, 24, 90, "k=24 is not a multiple of 16"},
      {kSwiglu, 0, 64, 64, 90, "m=0 n=64 k=64 is not a product it takes"},
      {kSwiglu, int64_t(1) << 31, 64, 64, 90, "is not a product it takes"},
      {"opfuse::pointwise_gelu", 64, 64, 64, 90,
       "no fused gated GEMM is compiled for "
       "opfuse::pointwise_gelu"},
      {"opfuse::pointwise_clamped_swiglu_limit_7_alpha_1p702", 64, 64, 64, 90,
       "only for the built-in gated activations without attributes"},
  };
  for (const auto& r : refused) {
    const std::string why = gpu::gated_gemm_refusal(r.activation, r.m, r.n, r.k, r.sm);
    EXPECT_NE(why.find(r.says), std::string::npos) << r.activation << " m=" << r.m << " n=" << r.n
                                                   << " k=" << r.k << " sm=" << r.sm << ": " << why;
  }
}

TEST(FusedGemm, TheTrainingFormAlsoNeedsRowsInSixteens) {
  if (!OPFUSE_CUTLASS_GEMMS_BUILT) GTEST_SKIP() << "a build without CUTLASS GEMMs refuses all";
  EXPECT_EQ(gpu::gated_gemm_refusal(kSwiglu, 16384, 28672, 4096, 90, true), "");
  EXPECT_EQ(gpu::gated_gemm_refusal(kSwiglu, 16, 32, 16, 90, true), "");
  // The inference form takes ragged rows; the training form's transposed copy does not.
  EXPECT_EQ(gpu::gated_gemm_refusal(kSwiglu, 200, 512, 256, 90, false), "");
  const std::string why = gpu::gated_gemm_refusal(kSwiglu, 200, 512, 256, 90, true);
  EXPECT_NE(why.find("m=200 is not a multiple of 16"), std::string::npos) << why;
  EXPECT_NE(why.find("transposed copy"), std::string::npos) << why;
  // The shared reasons come first.
  EXPECT_NE(gpu::gated_gemm_refusal(kSwiglu, 200, 100, 256, 90, true).find("n=100"),
            std::string::npos);
}

}  // namespace
}  // namespace opfuse
