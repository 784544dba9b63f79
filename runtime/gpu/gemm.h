// cuBLASLt GEMMs as opfuse runs them: a GemmDesc (gemm_desc.h) says what to compute, GemmArgs
// where the data is, GemmRunner runs it on a stream with the algorithm chosen once per desc.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/gemm_desc.h"

namespace opfuse::gpu {

// cuBLASLt's CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE value of a scale mode
// (cublasLtMatmulMatrixScale_t).
std::int32_t cublaslt_scale_mode(ScaleMode mode);

// Device pointers of one GEMM. a, b, c, d, bias and aux must be 16-byte aligned (the pool gives
// 256); scale pointers point at one float each.
struct GemmArgs {
  const void* a = nullptr;  // stored as the desc says (note "Row-major GEMMs")
  const void* b = nullptr;
  void* d = nullptr;        // [m, n]
  const void* c = nullptr;  // accumulate only: the addend [m, n]; nullptr means D itself
  // Bias: input [n] for Bias and GeluAuxBias; output [n] for DGeluBiasGrad, [m] for BiasGradA.
  // dtype epilogue_vector_dtype(desc).
  void* bias = nullptr;
  // GeluAuxBias: output, DGelu and DGeluBiasGrad: input; [m, aux_ld] in epilogue_vector_dtype.
  void* aux = nullptr;
  const float* a_scale_inv = nullptr;  // FP8 A: its dequantization factor (1 / scale)
  const float* b_scale_inv = nullptr;  // FP8 B
  const float* d_scale = nullptr;      // FP8 D: D = fp8(result * d_scale)
  float* d_amax = nullptr;             // FP8 D, optional: set to max |result| (before d_scale)
};

// Every reason `args` cannot go with `desc` (missing, superfluous or misaligned pointers); empty
// when it can. Pure: looks only at the pointer values.
std::vector<std::string> check_gemm_args(const GemmDesc& desc, const GemmArgs& args);

struct GemmOptions {
  // Time the first candidates cuBLASLt's heuristic offers for a desc at its first run (rounds
  // over all of them in alternating order, a median per candidate) and keep the fastest,
  // instead of the heuristic's first. Costs host syncs and about a dozen runs of the GEMM per
  // candidate on that first run; skipped for accumulating GEMMs (a timing run would add into D
  // twice) and during a graph capture. The choice is shared by every runner in the process, so
  // sessions in one process compute bit-identical results; another process may choose differently.
  bool autotune = false;
};

// Owns a cuBLASLt handle and a 32 MiB workspace. Not thread-safe, and the workspace is shared by
// all runs: use one runner per stream, or order the streams (events) so runs never overlap.
class GemmRunner {
 public:
  // Creates the handle and allocates the workspace on `stream`, then waits for that allocation
  // (construction is the only host sync). Throws CudaError without a usable GPU.
  explicit GemmRunner(cudaStream_t stream = nullptr, GemmOptions options = {});
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Enqueues D = epilogue(A B (+ C)) on `stream`, no host sync (but see GemmOptions::autotune).
  // The first run of a desc checks it (check_gemm) and asks cuBLASLt's heuristic for an
  // algorithm once per pointer alignment class (16, 32, 64, 128 or 256 bytes: cuBLASLt is told
  // the alignment the pointers have); later runs reuse it.
  // Throws UsageError, before anything is enqueued, for a desc check_gemm rejects or args
  // check_gemm_args rejects; CudaError (naming the desc) when cuBLASLt fails or has no
  // algorithm.
  void run(const GemmDesc& desc, const GemmArgs& args, cudaStream_t stream);

  // How many (desc, alignment class) pairs have a cached algorithm.
  std::size_t cached_plans() const;

  static constexpr std::size_t kWorkspaceBytes = 32u << 20;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace opfuse::gpu
