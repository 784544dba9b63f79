// check_templates: parses every header of templates/ with Clang (libTooling, the CUDA device side)
// and checks it against the kernel-template table (compiler/codegen/kernel_templates.h):
//   1. every table entry is a __global__ function template in namespace opfuse in its header,
//      with the table's template parameters (order, name, kind, default) and its params struct as
//      the only function parameter, by value, spelled with the kernel's dtype parameters in order
//      (as codegen spells it); every kernel in templates/ is in the table; the activation
//      functors the table spells exist;
//   2. device code (every __global__/__device__ function defined in templates/, and what the
//      table's example instantiations resolve to) calls only device functions, nothing from std::
//      (NVRTC has no host standard library), and neither the device heap nor printf;
//   3. warning: no double-precision arithmetic in device code, except in the headers named by
//      --fp64-header (tensor_stats.cuh: its statistics are sums over up to 2^31 elements).
// Prints `file:line:col: error: message` per problem (Clang's own errors as Clang prints them).
//
// Exit codes: 0 clean, 1 problems found, 2 usage error.
//
// The parsing is template_scan.{h,cpp}; this file holds the command line and the comparison with
// the table.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "codegen/kernel_templates.h"
#include "template_scan.h"

namespace {

namespace fs = std::filesystem;
using opfuse::codegen::KernelTemplate;
using opfuse::codegen::TemplateParam;
using opfuse::codegen::TemplateParamKind;
using opfuse::tools::Findings;
using opfuse::tools::FoundKernel;
using opfuse::tools::FoundParam;
using opfuse::tools::ParamShape;
using opfuse::tools::Problem;

constexpr int kExitOk = 0;
constexpr int kExitProblems = 1;
constexpr int kExitUsage = 2;

constexpr const char* kTableFile = "compiler/codegen/kernel_templates.cpp";

struct Options {
  opfuse::tools::ScanOptions scan;
  std::vector<std::string> only;
  bool each_header = false;
  bool warnings_as_errors = false;
  // Headers whose device code computes in double on purpose (check 3 skipped there).
  std::vector<std::string> fp64_headers;
};

std::string normalized(const fs::path& path) { return path.lexically_normal().generic_string(); }

std::vector<std::string> template_headers(const fs::path& dir) {
  std::vector<std::string> headers;
  for (const fs::path& sub : {fs::path(), fs::path("common")}) {
    if (!fs::is_directory(dir / sub)) continue;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir / sub)) {
      if (entry.is_regular_file() && entry.path().extension() == ".cuh") {
        headers.push_back((sub / entry.path().filename()).generic_string());
      }
    }
  }
  std::sort(headers.begin(), headers.end());
  return headers;
}

std::string_view shape_name(ParamShape shape) {
  switch (shape) {
    case ParamShape::Type:
      return "a type";
    case ParamShape::Int:
      return "int";
    case ParamShape::Bool:
      return "bool";
    case ParamShape::Other:
      return "something else";
  }
  return "?";
}

ParamShape expected_shape(TemplateParamKind kind) {
  switch (kind) {
    case TemplateParamKind::DType:
    case TemplateParamKind::Activation:
      return ParamShape::Type;
    case TemplateParamKind::Int:
      return ParamShape::Int;
    case TemplateParamKind::Bool:
      return ParamShape::Bool;
  }
  return ParamShape::Other;
}

std::string table_param_list(const KernelTemplate& entry) {
  std::string list;
  for (const TemplateParam& param : entry.params) {
    list +=
        fmt::format("{}{} {}{}", list.empty() ? "" : ", ",
                    opfuse::codegen::template_param_kind_name(param.kind), param.name,
                    param.default_value.empty() ? "" : " = " + std::string(param.default_value));
  }
  return list;
}

