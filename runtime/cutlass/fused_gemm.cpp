// fused_gemm.h over the kernels the build has (fused_gemm_kernels.h).
#include "fused_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "fused_gemm_kernels.h"

#include "gpu/cuda_check.h"
#include "opfuse/error.h"

namespace opfuse::gpu {

std::span<const std::string_view> gated_gemm_activations() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> out;
    const auto kernels = fused_gemm_detail::compiled_gated_kernels();
    for (size_t i = 0; i < kernels.size; ++i) out.push_back(kernels.data[i].activation);
    return out;
  }();
  return names;
}

namespace {

// What every fused GEMM needs: the kernels compiled in for the activation, an sm_90 device, a
// product CUTLASS's int coordinates hold, and 16-byte operand rows.
std::string common_refusal(std::string_view activation, int64_t m, int64_t n, int64_t k, int sm) {
  const std::span<const std::string_view> compiled = gated_gemm_activations();
  if (compiled.empty())
    return "this build of opfuse has no CUTLASS GEMMs (configured with OPFUSE_CUTLASS_GEMMS=OFF)";
  if (std::find(compiled.begin(), compiled.end(), activation) == compiled.end())
    return fmt::format(
        "no fused gated GEMM is compiled for {} (only for the built-in gated "
        "activations without attributes)",
        activation);
  if (sm != 90) return fmt::format("the fused gated GEMMs are sm_90a code; this GPU is sm_{}", sm);
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (m <= 0 || n <= 0 || k <= 0 || m > kMax || n > kMax || k > kMax)
    return fmt::format("m={} n={} k={} is not a product it takes (each in 1..{})", m, n, k, kMax);
  if (k % 16 != 0)
    return fmt::format(
        "k={} is not a multiple of 16 (the operands' rows must be 16-byte "
        "aligned for the tensor-memory copies)",
        k);
  return {};
}

bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

struct Pointer {
  const void* pointer;
  const char* what;
  bool needed;
};

// Throws UsageError naming the first needed pointer that is null or not 16-byte aligned.
void check_pointers(std::string_view gemm, std::initializer_list<Pointer> pointers) {
  for (const Pointer& p : pointers)
    if (p.needed && (p.pointer == nullptr || !aligned(p.pointer)))
      throw UsageError(fmt::format("the {} needs {} at a 16-byte aligned device address (got {})",
                                   gemm, p.what, p.pointer));
}

int current_sm() {
  int device = 0, major = 0, minor = 0;
  OPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  OPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  OPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

}  // namespace

std::string gated_gemm_refusal(std::string_view activation, int64_t m, int64_t n, int64_t k, int sm,
                               bool training) {
  if (std::string why = common_refusal(activation, m, n, k, sm); !why.empty()) return why;
  if (n % 32 != 0)
    return fmt::format(
        "n={} is not a multiple of 32 (its output rows of n / 2 E4M3 bytes are "
        "stored as 16-byte vectors)",
        n);
  if (training && m % 16 != 0)
    return fmt::format(
        "m={} is not a multiple of 16 (the training form's transposed copy has rows of m E4M3 "
        "bytes, stored as 16-byte vectors)",
        m);
  return {};
}

void launch_gated_gemm(const GatedGemmArgs& args, cudaStream_t stream) {
  if ((args.out_t == nullptr) != (args.d == nullptr))
    throw UsageError(
        "the fused gated GEMM's training form needs both the transposed copy and the BF16 "
        "output (out_t and d), its inference form neither");
  const bool training = args.out_t != nullptr;
  if (const std::string why =
          gated_gemm_refusal(args.activation, args.m, args.n, args.k, current_sm(), training);
      !why.empty())
    throw UsageError("the fused gated GEMM cannot run: " + why);
  check_pointers("fused gated GEMM", {{args.a, "A", true},
                                      {args.b, "B", true},
                                      {args.out, "the output", true},
                                      {args.out_t, "the transposed copy", training},
                                      {args.d, "the BF16 output", training}});
  if (args.a_scale_inv == nullptr || args.b_scale_inv == nullptr || args.out_scale == nullptr)
    throw UsageError("the fused gated GEMM needs both scale_inv pointers and the output scale");
  const auto kernels = training ? fused_gemm_detail::compiled_gated_training_kernels()
                                : fused_gemm_detail::compiled_gated_kernels();
  for (size_t i = 0; i < kernels.size; ++i)
    if (kernels.data[i].activation == args.activation) return kernels.data[i].launch(args, stream);
}

void interleave_gated_rows(const void* src, void* dst, int64_t rows, int64_t row_bytes,
                           cudaStream_t stream) {
  if (rows % 2 != 0)
    throw UsageError(
        fmt::format("interleave_gated_rows: {} rows are not gate and linear halves", rows));
  if (row_bytes % 16 == 0 && aligned(src) && aligned(dst)) {
    const cudaError_t status =
        fused_gemm_detail::launch_interleave_rows(src, dst, rows, row_bytes, stream);
    if (status != cudaErrorNotSupported) {
      OPFUSE_CUDA_CHECK(status, "interleaving a gated weight's rows");
      return;
    }
  }
  const int64_t half = rows / 2;
  const auto bytes = static_cast<size_t>(row_bytes);
  const auto* source = static_cast<const char*>(src);
  auto* target = static_cast<char*>(dst);
  // Gate rows to the even rows, linear rows to the odd ones: two strided copies.
  OPFUSE_CUDA_CHECK(cudaMemcpy2DAsync(target, 2 * bytes, source, bytes, bytes,
                                      static_cast<size_t>(half), cudaMemcpyDeviceToDevice, stream));
  OPFUSE_CUDA_CHECK(cudaMemcpy2DAsync(target + bytes, 2 * bytes, source + half * row_bytes, bytes,
                                      bytes, static_cast<size_t>(half), cudaMemcpyDeviceToDevice,
                                      stream));
}

}  // namespace opfuse::gpu
