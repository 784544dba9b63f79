// A C entry point to opfuse's GEMM runner (runtime/gpu/gemm.h), loaded with ctypes by
// bench/peers/gemm_interleaved.py so that opfuse's cuBLASLt GEMMs and torch._scaled_mm are timed
// in one process, on the same operands and stream, in alternating rounds (issue 6: resolving 3%
// needs interleaved, repeated timings of both sides). Not part of the installed runtime.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "gpu/gemm.h"
#include "shim_errors.h"

namespace {

// [0]: cuBLASLt's heuristic algorithms; [1]: GemmOptions::autotune.
std::unique_ptr<opfuse::gpu::GemmRunner> runners[2];

}  // namespace

extern "C" {

// The cuBLASLt this process resolved (the first libcublasLt.so loaded wins: torch's when torch
// was imported first).
std::size_t opfuse_gemm_cublaslt_version() { return cublasLtGetVersion(); }

// Enqueues `count` GEMMs D[m, n] (bf16) = A[m, k] B[n, k]^T * a_scale_inv * b_scale_inv on
// `stream`, exactly as an opfuse plan's FP8 GEMM step runs them: A E5M2 when a_e5m2 (a gradient)
// else E4M3, B E4M3, fast accumulation as given (TE: on for fprop, off for dgrad and wgrad);
// nonzero `autotune` runs them through a runner with GemmOptions::autotune (the first call of a
// shape times the candidates). Returns 0, or 1 with the reason in `error`.
int opfuse_gemm_run(void* stream, std::int64_t m, std::int64_t n, std::int64_t k, int a_e5m2,
                    int fast_accum, int autotune, const void* a, const void* b, void* d,
                    const float* a_scale_inv, const float* b_scale_inv, int count, char* error,
                    int error_bytes) {
  return opfuse::bench::report_errors(error, error_bytes, [&] {
    const auto s = static_cast<cudaStream_t>(stream);
    std::unique_ptr<opfuse::gpu::GemmRunner>& runner = runners[autotune != 0 ? 1 : 0];
    if (!runner) {
      opfuse::gpu::GemmOptions options;
      options.autotune = autotune != 0;
      runner = std::make_unique<opfuse::gpu::GemmRunner>(s, options);
    }
    opfuse::gpu::GemmDesc desc;
    desc.m = m;
    desc.n = n;
    desc.k = k;
    desc.a = a_e5m2 != 0 ? opfuse::plan::DType::E5M2 : opfuse::plan::DType::E4M3;
    desc.b = opfuse::plan::DType::E4M3;
    desc.d = opfuse::plan::DType::BF16;
    desc.fast_accum = fast_accum != 0;
    opfuse::gpu::GemmArgs args;
    args.a = a;
    args.b = b;
    args.d = d;
    args.a_scale_inv = a_scale_inv;
    args.b_scale_inv = b_scale_inv;
    for (int i = 0; i < count; ++i) runner->run(desc, args, s);
  });
}

}  // extern "C"