// Check 1 for one table entry against the kernel found for it.
void check_signature(const KernelTemplate& entry, const FoundKernel& kernel,
                     std::set<Problem>& problems) {
  const std::string name = kernel.qualified_name;
  auto at_kernel = [&](std::string message) {
    problems.insert({kernel.file, kernel.line, kernel.column, true, std::move(message)});
  };
  if (kernel.header != entry.header) {
    at_kernel(
        fmt::format("entry template '{}' is defined in {}; the kernel-template table ({}) "
                    "says {}",
                    name, kernel.header, kTableFile, entry.header));
  }
  if (!kernel.is_template) {
    at_kernel(fmt::format("kernel '{}' is not a template; the table lists <{}>", name,
                          table_param_list(entry)));
  } else if (kernel.params.size() != entry.params.size()) {
    at_kernel(fmt::format("'{}' has {} template parameters; the table lists {}: <{}>", name,
                          kernel.params.size(), entry.params.size(), table_param_list(entry)));
  } else {
    for (size_t i = 0; i < entry.params.size(); ++i) {
      const TemplateParam& want = entry.params[i];
      const FoundParam& have = kernel.params[i];
      auto at_param = [&](std::string message) {
        problems.insert({kernel.file, have.line, have.column, true, std::move(message)});
      };
      const std::string which =
          fmt::format("template parameter {} ('{}') of '{}'", i + 1, have.name, name);
      if (have.is_pack) at_param(which + " is a parameter pack; the table has no packs");
      if (have.shape != expected_shape(want.kind)) {
        at_param(fmt::format("{} is {} ({}); the table says {} ({})", which, shape_name(have.shape),
                             have.spelled, shape_name(expected_shape(want.kind)),
                             opfuse::codegen::template_param_kind_name(want.kind)));
      }
      if (have.name != want.name) {
        at_param(fmt::format("{} is named '{}' in the table", which, want.name));
      }
      const std::optional<std::string> table_default =
          want.default_value.empty() ? std::nullopt
                                     : std::optional<std::string>(want.default_value);
      if (have.default_value != table_default) {
        at_param(fmt::format(
            "{} {}; the table says {}", which,
            have.default_value ? "defaults to " + *have.default_value
                               : std::string("has no default"),
            table_default ? "it defaults to " + *table_default : std::string("it is required")));
      }
    }
  }
  const std::string params_struct = "opfuse::" + std::string(entry.params_struct);
  if (kernel.function_params.size() != 1) {
    at_kernel(
        fmt::format("'{}' takes {} parameters; a kernel takes exactly one, its params "
                    "struct {} by value",
                    name, kernel.function_params.size(), params_struct));
    return;
  }
  const opfuse::tools::FoundFunctionParam& param = kernel.function_params[0];
  if (param.record != params_struct || !param.by_value) {
    at_kernel(fmt::format("the parameter of '{}' is '{}'; the table says {} by value", name,
                          param.type, params_struct));
    return;
  }
  // Codegen spells a templated params struct with the kernel's dtype arguments, in order.
  std::vector<std::string> dtype_params;
  for (const TemplateParam& p : entry.params) {
    if (p.kind == TemplateParamKind::DType) dtype_params.emplace_back(p.name);
  }
  if (param.record_args != dtype_params) {
    at_kernel(
        fmt::format("the parameter of '{}' is '{}'; codegen spells it {}<{}> (the "
                    "kernel's dtype parameters in order)",
                    name, param.type, params_struct, fmt::join(dtype_params, ", ")));
  }
}

