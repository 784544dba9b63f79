// `opfuse._opfuse._bench`: opfuse's cuBLASLt GEMM runner (runtime/gpu/gemm.h) for the benchmark
// scripts (bench/peers/gemm_interleaved.py), which time it against torch._scaled_mm on the same
// operands and stream, in one process, in alternating rounds. Not part of the API: it takes raw
// device addresses and is documented in bench/peers/README.md only.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nanobind/nanobind.h>

#include <array>
#include <cstdint>
#include <memory>

#include "bindings.h"
#include "gpu/gemm.h"

namespace opfuse::python {

namespace {

// [0]: cuBLASLt's heuristic's first algorithm; [1]: GemmOptions::autotune. One runner each for
// the process, as a session keeps one: their plan and tuning caches live as long.
std::array<std::unique_ptr<gpu::GemmRunner>, 2>& runners() {
  static std::array<std::unique_ptr<gpu::GemmRunner>, 2> instances;
  return instances;
}

}  // namespace

void bind_bench(nb::module_& m) {
  nb::module_ bench = m.def_submodule(
      "_bench", "opfuse's GEMM runner for bench/peers/gemm_interleaved.py (not part of the API).");
  bench.def(
      "cublaslt_version", [] { return static_cast<std::size_t>(cublasLtGetVersion()); },
      "The cuBLASLt this process resolved (the first libcublasLt.so loaded: torch's when torch "
      "was imported first).");
  bench.def(
      "gemm_run",
      [](nb::handle stream, std::int64_t m, std::int64_t n, std::int64_t k, bool a_e5m2,
         bool fast_accum, bool autotune, std::uintptr_t a, std::uintptr_t b, std::uintptr_t d,
         std::uintptr_t a_scale_inv, std::uintptr_t b_scale_inv, int count) {
        if (m <= 0 || n <= 0 || k <= 0 || count < 0) {
          throw UsageError(
              fmt::format("gemm_run: m, n, k must be positive and count >= 0, got "
                          "m {} n {} k {} count {}",
                          m, n, k, count));
        }
        if (a == 0 || b == 0 || d == 0 || a_scale_inv == 0 || b_scale_inv == 0) {
          throw UsageError("gemm_run: every operand and scale address must be nonzero");
        }
        const cudaStream_t s = stream_from(stream);
        std::unique_ptr<gpu::GemmRunner>& runner = runners()[autotune ? 1 : 0];
        if (!runner) {
          gpu::GemmOptions options;
          options.autotune = autotune;
          runner = std::make_unique<gpu::GemmRunner>(s, options);
        }
        gpu::GemmDesc desc;
        desc.m = m;
        desc.n = n;
        desc.k = k;
        desc.a = a_e5m2 ? plan::DType::E5M2 : plan::DType::E4M3;
        desc.b = plan::DType::E4M3;
        desc.d = plan::DType::BF16;
        desc.fast_accum = fast_accum;
        gpu::GemmArgs args;
        args.a = reinterpret_cast<const void*>(a);
        args.b = reinterpret_cast<const void*>(b);
        args.d = reinterpret_cast<void*>(d);
        args.a_scale_inv = reinterpret_cast<const float*>(a_scale_inv);
        args.b_scale_inv = reinterpret_cast<const float*>(b_scale_inv);
        nb::gil_scoped_release release;
        for (int i = 0; i < count; ++i) runner->run(desc, args, s);
      },
      nb::arg("stream"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("a_e5m2"),
      nb::arg("fast_accum"), nb::arg("autotune"), nb::arg("a"), nb::arg("b"), nb::arg("d"),
      nb::arg("a_scale_inv"), nb::arg("b_scale_inv"), nb::arg("count") = 1,
      "Enqueues `count` GEMMs D[m, n] (bf16) = A[m, k] B[n, k]^T * a_scale_inv * b_scale_inv on "
      "`stream` (the addresses are device pointers), exactly as an opfuse plan's FP8 GEMM step "
      "runs them: A E5M2 when a_e5m2 (a gradient) else E4M3, B E4M3; `autotune` runs them "
      "through a runner with GemmOptions::autotune (the first call of a shape times the "
      "candidates).");
}

}  // namespace opfuse::python
