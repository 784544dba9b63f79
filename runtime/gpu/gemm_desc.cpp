#include "gpu/gemm_desc.h"

#include <fmt/format.h>

#include <functional>

namespace opfuse::gpu {

bool is_fp8(DType dtype) { return dtype == DType::E4M3 || dtype == DType::E5M2; }

std::string_view scale_mode_name(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::Tensor:
      return "per-tensor";
    case ScaleMode::Block1D:
      return "1x128 blocks";
    case ScaleMode::Block2D:
      return "128x128 blocks";
    case ScaleMode::Vec32Ue8m0:
      return "1x32 E8M0 scales";
    case ScaleMode::Vec16Ue4m3:
      return "1x16 E4M3 scales";
  }
  return "?";
}

bool is_micro_scale_mode(ScaleMode mode) {
  return mode == ScaleMode::Vec32Ue8m0 || mode == ScaleMode::Vec16Ue4m3;
}

std::size_t GemmDescHash::operator()(const GemmDesc& desc) const {
  std::size_t seed = 0;
  auto mix = [&seed](std::size_t value) {
    // Why this constant: the usual golden-ratio mix, so that nearby shapes spread over buckets.
    seed ^= value + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2);
  };
  const std::hash<std::int64_t> hash_int;
  mix(hash_int(desc.m));
  mix(hash_int(desc.n));
  mix(hash_int(desc.k));
  mix(hash_int(desc.aux_ld));
  mix(hash_int(desc.sm_count_target));
  mix(static_cast<std::size_t>(desc.a) | static_cast<std::size_t>(desc.b) << 8 |
      static_cast<std::size_t>(desc.d) << 16 | static_cast<std::size_t>(desc.epilogue) << 24 |
      static_cast<std::size_t>(desc.a_transposed) << 32 |
      static_cast<std::size_t>(desc.b_transposed) << 33 |
      static_cast<std::size_t>(desc.accumulate) << 34 |
      static_cast<std::size_t>(desc.fast_accum) << 35 |
      static_cast<std::size_t>(desc.a_scale) << 36 | static_cast<std::size_t>(desc.b_scale) << 40);
  return seed;
}