// Check 1 over everything found: table -> templates and templates -> table.
void check_table(const Options& options, const std::vector<const KernelTemplate*>& entries,
                 Findings& findings) {
  std::map<std::string, std::vector<const FoundKernel*>> by_name;
  for (const auto& [key, kernel] : findings.kernels) {
    by_name[kernel.qualified_name].push_back(&kernel);
  }
  for (const KernelTemplate* entry : entries) {
    const std::string name = "opfuse::" + std::string(entry->name);
    const fs::path header = fs::path(options.scan.templates_dir) / entry->header;
    const auto found = by_name.find(name);
    if (found == by_name.end()) {
      const bool header_exists = fs::is_regular_file(header);
      findings.problems.insert(
          {normalized(header), header_exists ? 1U : 0U, header_exists ? 1U : 0U, true,
           fmt::format("entry template '{}' of the kernel-template table ({}) is not defined{}",
                       name, kTableFile,
                       header_exists ? " in this header" : ": the header does not exist")});
      continue;
    }
    for (const FoundKernel* kernel : found->second) {
      if (found->second.size() > 1) {
        findings.problems.insert({kernel->file, kernel->line, kernel->column, true,
                                  fmt::format("'{}' is defined more than once", name)});
      }
      check_signature(*entry, *kernel, findings.problems);
    }
  }
  for (const auto& [name, kernels] : by_name) {
    const bool in_table =
        name.starts_with("opfuse::") &&
        opfuse::codegen::find_kernel_template(std::string_view(name).substr(8)) != nullptr;
    if (in_table) continue;
    for (const FoundKernel* kernel : kernels) {
      findings.problems.insert(
          {kernel->file, kernel->line, kernel->column, true,
           fmt::format("kernel '{}' is not in the kernel-template table ({}): codegen cannot "
                       "instantiate it",
                       name, kTableFile)});
    }
  }
  bool uses_activations = false;
  for (const KernelTemplate* entry : entries) {
    uses_activations |= std::ranges::any_of(entry->params, [](const TemplateParam& p) {
      return p.kind == TemplateParamKind::Activation;
    });
  }
  for (const std::string_view functor : opfuse::codegen::activation_spellings()) {
    if (uses_activations && !findings.records.contains(std::string(functor))) {
      findings.problems.insert(
          {normalized(options.scan.templates_dir), 0, 0, true,
           fmt::format("activation functor '{}' (spelled by the kernel-template table) is "
                       "defined in no header",
                       functor)});
    }
  }
}

// The entries whose kernel was found with exactly the table's signature, by header: only those
// can be instantiated without a cascade of Clang errors.
std::map<std::string, std::vector<const KernelTemplate*>> instantiable_by_header(
    const std::vector<const KernelTemplate*>& entries, const Findings& findings) {
  std::map<std::string, std::vector<const KernelTemplate*>> by_header;
  for (const KernelTemplate* entry : entries) {
    std::vector<const FoundKernel*> matches;
    for (const auto& [key, kernel] : findings.kernels) {
      if (kernel.qualified_name == "opfuse::" + std::string(entry->name)) {
        matches.push_back(&kernel);
      }
    }
    if (matches.size() != 1) continue;
    std::set<Problem> problems;
    check_signature(*entry, *matches[0], problems);
    if (problems.empty()) by_header[std::string(entry->header)].push_back(entry);
  }
  return by_header;
}

std::string find_cuda_path() {
  for (const char* variable : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && *value != '\0') return value;
  }
  return "/usr/local/cuda";
}

