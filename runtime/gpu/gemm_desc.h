// What one GEMM is, in opfuse's row-major terms, and whether cuBLASLt can run it. Pure data and
// pure functions: no device, so the compiler side and CPU tests can use them.
//
// Note "Row-major GEMMs": every opfuse tensor is row-major and dense. A GemmDesc computes
//   D[m, n] = op(A)[m, k] * op(B)[k, n]
// where A is stored [m, k] (a_transposed = false) or [k, m] (a_transposed = true, used as its
// transpose), and B is stored [n, k] (b_transposed = true) or [k, n] (b_transposed = false).
// The three GEMMs of a linear layer y = x W^T, W stored [out, in]:
//   fprop  y[tok, out] = x[tok, in] W^T           A = x [m, k],  B = W [n, k] (b_transposed)
//   dgrad  dx[tok, in] = dy[tok, out] W           A = dy [m, k], B = W [k, n]
//   wgrad  dW[out, in] = dy^T x                   A = dy [k, m] (a_transposed), B = x [k, n]
// FP8 GEMMs on Hopper take only operands whose k is contiguous (a_transposed = false,
// b_transposed = true), so FP8 dgrad uses W's transposed copy W^T [in, out] as B, and FP8 wgrad
// uses dy^T [out, tok] as A and x^T [in, tok] as B: the column-wise copies cast_transpose makes.
// to_cublaslt() maps a desc onto cuBLASLt's column-major problem; its comment has the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "plan/enums.h"

namespace opfuse::gpu {

using plan::DType;

// The epilogues are the plan's (plan/enums.h): the plan names them, the runtime runs them.
using plan::epilogue_has_aux;   // GeluAuxBias, DGelu, DGeluBiasGrad
using plan::epilogue_has_bias;  // GemmArgs::bias: an input [n] for Bias and GeluAuxBias, an
                                // output for the two grads
using plan::GemmEpilogue;
inline std::string_view epilogue_name(GemmEpilogue e) { return plan::name(e); }
bool is_fp8(DType dtype);

// How an FP8 operand's scale_inv is given to cuBLASLt: one FP32 scalar, or a grid of FP32 scales
// (note "Block scale grids" in runtime/cpu/block_quantization.h) per 1 x 128 block along k
// (VEC128_32F) or per 128 x 128 block (BLK128x128_32F); sm_90 only (plan/gemm_caps.h).
// Micro-scaled operands (sm_100 only; on Hopper opfuse emulates them, note "Emulated
// micro-scaling" in docs/architecture.md): E8M0 scales per 32 FP8 values along k (VEC32_UE8M0,
// MXFP8) or E4M3 scales per 16 E2M1 values (VEC16_UE4M3, NVFP4), in the swizzled layout of
// cpu::swizzle_scales (runtime/cpu/micro_scaling.h). Built and checked on the CPU only: no sm_100
// device has run them.
enum class ScaleMode : std::uint8_t { Tensor, Block1D, Block2D, Vec32Ue8m0, Vec16Ue4m3 };
// "per-tensor", "1x128 blocks", "128x128 blocks", "1x32 E8M0 scales", "1x16 E4M3 scales"
std::string_view scale_mode_name(ScaleMode mode);
bool is_micro_scale_mode(ScaleMode mode);

struct GemmDesc {
  std::int64_t m = 0, n = 0, k = 0;
  DType a = DType::BF16, b = DType::BF16, d = DType::BF16;
  bool a_transposed = false;  // A stored [k, m] instead of [m, k]
  bool b_transposed = true;   // B stored [n, k] instead of [k, n]
  GemmEpilogue epilogue = GemmEpilogue::None;
  // D = A B + C with beta = 1. C has D's dtype and layout; it is D itself unless GemmArgs::c is
  // set (so a wgrad can accumulate into the main gradient).
  bool accumulate = false;
  // FP8 only: accumulate in the tensor core's fast, reduced-precision mode. TE's defaults: on for
  // fprop, off (split accumulator, periodically promoted to fp32) for dgrad and wgrad.
  bool fast_accum = false;
  std::int64_t aux_ld = 0;  // row stride of the aux matrix [m, aux_ld] in elements; 0 means n
  // FP8 operands: how their scale_inv comes (block modes: both operands, never both 2-D).
  ScaleMode a_scale = ScaleMode::Tensor;
  ScaleMode b_scale = ScaleMode::Tensor;
  // > 0: the SMs cuBLASLt may use (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), leaving the rest to a
  // collective running beside the GEMM (note "Overlapped collectives", gpu/executor_run.cpp);
  // 0: all of them.
  int sm_count_target = 0;

