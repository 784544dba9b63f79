// The arguments of the gated FP8 GEMMs (fused_gemm.h), in C++17: fused_gemm.cu includes it too,
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

// fc2's dgrad with the gated activation's backward in its epilogue (launch_gated_dgrad_gemm).
struct GatedDgradArgs {
  std::string_view activation;  // a functor name, "opfuse::pointwise_swiglu"
  int64_t m = 0, n = 0, k = 0;  // n: the activation's output columns (half of d's)
  // The gradients (a, out, out_t) are e5m2 (format hybrid) or e4m3 (e4m3_gradients).
  const void* a = nullptr;  // e5m2 [m, k], row-major: the output gradient of the next linear
  const void* b = nullptr;  // e4m3 [n, k], row-major: that linear's weight, transposed
  const float* a_scale_inv = nullptr;
  const float* b_scale_inv = nullptr;
  const void* d = nullptr;           // bf16 [m, 2n]: the forward's [gate | linear] inputs
  const float* out_scale = nullptr;  // the gradient quantizer's scale
  float* amax = nullptr;             // maxed into, never reset here; nullptr: not tracked
  void* out = nullptr;               // e5m2 [m, 2n]: [d gate | d linear]
  void* out_t = nullptr;             // e5m2 [2n, m]: out's transposed copy
  bool e4m3_gradients = false;       // a, out and out_t e4m3 (the recipe's format e4m3)
};

}  // namespace opfuse::gpu