int run(const Options& options) {
  std::vector<const KernelTemplate*> entries;
  for (const KernelTemplate& entry : opfuse::codegen::kernel_templates()) {
    if (options.only.empty() || std::ranges::find(options.only, entry.name) != options.only.end()) {
      entries.push_back(&entry);
    }
  }
  Findings findings;
  const std::vector<std::string> headers = template_headers(options.scan.templates_dir);
  // Pass 1: the headers as they are. Pass 2: the headers with the table's examples
  // instantiated, so calls that depend on template parameters resolve and get checked. By
  // default each pass is one translation unit that includes every header (two parses instead of
  // two per header; each costs ~0.6 s of CUDA wrapper headers); --each-header parses every
  // header in a translation unit of its own.
  std::vector<opfuse::tools::ScanUnit> units;
  auto add = [&](const std::string& label, const std::string& header, const std::string& code) {
    if (options.each_header || units.empty()) {
      units.push_back({label, code});
    } else {
      units.back().label += ", " + header;
      units.back().code += code;
    }
  };
  for (const std::string& header : headers) {
    add(header, header, fmt::format("#include \"{}\"\n", header));
  }
  opfuse::tools::scan_templates(options.scan, units, findings);
  units.clear();
  for (const auto& [header, header_entries] : instantiable_by_header(entries, findings)) {
    std::string code = fmt::format("#include \"{}\"\n", header);
    for (const KernelTemplate* entry : header_entries) {
      code += fmt::format("void opfuse_check_templates_{}() {{ (void)&{}; }}\n", entry->name,
                          opfuse::codegen::name_expression(*entry, entry->example_args));
    }
    add("examples in " + header, header, code);
  }
  opfuse::tools::scan_templates(options.scan, units, findings);
  check_table(options, entries, findings);

  unsigned errors = findings.clang_errors;
  unsigned warnings = 0;
  (options.warnings_as_errors ? errors : warnings) += findings.clang_warnings;
  for (const Problem& problem : findings.problems) {
    if (problem.double_precision &&
        std::ranges::any_of(options.fp64_headers, [&](const std::string& h) {
          return fs::path(problem.file).filename() == fs::path(h).filename();
        })) {
      continue;
    }
    const bool is_error = problem.is_error || options.warnings_as_errors;
    (is_error ? errors : warnings) += 1;
    const std::string where =
        problem.file.empty() ? "check_templates"
        : problem.line == 0  ? problem.file
                             : fmt::format("{}:{}:{}", problem.file, problem.line, problem.column);
    std::fprintf(stderr, "%s: %s: %s\n", where.c_str(), is_error ? "error" : "warning",
                 problem.message.c_str());
  }
  if (errors > 0) {
    std::fprintf(stderr, "check_templates: %u error%s, %u warning%s in %s\n", errors,
                 errors == 1 ? "" : "s", warnings, warnings == 1 ? "" : "s",
                 options.scan.templates_dir.c_str());
    return kExitProblems;
  }
  std::printf(
      "check_templates: checked %zu entry templates, %zu device functions (%zu headers, "
      "%u warnings)\n",
      entries.size(), findings.device_functions.size(), headers.size(), warnings);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Checks templates/ against the kernel-template table with Clang (CUDA device side)."};
  app.footer(
      "Exit codes: 0 clean, 1 problems found (printed as file:line:col: error: ...), "
      "2 usage error.");
  Options options;
  options.scan.jobs = std::max(1U, std::thread::hardware_concurrency());
#ifdef OPFUSE_SOURCE_TEMPLATES_DIR
  options.scan.templates_dir = OPFUSE_SOURCE_TEMPLATES_DIR;
#endif
#ifdef OPFUSE_CLANG_RESOURCE_DIR
  options.scan.resource_dir = OPFUSE_CLANG_RESOURCE_DIR;
#endif
  options.scan.cuda_path = find_cuda_path();
  app.add_option("--templates", options.scan.templates_dir, "directory of the kernel templates")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  app.add_option("--cuda-path", options.scan.cuda_path,
                 "CUDA toolkit root (default: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda)")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  app.add_option("--resource-dir", options.scan.resource_dir,
                 "Clang 16's resource directory (its builtin and CUDA wrapper headers)")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  app.add_option("--arch", options.scan.arch, "GPU architecture to parse for")
      ->capture_default_str();
  app.add_option("--only", options.only,
                 "check only these table entries (repeatable); kernels outside the table are "
                 "still reported");
  app.add_flag("--each-header", options.each_header,
               "parse every header in a translation unit of its own (slower; shows that each "
               "parses alone)");
  app.add_option("-j,--jobs", options.scan.jobs, "parse this many translation units at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--Werror", options.warnings_as_errors, "treat warnings as errors");
  app.add_option("--fp64-header", options.fp64_headers,
                 "a header whose device code computes in double on purpose: no check 3 there "
                 "(repeatable)");
  app.add_flag("-v,--verbose", options.scan.verbose, "print each parse and its time");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? kExitOk : kExitUsage;
  }
  for (const std::string& name : options.only) {
    if (opfuse::codegen::find_kernel_template(name) == nullptr) {
      std::fprintf(stderr,
                   "check_templates: --only %s: no such entry in the kernel-template "
                   "table\n",
                   name.c_str());
      return kExitUsage;
    }
  }
  if (options.scan.templates_dir.empty() || options.scan.resource_dir.empty()) {
    std::fprintf(stderr, "check_templates: --templates and --resource-dir are required\n");
    return kExitUsage;
  }
  options.scan.templates_dir = normalized(fs::absolute(options.scan.templates_dir));
  return run(options);
}
