// The CUDA source of each generated kernel (docs/design.md, "Codegen"): a header comment naming the
// sequence(s), the fused ops with their .fuse lines, phase, dtypes and quantizers; the template
// family's header; and the explicit instantiation that the NVRTC name expression also names.
#pragma once

#include <string>
#include <vector>

#include "codegen/kernel_templates.h"
#include "codegen/plan.h"

namespace opfuse::codegen {

// A readable file stem for an instantiation, unique per argument list:
// cast_transpose<__nv_bfloat16, __nv_fp8_e4m3, true, false> -> "cast_transpose_bf16_e4m3_t".
std::string kernel_id(const KernelTemplate& t, const std::vector<std::string>& args);
// The kernel's parameter type: the params struct with the template's dtype arguments, e.g.
// "opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>" or "opfuse::ScaleUpdateParams".
std::string params_struct_spelling(const KernelTemplate& t, const std::vector<std::string>& args);

// The kernel's .cu text: what NVRTC compiles (with `kernel.name_expression` added) and what
// `fusec build` / `dump-kernels` write to kernels/<id>.cu.
std::string kernel_source(const Plan& plan, const Kernel& kernel);

}  // namespace opfuse::codegen
