// The sizes a sequence is bound to, checked against everything that will run with them before
// bind() places or launches anything: every size given once and in range, every launch's grid
// within CUDA's limits (training launches and inference variants), every GEMM's m, n and k a
// multiple cuBLASLt needs and its description one cuBLASLt runs (check_gemm). Host code only: the
// CPU tests check it where there is no GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

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

// Whether a buffer of `role` is the caller's (an input, parameter or output gradient).
inline bool is_callers(plan::BufferRole role) {
  return role == plan::BufferRole::Input || role == plan::BufferRole::Param ||
         role == plan::BufferRole::OutputGrad;
}

// A buffer's .fuse name: "x" for the plan's "%x".
inline std::string ir_name(const std::string& name) {
  return name.starts_with('%') ? name.substr(1) : name;
}

// The tensors a sequence takes from the caller (inputs, parameters, output gradients: the
// interface buffers that are not views), by their .fuse name ("x", "fc1.weight", "dy"), with
// their buffer ids.
std::map<std::string, int, std::less<>> caller_tensors(const plan::SequencePlan& plan);

// The caller tensor `name`'s buffer id in `callers` (caller_tensors()); UsageError listing the
// tensors the sequence takes when it takes no such tensor.
int caller_tensor(const plan::SequencePlan& plan,
                  const std::map<std::string, int, std::less<>>& callers, std::string_view name);

}  // namespace opfuse::gpu