namespace {

// Switches FP8 descs to the K-contiguous layout (Hopper's only FP8 layout); others stay as built.
GemmDesc with_fp8_layout(GemmDesc desc) {
  if (is_fp8(desc.a) || is_fp8(desc.b)) {
    desc.a_transposed = false;
    desc.b_transposed = true;
  }
  return desc;
}

std::string stored_shape(bool transposed, char rows, char cols) {
  return transposed ? fmt::format("[{}, {}]", cols, rows) : fmt::format("[{}, {}]", rows, cols);
}

// Rows of a row-major matrix start 16-byte aligned iff its row length in bytes is a multiple
// of 16 (the base pointer being 16-byte aligned, which GemmArgs checks).
void check_row_alignment(std::vector<std::string>& reasons, std::string_view matrix,
                         std::string_view shape_text, std::string_view length_name,
                         std::int64_t length, DType dtype) {
  const std::int64_t bytes = plan::dtype_bytes(dtype);
  if (length * bytes % 16 == 0) return;
  reasons.push_back(fmt::format(
      "{} is stored {} in {}, so its rows are {} bytes: cuBLASLt needs 16-byte aligned rows; "
      "make {} (now {}) a multiple of {} (pad with zeros)",
      matrix, shape_text, plan::dtype_name(dtype), length * bytes, length_name, length,
      16 / bytes));
}

void check_dtypes(const GemmDesc& desc, std::vector<std::string>& reasons) {
  // E2M1 (NVFP4, sm_100) is quantized like FP8: check_micro_scales checks its pairing.
  const bool fp8_a = is_fp8(desc.a) || desc.a == DType::E2M1,
             fp8_b = is_fp8(desc.b) || desc.b == DType::E2M1;
  if (fp8_a != fp8_b) {
    reasons.push_back(fmt::format(
        "A is {} but B is {}: cuBLASLt multiplies FP8 only with FP8; quantize both operands or "
        "neither",
        plan::dtype_name(desc.a), plan::dtype_name(desc.b)));
    return;
  }
  if (!fp8_a) {
    if (desc.a != desc.b) {
      reasons.push_back(fmt::format("A is {} but B is {}: 16-bit GEMMs take one dtype for both",
                                    plan::dtype_name(desc.a), plan::dtype_name(desc.b)));
    }
    if (desc.d != desc.a && desc.d != DType::FP32) {
      reasons.push_back(fmt::format("D is {} but the operands are {}: write D in {} or fp32",
                                    plan::dtype_name(desc.d), plan::dtype_name(desc.a),
                                    plan::dtype_name(desc.a)));
    }
    return;
  }
  if (desc.a == DType::E5M2 && desc.b == DType::E5M2) {
    reasons.push_back(
        "A and B are both e5m2: cuBLASLt has no E5M2 x E5M2 kernel; keep one operand in e4m3 "
        "(the HYBRID format: e4m3 forward tensors, e5m2 gradients)");
  }
  if (desc.a_transposed || !desc.b_transposed) {
    reasons.push_back(fmt::format(
        "FP8 operands must both have k contiguous (A stored [m, k], B stored [n, k]: cuBLASLt's "
        "TN layout, the only FP8 layout Hopper runs), but A is stored {} and B {}: use the "
        "transposed FP8 copy that cast_transpose writes",
        stored_shape(desc.a_transposed, 'm', 'k'), stored_shape(!desc.b_transposed, 'n', 'k')));
  }
}

void check_fp8_output_and_epilogue(const GemmDesc& desc, std::vector<std::string>& reasons) {
  if (is_fp8(desc.d)) {
    if (desc.accumulate) {
      reasons.push_back(
          "an FP8 D cannot accumulate (cuBLASLt's C cannot be FP8): write D in bf16 or fp32 to "
          "accumulate");
    }
    if (desc.epilogue != GemmEpilogue::None && desc.epilogue != GemmEpilogue::Bias) {
      reasons.push_back(fmt::format(
          "an FP8 D takes only the none and bias epilogues, not {}: write D in bf16 and fuse the "
          "rest into the cast kernel that follows",
          epilogue_name(desc.epilogue)));
    }
  }
  const bool backward_epilogue = desc.epilogue == GemmEpilogue::DGelu ||
                                 desc.epilogue == GemmEpilogue::DGeluBiasGrad ||
                                 desc.epilogue == GemmEpilogue::BiasGradA;
  if (is_fp8(desc.a) && backward_epilogue) {
    reasons.push_back(fmt::format(
        "opfuse runs the {} epilogue only on 16-bit GEMMs: with FP8 operands take dgelu and dbias "
        "from the E5M2 cast kernels (activation_bwd / cast_transpose with kDbias), as TE does",
        epilogue_name(desc.epilogue)));
  }
  if (!epilogue_has_aux(desc.epilogue)) {
    if (desc.aux_ld != 0) {
      reasons.push_back(
          fmt::format("aux_ld is {} but the {} epilogue has no aux matrix: leave it 0", desc.aux_ld,
                      epilogue_name(desc.epilogue)));
    }
    return;
  }
  const std::int64_t aux_ld = desc.aux_ld == 0 ? desc.n : desc.aux_ld;
  if (aux_ld < desc.n) {
    reasons.push_back(fmt::format(
        "aux_ld {} is less than n = {}: each aux row must hold n elements; use aux_ld >= n", aux_ld,
        desc.n));
  }
  if (aux_ld % 8 != 0) {
    reasons.push_back(fmt::format(
        "the aux matrix's row stride {} is not a multiple of 8 elements, which cuBLASLt needs: "
        "pad aux_ld (or n) to a multiple of 8",
        aux_ld));
  }
}

// cuBLASLt 13's micro-scaled modes on sm_100 (its documentation's "1D Block Scaling Factors
// Layout"): both operands in one mode, FP8 values with E8M0 scales per 32 along k (MXFP8) or E2M1
// values with E4M3 scales per 16 (NVFP4), K-contiguous (TN), k a multiple of 32 (a 16-byte row of
// E2M1 codes; MXFP8's block), a 16-bit or FP32 D, no epilogue beyond a bias.
void check_micro_scales(const GemmDesc& desc, std::vector<std::string>& reasons) {
  if (desc.a_scale != desc.b_scale) {
    reasons.push_back(
        fmt::format("A has {} but B {}: a micro-scaled GEMM takes one format on both operands",
                    scale_mode_name(desc.a_scale), scale_mode_name(desc.b_scale)));
    return;
  }
  const bool mxfp8 = desc.a_scale == ScaleMode::Vec32Ue8m0;
  const auto fits = [&](DType t) { return mxfp8 ? is_fp8(t) : t == DType::E2M1; };
  if (!fits(desc.a) || !fits(desc.b)) {
    reasons.push_back(fmt::format("{} are for {} operands, not {} x {}",
                                  scale_mode_name(desc.a_scale), mxfp8 ? "FP8" : "E2M1",
                                  plan::dtype_name(desc.a), plan::dtype_name(desc.b)));
  }
  if (desc.a_transposed || !desc.b_transposed) {
    reasons.push_back("micro-scaled operands are K-contiguous (TN): A [m, k] and B [n, k]");
  }
  if (desc.k % 32 != 0) {
    reasons.push_back(
        fmt::format("k = {} is not a multiple of 32, which micro-scaled GEMMs need", desc.k));
  }
  if (is_fp8(desc.d) || desc.d == DType::E2M1) {
    reasons.push_back(fmt::format("micro-scaled GEMMs here write bf16, fp16 or fp32, not {}",
                                  plan::dtype_name(desc.d)));
  }
  if (desc.epilogue != GemmEpilogue::None && desc.epilogue != GemmEpilogue::Bias) {
    reasons.push_back(fmt::format("the {} epilogue is not available with micro-scaled operands",
                                  epilogue_name(desc.epilogue)));
  }
}

// cuBLASLt 13's block scale modes on sm_90 (docs/architecture.md, "GEMM capabilities").
void check_block_scales(const GemmDesc& desc, std::vector<std::string>& reasons) {
  const bool a_block = desc.a_scale != ScaleMode::Tensor,
             b_block = desc.b_scale != ScaleMode::Tensor;
  if (!a_block && !b_block) return;
  if (is_micro_scale_mode(desc.a_scale) || is_micro_scale_mode(desc.b_scale)) {
    check_micro_scales(desc, reasons);
    return;
  }
  if ((a_block && !is_fp8(desc.a)) || (b_block && !is_fp8(desc.b))) {
    reasons.push_back("block scales are for FP8 operands only");
    return;
  }
  if (a_block != b_block) {
    reasons.push_back(fmt::format(
        "A has {} scales but B {}: cuBLASLt's block scale modes take block scales on both "
        "operands; quantize both with one block recipe",
        scale_mode_name(desc.a_scale), scale_mode_name(desc.b_scale)));
    return;
  }
  if (desc.a_scale == ScaleMode::Block2D && desc.b_scale == ScaleMode::Block2D) {
    reasons.push_back(
        "both operands have 128x128 blocks: cuBLASLt takes 2-D blocks on one operand only; "
        "quantize one of them with 1x128 blocks");
  }
  if (desc.fast_accum) {
    reasons.push_back(
        "fast accumulation is not available with block scales: the GEMM promotes every 128-wide "
        "partial sum to FP32");
  }
  if (is_fp8(desc.d)) {
    reasons.push_back(fmt::format(
        "block-scaled GEMMs write bf16, fp16 or fp32, not {}: write D in bf16 and cast it",
        plan::dtype_name(desc.d)));
  }
  if (desc.k % 16 != 0) {
    reasons.push_back(
        fmt::format("k = {} is not a multiple of 16, which block-scaled GEMMs need", desc.k));
  }
  switch (desc.epilogue) {
    case GemmEpilogue::None:
    case GemmEpilogue::Bias:
      break;
    default:
      reasons.push_back(fmt::format(
          "the {} epilogue is not available with block scales (none and bias are; cuBLASLt 13 "
          "refuses gelu_aux_bias there)",
          epilogue_name(desc.epilogue)));
  }
}

}  // namespace

