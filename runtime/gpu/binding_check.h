// The sizes a sequence is bound to, checked against everything that will run with them before
// bind() places or launches anything: every size given once and in range, every launch's grid
// within CUDA's limits (training launches and inference variants), every GEMM's m, n and k a
// multiple cuBLASLt needs and its description one cuBLASLt runs (check_gemm). Host code only: the
// CPU tests check it where there is no GPU.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "plan/gemm_caps.h"
#include "plan/plan.h"

namespace opfuse::gpu {

// The largest size a symbol may have: grids and the kernels' index arithmetic are 32-bit.
inline constexpr std::int64_t kMaxSymbolValue = 2147483647;

// "fprop GEMM of fc1 (...) (mlp.fuse:15)": what a step is and where the .fuse file asks for it.
std::string describe_step(const plan::Step& step);

// The values every expression of `plan` evaluates with: `given` plus num_sms. Throws UsageError
// (naming the size, the step and the .fuse line) for a size missing, unknown, below 1 or above
// kMaxSymbolValue, a grid outside CUDA's limits, or a GEMM that `caps` (the device's row of
// plan/gemm_caps) or cuBLASLt cannot run at those sizes.
std::map<std::string, std::int64_t> check_binding(const plan::SequencePlan& plan,
                                                  const std::map<std::string, std::int64_t>& given,
                                                  const plan::GemmCaps& caps, int num_sms);

}  // namespace opfuse::gpu
