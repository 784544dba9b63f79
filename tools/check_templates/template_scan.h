// The Clang side of the template checker (check_templates.cpp): parses generated translation
// units that include headers of a templates directory, as CUDA device code with Clang 16
// (libTooling), and reports what it found there — kernels with their signatures, device
// functions, structs — plus the problems of device code (host-only, std::, heap and printf
// calls; double arithmetic). Comparing kernels with the kernel-template table is the caller's.
//
// Only this file pair includes Clang: an LLVM built without RTTI needs -fno-rtti on it.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace opfuse::tools {

struct Problem {
  std::string file;   // as Clang prints it; empty: the whole run
  unsigned line = 0;  // 0: the whole file
  unsigned column = 0;
  bool is_error = true;  // false: a warning
  std::string message;
  bool double_precision = false;  // check 3 (a header may be allowed it: --fp64-header)
  auto key() const { return std::tie(file, line, column, message, is_error); }
  bool operator<(const Problem& other) const { return key() < other.key(); }
};

// What a template parameter is, as Clang sees it (a type, an int or a bool constant, other).
enum class ParamShape { Type, Int, Bool, Other };

struct FoundParam {
  std::string name;
  ParamShape shape = ParamShape::Other;
  std::string spelled;  // the declaration's kind as written, for messages ("typename", "bool")
  bool is_pack = false;
  std::optional<std::string> default_value;  // evaluated: "false", "256", "__half"
  unsigned line = 0;
  unsigned column = 0;
};

struct FoundFunctionParam {
  std::string type;    // as printed
  std::string record;  // qualified name of the struct or struct template, empty if none
  std::vector<std::string> record_args;  // a struct template's arguments: {"Input", "Output"}
  bool by_value = false;
};

// A __global__ function (template) defined in the templates directory.
struct FoundKernel {
  std::string qualified_name;  // "opfuse::rmsnorm_fwd"
  std::string header;          // relative to the templates directory
  std::string file;            // as Clang prints it
  unsigned line = 0;
  unsigned column = 0;
  bool is_template = false;
  std::vector<FoundParam> params;
  std::vector<FoundFunctionParam> function_params;
};

// What the parses found, merged: headers include each other, so most things are seen often.
struct Findings {
  std::map<std::tuple<std::string, std::string, unsigned>, FoundKernel> kernels;
  std::set<std::string> device_functions;  // "file:line:col name" of each (pattern) function
  std::set<std::string> records;           // qualified names of the structs defined there
  std::set<Problem> problems;
  unsigned clang_errors = 0;
  unsigned clang_warnings = 0;
};

struct ScanOptions {
  std::string templates_dir;  // absolute
  std::string cuda_path;      // toolkit root
  std::string resource_dir;   // Clang 16's resource directory
  std::string arch = "sm_90";
  unsigned jobs = 1;  // translation units parsed at once
  bool verbose = false;
};

// One generated main file: `code` is compiled as if it were a file in the templates directory
// (so `#include "norm.cuh"` finds the header); `label` names it in verbose output.
struct ScanUnit {
  std::string label;
  std::string code;
};

// Parses every unit (independent parses, on up to options.jobs threads), prints Clang's own
// diagnostics to stderr in unit order, and merges what the units found into `findings`.
void scan_templates(const ScanOptions& options, const std::vector<ScanUnit>& units,
                    Findings& findings);

}  // namespace opfuse::tools
