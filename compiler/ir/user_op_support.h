// What the two halves of the IR builder's user-defined ops share (builder_user_ops.cpp: the
// definitions, their checks and their uses; builder_op_expressions.cpp: lowering an op's
// expression to a scalar expression): the callable math functions, the size limit, wording.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "dsl/ast.h"
#include "support/diagnostics.h"

namespace opfuse::ir::builder_detail::user_ops {

// The functions an op expression may call besides ops, with their argument counts.
struct MathFunction {
  std::string_view name;
  int args;
};
constexpr MathFunction kMathFunctions[] = {
    {"exp", 1}, {"log", 1}, {"sqrt", 1}, {"rsqrt", 1}, {"tanh", 1},   {"sigmoid", 1},
    {"erf", 1}, {"abs", 1}, {"min", 2},  {"max", 2},   {"select", 3},
};

inline const MathFunction* find_math(std::string_view name) {
  for (const MathFunction& f : kMathFunctions)
    if (f.name == name) return &f;
  return nullptr;
}

// An op's value and gradients, both forms, stay within what scalar::decode accepts (4096).
constexpr size_t kMaxOpNodes = 4000;

// Ops lowered inside one another at once. A call with the callee's default attribute values is
// lowered when the callee is defined, so only chains of calls with other values count.
constexpr size_t kMaxOpCallDepth = 24;

inline std::string plural(size_t n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

// Whether an op's lowered graph (its value and gradients, every form) stays within kMaxOpNodes;
// if not, the error at the op's definition when `report` (builder_user_ops.cpp).
bool op_graph_fits(const dsl::OpDecl& d, size_t nodes, bool report, DiagnosticEngine& diags);

inline size_t input_count(const dsl::OpDecl& d) {
  size_t n = 0;
  for (const dsl::OpParam& p : d.params) n += p.is_attr ? 0 : 1;
  return n;
}

}  // namespace opfuse::ir::builder_detail::user_ops
