// GEMMs with fused epilogues that cuBLASLt cannot do (issue 22): CUTLASS sm90 kernels compiled
// ahead of time by nvcc (fused_gemm_kernel.cuh; the headers come from scripts/cutlass_headers.sh),
// so a cold `fusec build` compiles none of them. Nothing here names a CUTLASS type.
//
// The gated FP8 fprop GEMM: act[m, j] = cast_e4m3(f(gate[m, j], linear[m, j]) * out_scale) where
// [gate | linear] = bf16(a_scale_inv * b_scale_inv * A B^T), A e4m3 [m, k], B e4m3 [n, k], f a
// gated activation's functor, j < n / 2; and amax = max |f(...)| (atomically into *amax). Every
// value is what the unfused pair computes, step by step: the GEMM's BF16 output, the activation
// kernel's functor on its two BF16 inputs, the same rounded product before the saturating cast
// (templates/common/fp8.cuh). Only the FP32 accumulation order is the kernel's own
// (docs/architecture.md, "Fused GEMM epilogues"; tests/gpu/test_fused_gemm_gpu.cpp).
//
// B is read with its rows interleaved: row 2j is the weight's row j (gate), row 2j + 1 its row
// n / 2 + j (linear), so a thread's accumulator pairs (columns 2j, 2j + 1 of one row, as Hopper's
// wgmma lays them out) are one output's two inputs. interleave_gated_rows makes that copy.
//
// Its training form (GatedGemmArgs::out_t and d set) also writes act's transposed copy
// act_t[j, m] and the BF16 [gate | linear] in the unfused GEMM's layout, which backward reads.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "fused_gemm_args.h"

namespace opfuse::gpu {

// The gated activations compiled in (their functor names, generated from the op registry by
// gen_gated_functors at build time); empty when the build has no CUTLASS GEMMs
// (OPFUSE_CUTLASS_GEMMS=OFF).
std::span<const std::string_view> gated_gemm_activations();

// Why the gated GEMM cannot run this product on a device of compute capability `sm` (major * 10 +
// minor), or empty if it can: the build has it, the activation is compiled in, the device is an
// sm_90 (the kernels are sm_90a code), m, n, k are positive, n % 32 == 0 (16-byte output rows)
// and k % 16 == 0 (16-byte operand rows for the tensor-memory copies); the training form also
// needs m % 16 == 0 (16-byte rows of the transposed copy).
std::string gated_gemm_refusal(std::string_view activation, int64_t m, int64_t n, int64_t k, int sm,
                               bool training = false);

// Enqueues the GEMM on `stream`, its training form where args.out_t and args.d are set.
// Precondition: gated_gemm_refusal(...) is empty, the pointers are 16-byte aligned, and out_t and
// d are both set or both null (throws UsageError otherwise, before launching anything).
void launch_gated_gemm(const GatedGemmArgs& args, cudaStream_t stream);

// dst[2j] = src[j], dst[2j + 1] = src[rows / 2 + j] for rows of `row_bytes` bytes (`rows` even):
// the B operand launch_gated_gemm reads, from a weight stored [gate rows; linear rows]. One pass
// of a kernel where rows are multiples of 16 bytes and both pointers 16-byte aligned.
void interleave_gated_rows(const void* src, void* dst, int64_t rows, int64_t row_bytes,
                           cudaStream_t stream);

}  // namespace opfuse::gpu
