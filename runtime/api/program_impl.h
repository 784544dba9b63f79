// What a compiled opfuse::Program holds (runtime/include/opfuse/program.h): the IR after every
// pass, its plan and each plan kernel's binary. Internal to the runtime.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "jit/nvrtc_compiler.h"
#include "opfuse/program.h"
#include "plan/plan.h"

namespace opfuse {

namespace api {
class DebugProgram;
}

struct Program::Impl {
  std::string source_name;
  plan::Plan plan;
  std::vector<jit::CompiledKernel> kernels;  // plan.kernels order
  BuildStats stats;
  std::string warnings;  // formatted compile warnings
  // A program compiled with a debug config: what its plan variants compile from.
  std::shared_ptr<const api::DebugProgram> debug;
};

// The compile driver's kernel requests (driver/compile.h) as NVRTC requests; Program::compile and
// `fusec build` compile them.
std::vector<jit::CompileRequest> compile_requests(
    const std::vector<driver::KernelRequest>& kernels);
// One NVRTC request per plan kernel (plan.kernels order) for `arch`: driver::kernel_requests as
// NVRTC requests (the GPU tests compile plans through it).
std::vector<jit::CompileRequest> kernel_requests(const plan::Plan& plan, const std::string& arch);

// Host values <-> row-major bytes of a bf16, fp16 or fp32 tensor (round to nearest even);
// UsageError for other dtypes.
std::vector<unsigned char> encode_values(const std::vector<float>& values, TensorDType dtype);
std::vector<float> decode_values(const std::vector<unsigned char>& bytes, TensorDType dtype);

// The plan of `sequence` (empty: the only one); throws UsageError naming the sequences.
const plan::SequencePlan& find_sequence_plan(const Program::Impl& program,
                                             std::string_view sequence);

}  // namespace opfuse
