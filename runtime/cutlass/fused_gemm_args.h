// The arguments of the gated FP8 GEMM (fused_gemm.h), in C++17: fused_gemm.cu includes it too,
// and nvcc compiles CUTLASS as C++17 here (CMake 3.25 knows no CUDA20 dialect).
#pragma once

#include <cstdint>
#include <string_view>

namespace opfuse::gpu {

struct GatedGemmArgs {
  std::string_view activation;  // a functor name, "opfuse::pointwise_swiglu"
  int64_t m = 0, n = 0, k = 0;  // n: the gate and linear halves together (2x the output's columns)
  const void* a = nullptr;      // e4m3 [m, k], row-major
  const void* b = nullptr;      // e4m3 [n, k], rows interleaved (interleave_gated_rows)
  const float* a_scale_inv = nullptr;
  const float* b_scale_inv = nullptr;
  const float* out_scale = nullptr;  // the output quantizer's scale
  float* amax = nullptr;             // maxed into, never reset here; nullptr: not tracked
  void* out = nullptr;               // e4m3 [m, n / 2], row-major
  // A training forward's kernel (both set) also writes what backward reads; an inference
  // forward's (both null) does not.
  void* out_t = nullptr;  // e4m3 [n / 2, m]: out's transposed copy
  void* d = nullptr;      // bf16 [m, n]: the GEMM's output in the unfused GEMM's layout (B's rows
                          // not interleaved: gate columns [0, n / 2), linear columns after)
};

}  // namespace opfuse::gpu
