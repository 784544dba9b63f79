// The kernel-template table: every CUDA entry point in templates/ that codegen instantiates, with
// its header, the kernel family it serves, its params struct and its template parameters in order.
// templates/README.md is the contract this table transcribes; the template checker
// (tools/check_templates/check_templates.cpp, Clang libTooling) parses templates/ and fails when
// the two disagree, so codegen can build every name expression through this table and trust it.
//
// Families without a generated kernel have no entry: Gemm (cuBLASLt) and Alias (no data
// movement); kernel_templates_for returns nothing for them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/op_table.h"
#include "ir/types.h"

namespace opfuse::codegen {

// What a template argument is, as codegen spells it in a name expression.
enum class TemplateParamKind : uint8_t {
  DType,       // a storage type: __nv_bfloat16, __half, float, __nv_fp8_e4m3, __nv_fp8_e5m2
  Activation,  // a pointwise functor type: generated per op (ir::pointwise_functor_name), or
               // one of the examples templates/activation.cuh defines
  Int,         // an int constant, decimal
  Bool,        // true / false
};
std::string_view template_param_kind_name(TemplateParamKind kind);  // "dtype", "activation", ...

struct TemplateParam {
  std::string_view name;  // as declared in the template, e.g. "kHidden"
  TemplateParamKind kind;
  std::string_view default_value;  // as spelled in CUDA ("false", "256"); empty: required
};

struct KernelTemplate {
  std::string_view name;           // "rmsnorm_fwd" (in namespace opfuse)
  std::string_view header;         // "norm.cuh", relative to templates/
  ir::KernelFamily family;         // the family whose fused groups launch it
  std::string_view params_struct;  // "NormFwdParams": the kernel's only parameter, by value
  std::span<const TemplateParam> params;
  // Other families that launch it too (bias_add: Residual; reduce_column_partials: every
  // family with a dbias/dgamma second stage).
  std::span<const ir::KernelFamily> also_serves;
  // One valid instantiation (README's example where it has one): the tests build it and the
  // template checker instantiates it to check the device code every call resolves to.
  std::span<const std::string_view> example_args;
};

std::span<const KernelTemplate> kernel_templates();
const KernelTemplate* find_kernel_template(std::string_view name);
// Every template that `family` launches (family or also_serves), in table order.
std::vector<const KernelTemplate*> kernel_templates_for(ir::KernelFamily family);

// "opfuse::rmsnorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 4096, false, true>"; args as spelled in
// CUDA; throws std::invalid_argument when the count is wrong (trailing defaults may be omitted)
// or an argument does not fit its kind (Bool: true/false; Int: decimal; DType: one of the five
// spellings; Activation: a generated pointwise functor name or an example functor).
std::string name_expression(const KernelTemplate& t, std::span<const std::string> args);
// The same, for arguments held as views (the table's own example_args).
std::string name_expression(const KernelTemplate& t, std::span<const std::string_view> args);

// __nv_bfloat16, __half, float, __nv_fp8_e4m3, __nv_fp8_e5m2
std::string_view cuda_dtype_spelling(ir::DType d);
std::optional<ir::DType> parse_cuda_dtype_spelling(std::string_view spelling);
// The functors templates/activation.cuh defines (opfuse::ExampleIdentity, opfuse::ExampleProduct):
// its contract's examples, which the table's example instantiations and the template checker use.
// An op's own functor is generated: ir::pointwise_functor_name and pointwise_functor_source.
std::span<const std::string_view> activation_spellings();

}  // namespace opfuse::codegen