GemmDesc fprop_gemm(std::int64_t tokens, std::int64_t in, std::int64_t out, DType x, DType w,
                    DType y) {
  GemmDesc desc;
  desc.m = tokens;
  desc.n = out;
  desc.k = in;
  desc.a = x;
  desc.b = w;
  desc.d = y;
  desc.a_transposed = false;
  desc.b_transposed = true;
  desc.fast_accum = is_fp8(x);
  return desc;
}

GemmDesc dgrad_gemm(std::int64_t tokens, std::int64_t in, std::int64_t out, DType dy, DType w,
                    DType dx) {
  GemmDesc desc;
  desc.m = tokens;
  desc.n = in;
  desc.k = out;
  desc.a = dy;
  desc.b = w;
  desc.d = dx;
  desc.a_transposed = false;
  desc.b_transposed = false;  // W [out, in] = [k, n]; FP8 takes W^T [in, out] = [n, k] instead
  return with_fp8_layout(desc);
}

GemmDesc wgrad_gemm(std::int64_t tokens, std::int64_t in, std::int64_t out, DType dy, DType x,
                    DType dw) {
  GemmDesc desc;
  desc.m = out;
  desc.n = in;
  desc.k = tokens;
  desc.a = dy;
  desc.b = x;
  desc.d = dw;
  desc.a_transposed = true;   // dy [tokens, out] = [k, m]; FP8 takes dy^T [out, tokens]
  desc.b_transposed = false;  // x [tokens, in] = [k, n]; FP8 takes x^T [in, tokens]
  return with_fp8_layout(desc);
}

