// A scalar expression of one value as text (compiler/ir/scalar_expr.h): the form an expression
// built at run time (a C++ debug feature's modification, docs/debugging.md "C++ features") takes
// in an IR attribute and in the name of the CUDA functor that computes it, so that the CPU
// reference and the kernel source are both made from the name alone. The text is a C++
// identifier: nodes in schedule order joined by '_', each naming earlier nodes by position:
//   v0 (var 0), c1p5 (constant 1.5; m for '-', p for '.'), neg0, exp0, tanh0, sig0,
//   add0x1, sub0x1, mul0x1, div0x1, gt0x1x2x3 / ge.. / le.. (select a cmp b ? c : d).
//   log0, sqrt0, rsqrt0, abs0, erf0, pow0x1, eq0x1x2x3 (a user-defined op's primitives).
// The last node is the value. encode_roots (a user-defined op: its value and gradients, device
// and reference forms) ends instead in out<p>x<q>..., the roots by position. Decoding the encoding
// of a graph gives the same operations in the same order, so the CPU evaluation and the generated
// CUDA agree bit for bit.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/scalar_expr.h"

namespace opfuse::ir::scalar {

std::string encode(const Graph& graph, NodeId value);
std::string encode_roots(const Graph& graph, std::span<const NodeId> roots);

// A number as identifier-safe text ("-0.5" -> "m0p5") and back (nullopt: not such a spelling).
std::string encode_number(double v);
std::optional<double> decode_number(std::string_view s);

struct Decoded {
  Graph graph;
  NodeId value = 0;
  std::vector<NodeId> roots;  // encode_roots' roots; {value} for encode's text
};
// nullopt for text encode() cannot have made (a hostile attribute is refused, never trusted).
std::optional<Decoded> decode(std::string_view text);

// The expression in ordinary notation, for readers: "(x >= -0.5 ? x : -0.5)". var(i) prints as
// var_names[i] where given and not empty, else x, x1, x2, ...
std::string describe(const Graph& graph, NodeId value, std::span<const std::string> var_names = {});

}  // namespace opfuse::ir::scalar
