// The GPU runtime's device-free parts: which GEMMs check_gemm accepts and why it rejects the rest,
// the row-major -> cuBLASLt mapping (checked numerically by emulating cuBLASLt's column-major
// GEMM), GemmArgs checks, quantizer-state layout, error messages, and the GPU-less machine:
// gpu_available() says why, and nothing built here needs libcuda.
#include <cublasLt.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "gpu/cuda_check.h"
#include "gpu/device.h"
#include "gpu/gemm.h"
#include "gpu/gemm_desc.h"
#include "gpu/quantizer_state.h"
#include "opfuse/error.h"
#include "passes/plan_quantization.h"
#include "reference/cpu_quantizers.h"
#include "test_support.h"

namespace opfuse::gpu {
namespace {

constexpr std::int64_t kTokens = 16384, kHidden = 4096, kFfn = 28672;

// True when some reason contains `needle`; prints all of them otherwise.
::testing::AssertionResult has_reason(const std::vector<std::string>& reasons,
                                      const std::string& needle) {
  for (const std::string& reason : reasons) {
    if (reason.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  }
  auto failure = ::testing::AssertionFailure() << "no reason mentions '" << needle << "':";
  for (const std::string& reason : reasons) failure << "\n  - " << reason;
  return failure;
}

std::string joined(const std::vector<std::string>& reasons) {
  std::string text;
  for (const std::string& reason : reasons) text += "\n  - " + reason;
  return text;
}

// ---- check_gemm: the seed MLP's GEMMs ----------------------------------------------------------

TEST(CheckGemm, AcceptsEverySeedMlpGemmInBf16AndFp8) {
  // fc1: hidden -> ffn; swiglu halves it; fc2: ffn / 2 -> hidden.
  const std::pair<std::int64_t, std::int64_t> layers[] = {{kHidden, kFfn}, {kFfn / 2, kHidden}};
  for (const auto& [in, out] : layers) {
    const std::vector<GemmDesc> descs = {
        fprop_gemm(kTokens, in, out, DType::BF16, DType::BF16, DType::BF16),
        dgrad_gemm(kTokens, in, out, DType::BF16, DType::BF16, DType::BF16),
        wgrad_gemm(kTokens, in, out, DType::BF16, DType::BF16, DType::BF16),
        fprop_gemm(kTokens, in, out, DType::E4M3, DType::E4M3, DType::BF16),
        dgrad_gemm(kTokens, in, out, DType::E5M2, DType::E4M3, DType::BF16),
        wgrad_gemm(kTokens, in, out, DType::E5M2, DType::E4M3, DType::BF16),
        fprop_gemm(kTokens, in, out, DType::E4M3, DType::E4M3, DType::E4M3),
    };
    for (const GemmDesc& desc : descs) {
      EXPECT_TRUE(check_gemm(desc).empty()) << describe(desc) << joined(check_gemm(desc));
    }
  }
  GemmDesc main_grad = wgrad_gemm(kTokens, kHidden, kFfn, DType::E5M2, DType::E4M3, DType::FP32);
  main_grad.accumulate = true;
  EXPECT_TRUE(check_gemm(main_grad).empty()) << joined(check_gemm(main_grad));
}

TEST(CheckGemm, LinearBuildersFollowTeDefaultsAndTheFp8Layout) {
  const GemmDesc fprop = fprop_gemm(kTokens, kHidden, kFfn, DType::E4M3, DType::E4M3, DType::BF16);
  EXPECT_TRUE(fprop.fast_accum);
  EXPECT_EQ(fprop.m, kTokens);
  EXPECT_EQ(fprop.n, kFfn);
  EXPECT_EQ(fprop.k, kHidden);
  const GemmDesc dgrad = dgrad_gemm(kTokens, kHidden, kFfn, DType::E5M2, DType::E4M3, DType::BF16);
  EXPECT_FALSE(dgrad.fast_accum);
  EXPECT_EQ(dgrad.n, kHidden);
  EXPECT_EQ(dgrad.k, kFfn);
  EXPECT_FALSE(dgrad.a_transposed);
  EXPECT_TRUE(dgrad.b_transposed);  // W^T [in, out]: the transposed FP8 copy
  const GemmDesc bf16_dgrad =
      dgrad_gemm(kTokens, kHidden, kFfn, DType::BF16, DType::BF16, DType::BF16);
  EXPECT_FALSE(bf16_dgrad.b_transposed);  // W [out, in] itself
  const GemmDesc wgrad = wgrad_gemm(kTokens, kHidden, kFfn, DType::E5M2, DType::E4M3, DType::BF16);
  EXPECT_EQ(wgrad.m, kFfn);
  EXPECT_EQ(wgrad.n, kHidden);
  EXPECT_EQ(wgrad.k, kTokens);
  EXPECT_FALSE(wgrad.a_transposed);
  EXPECT_TRUE(wgrad.b_transposed);
  EXPECT_FALSE(wgrad.fast_accum);
  const GemmDesc bf16_wgrad =
      wgrad_gemm(kTokens, kHidden, kFfn, DType::BF16, DType::BF16, DType::BF16);
  EXPECT_TRUE(bf16_wgrad.a_transposed);
  EXPECT_FALSE(bf16_wgrad.b_transposed);
}

// ---- check_gemm: each rejection, alone, with its message ---------------------------------------

GemmDesc good_fp8() { return fprop_gemm(256, 512, 384, DType::E4M3, DType::E4M3, DType::BF16); }
GemmDesc good_bf16() { return fprop_gemm(77, 512, 384, DType::BF16, DType::BF16, DType::BF16); }

TEST(CheckGemm, RejectsFp8OperandsThatAreNotKContiguous) {
  GemmDesc desc = good_fp8();
  desc.b_transposed = false;
  const auto reasons = check_gemm(desc);
  ASSERT_EQ(reasons.size(), 1u) << joined(reasons);
  EXPECT_TRUE(has_reason(reasons, "TN layout"));
  EXPECT_TRUE(has_reason(reasons, "cast_transpose"));
  desc = good_fp8();
  desc.a_transposed = true;
  EXPECT_TRUE(has_reason(check_gemm(desc), "A stored [m, k]"));
}

TEST(CheckGemm, RejectsE5m2TimesE5m2) {
  GemmDesc desc = good_fp8();
  desc.a = desc.b = DType::E5M2;
  const auto reasons = check_gemm(desc);
  ASSERT_EQ(reasons.size(), 1u) << joined(reasons);
  EXPECT_TRUE(has_reason(reasons, "no E5M2 x E5M2 kernel"));
}

TEST(CheckGemm, RejectsFp8KNotAMultipleOf16) {
  const GemmDesc desc = fprop_gemm(256, 4104, 384, DType::E4M3, DType::E4M3, DType::BF16);
  const auto reasons = check_gemm(desc);
  ASSERT_EQ(reasons.size(), 2u) << joined(reasons);  // A's rows and B's rows
  EXPECT_TRUE(has_reason(reasons, "A is stored [m, k] in e4m3, so its rows are 4104 bytes"));
  EXPECT_TRUE(has_reason(reasons, "make k (now 4104) a multiple of 16"));
  // The same k is fine in bf16 (8208-byte rows).
  EXPECT_TRUE(
      check_gemm(fprop_gemm(256, 4104, 384, DType::BF16, DType::BF16, DType::BF16)).empty());
}

TEST(CheckGemm, RejectsFp8WgradWhenTokensAreNotAMultipleOf16) {
  const GemmDesc desc = wgrad_gemm(200, 512, 384, DType::E5M2, DType::E4M3, DType::BF16);
  EXPECT_TRUE(has_reason(check_gemm(desc), "make k (now 200) a multiple of 16"));
}

TEST(CheckGemm, RejectsBf16RowsNotAMultipleOf8) {
  const GemmDesc desc = fprop_gemm(77, 100, 384, DType::BF16, DType::BF16, DType::BF16);
  const auto reasons = check_gemm(desc);
  EXPECT_TRUE(has_reason(reasons, "make k (now 100) a multiple of 8"));
  const GemmDesc narrow_out = fprop_gemm(77, 512, 36, DType::BF16, DType::BF16, DType::BF16);
  EXPECT_TRUE(has_reason(check_gemm(narrow_out), "D is stored [m, n] in bf16"));
  // Tokens are never a row length of a bf16 GEMM: any count works, in all three GEMMs.
  EXPECT_TRUE(check_gemm(dgrad_gemm(77, 512, 384, DType::BF16, DType::BF16, DType::BF16)).empty());
  EXPECT_TRUE(check_gemm(wgrad_gemm(77, 512, 384, DType::BF16, DType::BF16, DType::BF16)).empty());
}

TEST(CheckGemm, RejectsMixingFp8WithBf16AndMismatchedOutputs) {
  GemmDesc desc = good_fp8();
  desc.b = DType::BF16;
  EXPECT_TRUE(has_reason(check_gemm(desc), "FP8 only with FP8"));
  desc = good_bf16();
  desc.b = DType::FP16;
  EXPECT_TRUE(has_reason(check_gemm(desc), "take one dtype for both"));
  desc = good_bf16();
  desc.d = DType::FP16;
  EXPECT_TRUE(has_reason(check_gemm(desc), "write D in bf16 or fp32"));
  desc.d = DType::FP32;
  EXPECT_TRUE(check_gemm(desc).empty()) << joined(check_gemm(desc));
}

TEST(CheckGemm, RejectsFp8OutputThatAccumulatesOrTakesAComplexEpilogue) {
  GemmDesc desc = good_fp8();
  desc.d = DType::E4M3;
  desc.accumulate = true;
  const auto reasons = check_gemm(desc);
  ASSERT_EQ(reasons.size(), 1u) << joined(reasons);
  EXPECT_TRUE(has_reason(reasons, "an FP8 D cannot accumulate"));
  desc.accumulate = false;
  desc.epilogue = GemmEpilogue::GeluAuxBias;
  EXPECT_TRUE(has_reason(check_gemm(desc), "only the none and bias epilogues, not gelu_aux_bias"));
  desc.epilogue = GemmEpilogue::Bias;
  EXPECT_TRUE(check_gemm(desc).empty()) << joined(check_gemm(desc));
}

TEST(CheckGemm, RejectsBackwardEpiloguesOnFp8Operands) {
  for (const GemmEpilogue epilogue :
       {GemmEpilogue::DGelu, GemmEpilogue::DGeluBiasGrad, GemmEpilogue::BiasGradA}) {
    GemmDesc desc = good_fp8();
    desc.epilogue = epilogue;
    EXPECT_TRUE(has_reason(check_gemm(desc), "only on 16-bit GEMMs")) << epilogue_name(epilogue);
    GemmDesc bf16 = good_bf16();
    bf16.epilogue = epilogue;
    EXPECT_TRUE(check_gemm(bf16).empty()) << joined(check_gemm(bf16));
  }
}

TEST(CheckGemm, RejectsNonPositiveDimsAndBadAuxStrides) {
  GemmDesc desc = good_bf16();
  desc.m = 0;
  const auto reasons = check_gemm(desc);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_TRUE(has_reason(reasons, "skip the GEMM when a dimension is empty"));

  desc = good_bf16();
  desc.aux_ld = 512;
  EXPECT_TRUE(has_reason(check_gemm(desc), "has no aux matrix"));
  desc.epilogue = GemmEpilogue::GeluAuxBias;
  EXPECT_TRUE(check_gemm(desc).empty()) << joined(check_gemm(desc));
  desc.aux_ld = 100;  // < n = 384
  EXPECT_TRUE(has_reason(check_gemm(desc), "aux_ld 100 is less than n = 384"));
  desc.aux_ld = 388;
  EXPECT_TRUE(has_reason(check_gemm(desc), "not a multiple of 8 elements"));
}

TEST(CheckGemm, EpilogueVectorsAreBf16ForFp8OperandsAndDsDtypeOtherwise) {
  GemmDesc desc = good_fp8();
  desc.d = DType::FP32;
  EXPECT_EQ(epilogue_vector_dtype(desc), DType::BF16);
  desc.d = DType::FP16;
  EXPECT_EQ(epilogue_vector_dtype(desc), DType::FP16);
  desc.d = DType::E4M3;
  EXPECT_EQ(epilogue_vector_dtype(desc), DType::BF16);
  desc = good_bf16();
  desc.d = DType::FP32;
  EXPECT_EQ(epilogue_vector_dtype(desc), DType::FP32);
}

// ---- check_gemm: block scales (cuBLASLt 13 on sm_90)
// ---------------------------------------------

GemmDesc block_fprop() {
  GemmDesc d = fprop_gemm(kTokens, kHidden, kFfn, DType::E4M3, DType::E4M3, DType::BF16);
  d.fast_accum = false;
  d.a_scale = ScaleMode::Block1D;  // x: 1 x 128
  d.b_scale = ScaleMode::Block2D;  // W: 128 x 128
  return d;
}

TEST(CheckGemm, AcceptsTheBlockScaledGemmsOfALinear) {
  EXPECT_TRUE(check_gemm(block_fprop()).empty()) << joined(check_gemm(block_fprop()));
  GemmDesc bias = block_fprop();
  bias.epilogue = GemmEpilogue::Bias;
  EXPECT_TRUE(check_gemm(bias).empty()) << joined(check_gemm(bias));
  GemmDesc wgrad = wgrad_gemm(kTokens, kHidden, kFfn, DType::E5M2, DType::E4M3, DType::BF16);
  wgrad.a_scale = wgrad.b_scale = ScaleMode::Block1D;
  wgrad.accumulate = true;
  EXPECT_TRUE(check_gemm(wgrad).empty()) << joined(check_gemm(wgrad));
  EXPECT_NE(describe(block_fprop()).find("scales A 1x128 blocks, B 128x128 blocks"),
            std::string::npos)
      << describe(block_fprop());
}

TEST(CheckGemm, RejectsWhatBlockScaleModesCannotRun) {
  GemmDesc two_by_two = block_fprop();
  two_by_two.a_scale = ScaleMode::Block2D;
  EXPECT_TRUE(has_reason(check_gemm(two_by_two), "2-D blocks on one operand only"));
  GemmDesc mixed = block_fprop();
  mixed.b_scale = ScaleMode::Tensor;
  EXPECT_TRUE(has_reason(check_gemm(mixed), "block scales on both operands"));
  GemmDesc fast = block_fprop();
  fast.fast_accum = true;
  EXPECT_TRUE(has_reason(check_gemm(fast), "fast accumulation is not available"));
  GemmDesc fp8_out = block_fprop();
  fp8_out.d = DType::E4M3;
  EXPECT_TRUE(has_reason(check_gemm(fp8_out), "block-scaled GEMMs write bf16"));
  GemmDesc dgelu = dgrad_gemm(kTokens, kHidden, kFfn, DType::E5M2, DType::E4M3, DType::BF16);
  dgelu.a_scale = ScaleMode::Block1D;
  dgelu.b_scale = ScaleMode::Block2D;
  dgelu.epilogue = GemmEpilogue::DGelu;
  EXPECT_TRUE(has_reason(check_gemm(dgelu), "not available with block scales"));
  GemmDesc gelu = block_fprop();
  gelu.epilogue = GemmEpilogue::GeluAuxBias;
  EXPECT_TRUE(has_reason(check_gemm(gelu), "refuses gelu_aux_bias"));
  GemmDesc bf16 = fprop_gemm(kTokens, kHidden, kFfn, DType::BF16, DType::BF16, DType::BF16);
  bf16.a_scale = ScaleMode::Block1D;
  EXPECT_TRUE(has_reason(check_gemm(bf16), "FP8 operands only"));
}

TEST(GemmDesc, HashAndEqualityTellEveryFieldApart) {
  std::vector<GemmDesc> descs(1, good_fp8());
  auto vary = [&descs](auto change) {
    GemmDesc desc = good_fp8();
    change(desc);
    descs.push_back(desc);
  };
  vary([](GemmDesc& d) { d.m += 16; });
  vary([](GemmDesc& d) { d.n += 16; });
  vary([](GemmDesc& d) { d.k += 16; });
  vary([](GemmDesc& d) { d.a = DType::E5M2; });
  vary([](GemmDesc& d) { d.b = DType::E5M2; });
  vary([](GemmDesc& d) { d.d = DType::FP32; });
  vary([](GemmDesc& d) { d.a_transposed = true; });
  vary([](GemmDesc& d) { d.b_transposed = false; });
  vary([](GemmDesc& d) { d.epilogue = GemmEpilogue::Bias; });
  vary([](GemmDesc& d) { d.accumulate = true; });
  vary([](GemmDesc& d) { d.fast_accum = !d.fast_accum; });
  vary([](GemmDesc& d) { d.aux_ld = 8; });
  vary([](GemmDesc& d) { d.a_scale = ScaleMode::Block1D; });
  vary([](GemmDesc& d) { d.b_scale = ScaleMode::Block2D; });
  // A GEMM beside a collective in flight (note "Overlapped collectives") is a plan of its own.
  vary([](GemmDesc& d) { d.sm_count_target = 116; });
  std::unordered_set<GemmDesc, GemmDescHash> set(descs.begin(), descs.end());
  EXPECT_EQ(set.size(), descs.size());
  std::unordered_set<std::size_t> hashes;
  for (const GemmDesc& desc : descs) hashes.insert(GemmDescHash{}(desc));
  EXPECT_EQ(hashes.size(), descs.size());
  EXPECT_EQ(GemmDescHash{}(good_fp8()), GemmDescHash{}(good_fp8()));
}

TEST(GemmDesc, DescribeNamesShapesDtypesAndFlags) {
  GemmDesc desc = wgrad_gemm(kTokens, kHidden, kFfn, DType::BF16, DType::BF16, DType::FP32);
  desc.accumulate = true;
  EXPECT_EQ(describe(desc),
            "GEMM m=28672 n=4096 k=16384: A bf16 [k, m], B bf16 [k, n], D fp32, epilogue none, "
            "accumulate");
  EXPECT_EQ(describe(good_fp8()),
            "GEMM m=256 n=384 k=512: A e4m3 [m, k], B e4m3 [n, k], D bf16, epilogue none, "
            "fast_accum");
  GemmDesc beside = good_fp8();
  beside.sm_count_target = 116;
  EXPECT_EQ(describe(beside),
            "GEMM m=256 n=384 k=512: A e4m3 [m, k], B e4m3 [n, k], D bf16, epilogue none, "
            "fast_accum, on 116 SMs");
}

// ---- the row-major -> cuBLASLt mapping ---------------------------------------------------------

TEST(CublasLtMapping, Fp8FpropIsTnWithOperandsSwapped) {
  const CublasLtProblem p =
      to_cublaslt(fprop_gemm(kTokens, kHidden, kFfn, DType::E4M3, DType::E4M3, DType::BF16));
  EXPECT_EQ(p.m, kFfn);
  EXPECT_EQ(p.n, kTokens);
  EXPECT_EQ(p.k, kHidden);
  EXPECT_EQ(p.a, (CublasLtOperand{DType::E4M3, kHidden, kFfn, kHidden, true}));      // W, OP_T
  EXPECT_EQ(p.b, (CublasLtOperand{DType::E4M3, kHidden, kTokens, kHidden, false}));  // x, OP_N
  EXPECT_EQ(p.d, (CublasLtOperand{DType::BF16, kFfn, kTokens, kFfn, false}));
}

TEST(CublasLtMapping, Bf16DgradIsNnAndWgradIsNt) {
  const CublasLtProblem dgrad =
      to_cublaslt(dgrad_gemm(kTokens, kHidden, kFfn, DType::BF16, DType::BF16, DType::BF16));
  EXPECT_EQ(dgrad.a, (CublasLtOperand{DType::BF16, kHidden, kFfn, kHidden, false}));  // W
  EXPECT_EQ(dgrad.b, (CublasLtOperand{DType::BF16, kFfn, kTokens, kFfn, false}));     // dy
  const CublasLtProblem wgrad =
      to_cublaslt(wgrad_gemm(kTokens, kHidden, kFfn, DType::BF16, DType::BF16, DType::BF16));
  EXPECT_EQ(wgrad.m, kHidden);
  EXPECT_EQ(wgrad.n, kFfn);
  EXPECT_EQ(wgrad.k, kTokens);
  EXPECT_EQ(wgrad.a, (CublasLtOperand{DType::BF16, kHidden, kTokens, kHidden, false}));  // x
  EXPECT_EQ(wgrad.b, (CublasLtOperand{DType::BF16, kFfn, kTokens, kFfn, true}));         // dy
  EXPECT_EQ(wgrad.d, (CublasLtOperand{DType::BF16, kHidden, kFfn, kHidden, false}));
}

// cuBLASLt's definition, literally: column-major storage, element (r, c) at r + c * ld, and
// op(X) = X or X^T.
double column_major_op(const std::vector<double>& data, const CublasLtOperand& operand,
                       std::int64_t row, std::int64_t col) {
  if (operand.transposed) std::swap(row, col);
  return data[static_cast<std::size_t>(row + col * operand.ld)];
}

TEST(CublasLtMapping, EmulatedColumnMajorGemmComputesTheRowMajorProduct) {
  const std::int64_t m = 5, n = 7, k = 3;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> small(-9, 9);
  for (const bool a_transposed : {false, true}) {
    for (const bool b_transposed : {false, true}) {
      GemmDesc desc = good_bf16();
      desc.m = m;
      desc.n = n;
      desc.k = k;
      desc.a_transposed = a_transposed;
      desc.b_transposed = b_transposed;
      std::vector<double> a(m * k), b(n * k);  // stored row-major as the desc says
      for (double& v : a) v = small(rng);
      for (double& v : b) v = small(rng);
      auto op_a = [&](std::int64_t i, std::int64_t l) {
        return a_transposed ? a[l * m + i] : a[i * k + l];
      };
      auto op_b = [&](std::int64_t l, std::int64_t j) {
        return b_transposed ? b[j * k + l] : b[l * n + j];
      };
      const CublasLtProblem p = to_cublaslt(desc);
      ASSERT_EQ(p.m * p.n, m * n);
      std::vector<double> d(static_cast<std::size_t>(p.d.ld * p.d.cols), 0.0);
      for (std::int64_t i = 0; i < p.m; ++i) {
        for (std::int64_t j = 0; j < p.n; ++j) {
          double sum = 0;
          // cuBLASLt's A is our B and its B our A.
          for (std::int64_t l = 0; l < p.k; ++l) {
            sum += column_major_op(b, p.a, i, l) * column_major_op(a, p.b, l, j);
          }
          d[static_cast<std::size_t>(i + j * p.d.ld)] = sum;
        }
      }
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          double want = 0;
          for (std::int64_t l = 0; l < k; ++l) want += op_a(i, l) * op_b(l, j);
          // Row-major D[i, j] sits at i * n + j.
          ASSERT_EQ(d[static_cast<std::size_t>(i * n + j)], want)
              << "a_transposed " << a_transposed << " b_transposed " << b_transposed << " at (" << i
              << ", " << j << ")";
        }
      }
    }
  }
}

// ---- GemmArgs ----------------------------------------------------------------------------------

TEST(CheckGemmArgs, NamesMissingSuperfluousAndMisalignedPointers) {
  alignas(256) static unsigned char memory[4096];
  GemmDesc desc = good_fp8();
  desc.epilogue = GemmEpilogue::Bias;
  GemmArgs args;
  args.a = memory;
  args.b = memory + 256;
  args.d = memory + 512;
  args.bias = memory + 1024;
  args.a_scale_inv = reinterpret_cast<const float*>(memory + 2048);
  args.b_scale_inv = reinterpret_cast<const float*>(memory + 2064);
  EXPECT_TRUE(check_gemm_args(desc, args).empty()) << joined(check_gemm_args(desc, args));

  // cuBLASLt 13 needs 16-byte aligned scale pointers (a float array's next element is not).
  GemmArgs packed_scales = args;
  packed_scales.b_scale_inv = reinterpret_cast<const float*>(memory + 2052);
  EXPECT_TRUE(has_reason(check_gemm_args(desc, packed_scales), "b_scale_inv (0x"));

  GemmArgs misaligned = args;
  misaligned.a = memory + 8;
  EXPECT_TRUE(has_reason(check_gemm_args(desc, misaligned), "a (0x"));
  EXPECT_TRUE(has_reason(check_gemm_args(desc, misaligned), "is not 16-byte aligned"));

  GemmArgs no_scale = args;
  no_scale.b_scale_inv = nullptr;
  EXPECT_TRUE(has_reason(check_gemm_args(desc, no_scale), "b_scale_inv is null"));

  GemmArgs no_bias = args;
  no_bias.bias = nullptr;
  EXPECT_TRUE(has_reason(check_gemm_args(desc, no_bias), "uses the bias vector"));

  GemmArgs amax_without_fp8_d = args;
  amax_without_fp8_d.d_amax = reinterpret_cast<float*>(memory + 3072);
  EXPECT_TRUE(has_reason(check_gemm_args(desc, amax_without_fp8_d), "d_amax is set but"));

  GemmDesc bf16 = good_bf16();
  GemmArgs scaled_bf16 = args;
  scaled_bf16.bias = nullptr;
  EXPECT_EQ(check_gemm_args(bf16, scaled_bf16).size(), 2u);  // both scale_invs are superfluous
}

// ---- quantizer state: settings and layout ------------------------------------------------------

TEST(QuantizerSettings, MatchTheCpuTwinForDelayedAndCurrentRecipes) {
  ir::Recipe delayed;
  delayed.kind = ir::RecipeKind::DelayedScaling;
  delayed.amax_history = 16;
  delayed.amax_compute = ir::AmaxCompute::MostRecent;
  delayed.margin = 1;
  ir::Recipe current;
  current.kind = ir::RecipeKind::CurrentScaling;
  current.format = ir::Fp8Format::E4M3;
  current.amax_epsilon = 1e-4;
  current.power_of_2_scale = true;
  auto spec = [](const ir::Recipe& recipe, bool gradient) {
    return passes::recipe_spec(recipe,
                               gradient ? ir::QuantizerRole::GradOutput : ir::QuantizerRole::Input);
  };
  for (const ir::Recipe& recipe : {delayed, current}) {
    for (const bool gradient : {false, true}) {
      const QuantizerSettings gpu = quantizer_settings("fc1.input", spec(recipe, gradient));
      const cpu::Quantizer cpu = cpu::make_quantizer("fc1.input", spec(recipe, gradient));
      EXPECT_EQ(gpu.format, cpu.format);
      EXPECT_EQ(gpu.current_scaling, cpu.current_scaling);
      EXPECT_EQ(static_cast<std::size_t>(gpu.history_length), cpu.state.amax_history.size());
      EXPECT_EQ(gpu.amax_compute, cpu.delayed.algo);
      EXPECT_EQ(gpu.margin, cpu.delayed.margin);
      EXPECT_EQ(gpu.amax_epsilon, cpu.amax_epsilon);
      EXPECT_EQ(gpu.power_of_2_scale, cpu.power_of_2_scale);
    }
  }
  EXPECT_EQ(quantizer_settings("g", spec(delayed, true)).format, cpu::Fp8Format::E5M2);  // HYBRID
  EXPECT_EQ(quantizer_settings("g", spec(current, true)).format, cpu::Fp8Format::E4M3);
  EXPECT_EQ(quantizer_settings("g", spec(delayed, false)).history_length, 16);
  EXPECT_EQ(quantizer_settings("g", spec(current, false)).history_length, 1);
}

// ---- check_gemm: micro-scaled operands (cuBLASLt 13 on sm_100; built, never run on Hopper)

GemmDesc micro_fprop(ScaleMode mode) {
  const DType t = mode == ScaleMode::Vec16Ue4m3 ? DType::E2M1 : DType::E4M3;
  GemmDesc d = fprop_gemm(256, 4096, 1024, t, t, DType::BF16);
  d.fast_accum = false;
  d.a_scale = d.b_scale = mode;
  return d;
}

TEST(CheckGemm, MicroScaledGemmsTakeOneFormatOnBothTnOperands) {
  for (const ScaleMode mode : {ScaleMode::Vec32Ue8m0, ScaleMode::Vec16Ue4m3}) {
    SCOPED_TRACE(scale_mode_name(mode));
    EXPECT_TRUE(check_gemm(micro_fprop(mode)).empty()) << joined(check_gemm(micro_fprop(mode)));
    GemmDesc bias = micro_fprop(mode);
    bias.epilogue = GemmEpilogue::Bias;
    EXPECT_TRUE(check_gemm(bias).empty()) << joined(check_gemm(bias));
    GemmDesc mixed = micro_fprop(mode);
    mixed.b_scale = ScaleMode::Block1D;
    EXPECT_TRUE(has_reason(check_gemm(mixed), "one format on both operands"));
    GemmDesc k = micro_fprop(mode);
    k.k = 4080;  // a multiple of 16, not of 32
    EXPECT_TRUE(has_reason(check_gemm(k), "k = 4080 is not a multiple of 32"));
    GemmDesc nn = micro_fprop(mode);
    nn.b_transposed = false;
    EXPECT_TRUE(has_reason(check_gemm(nn), "K-contiguous (TN)"));
    GemmDesc gelu = micro_fprop(mode);
    gelu.epilogue = GemmEpilogue::GeluAuxBias;
    EXPECT_TRUE(has_reason(check_gemm(gelu), "not available with micro-scaled operands"));
    GemmDesc fp8_out = micro_fprop(mode);
    fp8_out.d = DType::E4M3;
    EXPECT_TRUE(has_reason(check_gemm(fp8_out), "write bf16, fp16 or fp32"));
  }
  GemmDesc wrong_values = micro_fprop(ScaleMode::Vec16Ue4m3);
  wrong_values.a = wrong_values.b = DType::E4M3;
  EXPECT_TRUE(has_reason(check_gemm(wrong_values), "for E2M1 operands, not e4m3 x e4m3"));
  GemmDesc fp4_as_mx = micro_fprop(ScaleMode::Vec32Ue8m0);
  fp4_as_mx.a = DType::E2M1;
  EXPECT_TRUE(has_reason(check_gemm(fp4_as_mx), "for FP8 operands, not e2m1 x e4m3"));
  // The descriptor's modes are cuBLASLt's enumerators.
  EXPECT_EQ(cublaslt_scale_mode(ScaleMode::Vec32Ue8m0), CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0);
  EXPECT_EQ(cublaslt_scale_mode(ScaleMode::Vec16Ue4m3), CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3);
  EXPECT_EQ(cublaslt_scale_mode(ScaleMode::Block1D), CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
  EXPECT_NE(describe(micro_fprop(ScaleMode::Vec16Ue4m3)).find("1x16 E4M3 scales"),
            std::string::npos)
      << describe(micro_fprop(ScaleMode::Vec16Ue4m3));
}

TEST(QuantizerSettings, BlockSpecsKeepNoStateAndNvfp4KeepsItsTensorScale) {
  plan::QuantSpec block;
  block.scaling = plan::ScalingKind::Block2D;
  block.block = {128, 128};
  block.format = plan::DType::E5M2;
  block.power_of_2_scale = true;
  block.epsilon = 0.5;
  const QuantizerSettings gpu = quantizer_settings("fc1.weight", block);
  EXPECT_TRUE(gpu.block_scaled);
  EXPECT_FALSE(gpu.current_scaling);
  EXPECT_EQ(gpu.history_length, 1);
  const cpu::Quantizer cpu_q = cpu::make_quantizer("fc1.weight", block);
  EXPECT_TRUE(cpu_q.block_scaled);
  EXPECT_TRUE(cpu_q.block.two_d);
  EXPECT_TRUE(cpu_q.block.power_of_2_scale);
  EXPECT_EQ(cpu_q.block.epsilon, 0.5f);
  EXPECT_EQ(cpu_q.block.format, cpu::Fp8Format::E5M2);
  EXPECT_FALSE(cpu::make_quantizer("fc1.input", plan::QuantSpec{}).block_scaled);

  // MXFP8 keeps nothing; NVFP4's tensor scale is a current-scaling scale over 448 * 6, on the
  // device and in the CPU twin.
  plan::QuantSpec mx;
  mx.scaling = plan::ScalingKind::MicroScaled;
  mx.block = {1, 32};
  mx.scale_dtype = plan::ScaleDType::E8M0;
  EXPECT_TRUE(quantizer_settings("fc1.input", mx).block_scaled);
  EXPECT_TRUE(cpu::make_quantizer("fc1.input", mx).block_scaled);
  EXPECT_TRUE(cpu::make_quantizer("fc1.input", mx).micro_scaled);
  plan::QuantSpec fp4 = mx;
  fp4.format = plan::DType::E2M1;
  fp4.block = {1, 16};
  fp4.scale_dtype = plan::ScaleDType::E4M3;
  const QuantizerSettings fp4_gpu = quantizer_settings("fc1.input", fp4);
  EXPECT_FALSE(fp4_gpu.block_scaled);
  EXPECT_TRUE(fp4_gpu.current_scaling);
  EXPECT_EQ(fp4_gpu.fp8_max, 2688.0f);
  EXPECT_FALSE(fp4_gpu.power_of_2_scale);
  const cpu::Quantizer fp4_cpu = cpu::make_quantizer("fc1.input", fp4);
  EXPECT_TRUE(fp4_cpu.current_scaling);
  EXPECT_EQ(fp4_cpu.delayed.fp8_max, 2688.0f);
  plan::QuantSpec e2m1_per_tensor;
  e2m1_per_tensor.format = plan::DType::E2M1;  // E2M1 without blocks is no format opfuse has
  EXPECT_THROW(quantizer_settings("fc1.input", e2m1_per_tensor), UsageError);
  EXPECT_THROW(cpu::make_quantizer("fc1.input", e2m1_per_tensor), opfuse::Error);
  plan::QuantSpec bf16;
  bf16.format = plan::DType::BF16;
  EXPECT_THROW(quantizer_settings("fc1.input", bf16), UsageError);
}

TEST(QuantizerLayout, SectionsAreAlignedAndDisjoint) {
  std::vector<QuantizerSettings> settings(3);
  settings[0].history_length = 16;
  settings[1].current_scaling = true;
  settings[1].history_length = 1024;  // ignored: current scaling keeps one slot
  settings[2].history_length = 5;
  const QuantizerLayout layout = plan_quantizer_layout(settings);
  EXPECT_EQ(layout.history_lengths, (std::vector<int>{16, 1, 5}));
  // [start, end) of every section, in order.
  std::vector<std::pair<std::size_t, std::size_t>> sections = {
      {layout.records_offset, layout.records_offset + 3 * sizeof(QuantizerRecord)},
      {layout.scales_offset, layout.scales_offset + 3 * QuantizerLayout::kScalarSlotBytes},
      {layout.scale_invs_offset, layout.scale_invs_offset + 3 * QuantizerLayout::kScalarSlotBytes},
      // One contiguous array of amax slots: one all-reduce covers every quantizer.
      {layout.amaxes_offset, layout.amaxes_offset + 3 * QuantizerLayout::kScalarSlotBytes}};
  // Delayed scaling keeps its older slots (slot 0 is in the amaxes section); current scaling its
  // four words.
  const std::vector<std::size_t> words = {15, QuantizerLayout::kCurrentScalingWords, 4};
  for (std::size_t i = 0; i < 3; ++i) {
    sections.emplace_back(layout.history_offsets[i],
                          layout.history_offsets[i] + words[i] * sizeof(float));
  }
  for (std::size_t i = 0; i < sections.size(); ++i) {
    EXPECT_EQ(sections[i].first % 16, 0u) << "section " << i;
    if (i > 0) {
      EXPECT_LE(sections[i - 1].second, sections[i].first) << "section " << i;
    }
  }
  EXPECT_GE(layout.total_bytes, sections.back().second);
  EXPECT_LT(layout.total_bytes, sections.back().second + 16);

  settings[2].history_length = 0;
  EXPECT_THROW(plan_quantizer_layout(settings), UsageError);
}

// ---- errors and the GPU-less machine -----------------------------------------------------------

TEST(CudaCheck, ErrorsNameTheCallTheErrorAndWhatToCheck) {
  try {
    check_cuda(cudaErrorMemoryAllocation, "cudaMallocAsync(&p, n, s)", "file.cpp", 12,
               "allocating 64 bytes");
    FAIL() << "check_cuda did not throw";
  } catch (const CudaError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("cudaMallocAsync(&p, n, s) failed at file.cpp:12"), std::string::npos)
        << message;
    EXPECT_NE(message.find("cudaErrorMemoryAllocation"), std::string::npos) << message;
    EXPECT_NE(message.find("(allocating 64 bytes)"), std::string::npos) << message;
    EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
    EXPECT_EQ(error.library(), "CUDA");
    EXPECT_EQ(error.code(), static_cast<int>(cudaErrorMemoryAllocation));
  }
  EXPECT_NO_THROW(check_cuda(cudaSuccess, "x", "f", 1));
  const std::string cublas =
      cublas_error_message(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul(...)", "g.cpp", 3, "GEMM");
  EXPECT_NE(cublas.find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << cublas;
  EXPECT_NE(cublas.find("check_gemm()"), std::string::npos) << cublas;
  EXPECT_THROW(check_cublas(CUBLAS_STATUS_INVALID_VALUE, "c", "f", 1), CudaError);
}

TEST(Device, NvrtcArchIsArchSpecificOnHopperAndBlackwell) {
  EXPECT_EQ(nvrtc_arch_for(9, 0), "sm_90a");
  EXPECT_EQ(nvrtc_arch_for(10, 0), "sm_100a");
  EXPECT_EQ(nvrtc_arch_for(10, 3), "sm_103a");
  EXPECT_EQ(nvrtc_arch_for(8, 9), "sm_89");
  EXPECT_EQ(nvrtc_arch_for(12, 0), "sm_120");
}

TEST(Device, GpuAvailableSaysWhyNotInsteadOfThrowing) {
  std::string why;
  if (gpu_available(&why)) {
    EXPECT_TRUE(why.empty()) << why;
    const DeviceInfo device = current_device();
    EXPECT_GT(device.sm_count, 0);
    EXPECT_EQ(device.arch, nvrtc_arch_for(device.major, device.minor));
  } else {
    // The CI machines: no driver library at all, or no device.
    EXPECT_TRUE(why.rfind("no CUDA driver:", 0) == 0 || why.rfind("no GPU:", 0) == 0 ||
                why.rfind("no usable GPU:", 0) == 0)
        << why;
    EXPECT_FALSE(gpu_available(nullptr));
    EXPECT_THROW(current_device(), CudaError);
    EXPECT_THROW(GemmRunner runner, CudaError);
  }
}

TEST(Device, TestProgramLinkingTheGpuRuntimeNeedsNoLibcuda) {
  char path[PATH_MAX] = {};
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  ASSERT_GT(length, 0);
  const test::CommandResult result =
      test::run_command("readelf -d '" + std::string(path, static_cast<std::size_t>(length)) + "'");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  ASSERT_NE(result.output.find("libc.so"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("libcuda.so"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace opfuse::gpu