std::string describe(const GemmDesc& desc) {
  std::string text =
      fmt::format("GEMM m={} n={} k={}: A {} {}, B {} {}, D {}, epilogue {}", desc.m, desc.n,
                  desc.k, plan::dtype_name(desc.a), stored_shape(desc.a_transposed, 'm', 'k'),
                  plan::dtype_name(desc.b), stored_shape(!desc.b_transposed, 'n', 'k'),
                  plan::dtype_name(desc.d), epilogue_name(desc.epilogue));
  if (desc.aux_ld != 0) text += fmt::format(" (aux_ld {})", desc.aux_ld);
  if (desc.accumulate) text += ", accumulate";
  if (desc.fast_accum) text += ", fast_accum";
  if (desc.a_scale != ScaleMode::Tensor || desc.b_scale != ScaleMode::Tensor)
    text += fmt::format(", scales A {}, B {}", scale_mode_name(desc.a_scale),
                        scale_mode_name(desc.b_scale));
  if (desc.sm_count_target > 0) text += fmt::format(", on {} SMs", desc.sm_count_target);
  return text;
}

std::vector<std::string> check_gemm(const GemmDesc& desc) {
  std::vector<std::string> reasons;
  if (desc.m <= 0 || desc.n <= 0 || desc.k <= 0) {
    reasons.push_back(fmt::format(
        "m, n and k must be positive (got m={}, n={}, k={}): skip the GEMM when a dimension is "
        "empty",
        desc.m, desc.n, desc.k));
    return reasons;
  }
  check_dtypes(desc, reasons);
  check_row_alignment(reasons, "A", stored_shape(desc.a_transposed, 'm', 'k'),
                      desc.a_transposed ? "m" : "k", desc.a_transposed ? desc.m : desc.k, desc.a);
  check_row_alignment(reasons, "B", stored_shape(!desc.b_transposed, 'n', 'k'),
                      desc.b_transposed ? "k" : "n", desc.b_transposed ? desc.k : desc.n, desc.b);
  check_row_alignment(reasons, "D", "[m, n]", "n", desc.n, desc.d);
  check_fp8_output_and_epilogue(desc, reasons);
  check_block_scales(desc, reasons);
  return reasons;
}

DType epilogue_vector_dtype(const GemmDesc& desc) {
  if (!is_fp8(desc.a)) return desc.d;
  return desc.d == DType::FP16 ? DType::FP16 : DType::BF16;
}

CublasLtProblem to_cublaslt(const GemmDesc& desc) {
  CublasLtProblem problem;
  problem.m = desc.n;
  problem.n = desc.m;
  problem.k = desc.k;
  // cuBLASLt's A: our B.
  problem.a.dtype = desc.b;
  problem.a.transposed = desc.b_transposed;
  problem.a.rows = desc.b_transposed ? desc.k : desc.n;
  problem.a.cols = desc.b_transposed ? desc.n : desc.k;
  problem.a.ld = problem.a.rows;
  // cuBLASLt's B: our A.
  problem.b.dtype = desc.a;
  problem.b.transposed = desc.a_transposed;
  problem.b.rows = desc.a_transposed ? desc.m : desc.k;
  problem.b.cols = desc.a_transposed ? desc.k : desc.m;
  problem.b.ld = problem.b.rows;
  problem.d.dtype = desc.d;
  problem.d.rows = desc.n;
  problem.d.cols = desc.m;
  problem.d.ld = desc.n;
  if (epilogue_has_aux(desc.epilogue)) problem.aux_ld = desc.aux_ld == 0 ? desc.n : desc.aux_ld;
  return problem;
}

}  // namespace opfuse::gpu