  friend bool operator==(const GemmDesc&, const GemmDesc&) = default;
};

struct GemmDescHash {
  std::size_t operator()(const GemmDesc& desc) const;
};

// The linear layer's GEMMs as in note "Row-major GEMMs", W stored [out, in]. When the operands
// are FP8 the desc uses the K-contiguous (transposed-copy) layout; fast_accum follows TE's
// defaults (fprop on, dgrad and wgrad off).
GemmDesc fprop_gemm(std::int64_t tokens, std::int64_t in, std::int64_t out, DType x, DType w,
                    DType y);
GemmDesc dgrad_gemm(std::int64_t tokens, std::int64_t in, std::int64_t out, DType dy, DType w,
                    DType dx);
GemmDesc wgrad_gemm(std::int64_t tokens, std::int64_t in, std::int64_t out, DType dy, DType x,
                    DType dw);

// One line naming everything about the desc, used in every error message, e.g.
// "GEMM m=16384 n=4096 k=28672: A e4m3 [m, k], B e4m3 [n, k], D bf16, epilogue none, fast_accum".
std::string describe(const GemmDesc& desc);

// Every reason cuBLASLt (or opfuse's use of it) cannot run `desc`, each saying what to change;
// empty when it can. Checks positive dims, dtype combinations, the FP8 layout, 16-byte row
// alignment of A, B, D and aux, FP8 output restrictions and epilogue restrictions.
std::vector<std::string> check_gemm(const GemmDesc& desc);

// The dtype of the bias vector and the aux matrix: D's dtype for 16-bit GEMMs and for FP32
// outputs of 16-bit inputs; BF16 for FP8 operands unless D is FP16 (cuBLASLt's FP8 table).
DType epilogue_vector_dtype(const GemmDesc& desc);

// A matrix as cuBLASLt sees it: column-major, rows x cols, leading dimension ld (elements), and
// whether the GEMM uses its transpose (CUBLAS_OP_T).
struct CublasLtOperand {
  DType dtype = DType::BF16;
  std::int64_t rows = 0, cols = 0, ld = 0;
  bool transposed = false;
  friend bool operator==(const CublasLtOperand&, const CublasLtOperand&) = default;
};

// cuBLASLt computes D = op(A_lt) op(B_lt), D being [m_lt, n_lt] column-major.
struct CublasLtProblem {
  std::int64_t m = 0, n = 0, k = 0;
  CublasLtOperand a;  // our B
  CublasLtOperand b;  // our A
  CublasLtOperand d;  // D, and C when accumulating
  std::int64_t aux_ld = 0;
  friend bool operator==(const CublasLtProblem&, const CublasLtProblem&) = default;
};

// The mapping. A row-major [r, c] matrix is, read column-major, its transpose [c, r] with ld = c.
// So row-major D[m, n] is column-major D^T [n, m], and D^T = op(B)^T op(A)^T: cuBLASLt's A is our
// B and its B is our A, with m_lt = n, n_lt = m, k_lt = k, D ld = n.
//   our B stored [n, k] (b_transposed): column-major [k, n], ld k, OP_T -> op = [n, k]
//   our B stored [k, n]:                column-major [n, k], ld n, OP_N
//   our A stored [m, k]:                column-major [k, m], ld k, OP_N -> op = [k, m]
//   our A stored [k, m] (a_transposed): column-major [m, k], ld m, OP_T
// The FP8 layout (a_transposed = false, b_transposed = true) is therefore cuBLASLt's "TN".
// Bias vectors index cuBLASLt's D rows (our columns n), BGRADB sums cuBLASLt's B (our A) over k.
CublasLtProblem to_cublaslt(const GemmDesc& desc);

}  // namespace opfuse::gpu
