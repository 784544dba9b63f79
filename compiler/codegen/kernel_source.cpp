#include "codegen/kernel_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>

#include "ir/pointwise_ops.h"
#include "ir/row_expr.h"
#include "support/assert.h"

namespace opfuse::codegen {

namespace {

// Short words for the template's bool flags in file names; the rest are spelled from the name.
std::string flag_word(std::string_view param) {
  if (param == "kWriteTranspose") return "t";
  if (param == "kDbias") return "dbias";
  if (param == "kZeroCenteredGamma") return "zcg";
  if (param == "kHasBias") return "bias";
  if (param == "kHasResidual") return "residual";
  if (param == "kWriteColumnwiseSource") return "src";
  std::string word;
  for (char c : param.substr(param.starts_with('k') ? 1 : 0))
    word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return word;
}

std::string arg_word(const TemplateParam& param, const std::string& arg) {
  switch (param.kind) {
    case TemplateParamKind::DType: {
      const auto dtype = parse_cuda_dtype_spelling(arg);
      return dtype ? std::string(ir::dtype_name(*dtype)) : arg;
    }
    case TemplateParamKind::Activation: {
      std::string word = arg.substr(arg.rfind(':') + 1);  // opfuse::pointwise_silu -> silu
      if (word.starts_with("pointwise_")) word = word.substr(std::string_view("pointwise_").size());
      // A norm-like user-defined op (ir::row_functor_name: row_user_<length>_<name>_...): the
      // template's name says row, the word as a pointwise user op's.
      if (word.starts_with("row_user_")) word = word.substr(std::string_view("row_").size());
      std::transform(word.begin(), word.end(), word.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      // A debug feature's expression (ir::expression_functor_name) can be long: the id is a file
      // stem, so a long word becomes "expr_" and a hash of it (FNV-1a, stable everywhere).
      // A user-defined op (ir::pointwise_functor_name: user_<length>_<name>_<expression>) keeps
      // its name: user_<name>_<hash>.
      if (word.starts_with("user_") && word.size() > 64) {
        const size_t sep = word.find('_', 5);
        const size_t length =
            sep == std::string::npos ? 0 : std::strtoul(word.c_str() + 5, nullptr, 10);
        if (length > 0 && length <= 32 && sep + 1 + length <= word.size()) {
          uint64_t h = 0xcbf29ce484222325ull;
          for (const char c : word) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
          return fmt::format("user_{}_{:08x}", word.substr(sep + 1, length), h & 0xffffffffull);
        }
      }
      if (word.size() > 64) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (const char c : word) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
        word = fmt::format("expr_{:016x}", h);
      }
      return word;
    }
    case TemplateParamKind::Int:
      return arg;
    case TemplateParamKind::Bool:
      return arg == "true" ? flag_word(param.name) : "";
  }
  return arg;
}

const QuantizerPlan* find_quantizer(const Plan& plan, const std::string& sequence,
                                    const std::string& name) {
  for (const SequencePlan& s : plan.sequences) {
    if (s.name != sequence) continue;
    for (const QuantizerPlan& q : s.quantizers)
      if (q.name == name) return &q;
  }
  return nullptr;
}

std::string use_comment(const Plan& plan, const KernelUse& use) {
  std::string out = fmt::format("//   sequence {}, {}", use.sequence, ir::phase_name(use.phase));
  out += use.pattern.empty() ? "" : fmt::format(", fused {}", use.pattern);
  out += ":\n";
  for (const OpRef& op : use.ops) {
    out += fmt::format("//     {} \"{}\"{}\n", op.op, op.instance,
                       op.location.empty() ? "" : fmt::format(" ({})", op.location));
  }
  if (use.ops.empty()) out += "//     the end-of-step scale update\n";
  out += fmt::format("//     {}\n", use.what);
  if (!use.quantizers.empty()) {
    std::string list;
    for (const std::string& name : use.quantizers) {
      const QuantizerPlan* q = find_quantizer(plan, use.sequence, name);
      list += fmt::format("{}{}{}", list.empty() ? "" : ", ", name,
                          q ? fmt::format(" ({})", ir::dtype_name(q->format())) : "");
    }
    out += fmt::format("//     quantizers: {}\n", list);
  }
  return out;
}

}  // namespace

std::string kernel_id(const KernelTemplate& t, const std::vector<std::string>& args) {
  std::string id(t.name);
  for (size_t i = 0; i < args.size() && i < t.params.size(); ++i) {
    const std::string word = arg_word(t.params[i], args[i]);
    if (!word.empty()) id += "_" + word;
  }
  return id;
}

std::string params_struct_spelling(const KernelTemplate& t, const std::vector<std::string>& args) {
  // A templated params struct takes the kernel's dtype arguments, in order (templates/README.md).
  std::string dtypes;
  for (size_t i = 0; i < args.size() && i < t.params.size(); ++i) {
    if (t.params[i].kind == TemplateParamKind::DType)
      dtypes += (dtypes.empty() ? "" : ", ") + args[i];
  }
  const std::string name = fmt::format("opfuse::{}", t.params_struct);
  return dtypes.empty() ? name : fmt::format("{}<{}>", name, dtypes);
}

std::string kernel_source(const Plan& plan, const Kernel& kernel) {
  std::string out = fmt::format("// opfuse generated kernel {}\n", kernel.id);
  out += fmt::format(
      "// Written by fusec{}; `fusec build` compiles it with NVRTC through the name expression\n"
      "// below. Do not edit: change the .fuse program and rebuild.\n//\n",
      plan.source.empty() ? "" : " from " + plan.source);
  out += "// Used by:\n";
  for (const KernelUse& use : kernel.uses) out += use_comment(plan, use);
  out += "//\n";
  // One item per line: long comment lines would be reflowed into each other by clang-format.
  out += fmt::format("// Name expression (NVRTC):\n//   {}\n", kernel.name_expression);
  out +=
      fmt::format("// Parameter, by value (templates/README.md):\n//   {}\n", kernel.params_struct);
  out += fmt::format("#include \"{}\"\n\n", kernel.header);
  // A pointwise op's functor is generated from its definition (compiler/ir/pointwise_ops.h): the
  // name expression's first template argument names it.
  const size_t open = kernel.name_expression.find('<');
  if (open != std::string::npos) {
    const size_t end = kernel.name_expression.find_first_of(",>", open);
    const std::string first = kernel.name_expression.substr(open + 1, end - open - 1);
    if (const auto functor = ir::pointwise_functor_source(first)) out += *functor + "\n";
    if (const auto functor = ir::row_functor_source(first)) out += *functor + "\n";
  }
  // For readers and tools: the same instantiation NVRTC makes from the name expression.
  out += fmt::format("template __global__ void {}({});\n", kernel.name_expression,
                     kernel.params_struct);
  return out;
}

}  // namespace opfuse::codegen
