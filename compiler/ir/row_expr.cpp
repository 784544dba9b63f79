#include "ir/row_expr.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "ir/scalar_code.h"
#include "support/assert.h"

namespace opfuse::ir {

namespace {

constexpr std::string_view kRowPrefix = "opfuse::row_user_";

char stage_letter(RowReduce r) {
  return r == RowReduce::Sum ? 's' : r == RowReduce::Mean ? 'm' : 'x';
}
std::optional<RowReduce> stage_kind(char c) {
  if (c == 's') return RowReduce::Sum;
  if (c == 'm') return RowReduce::Mean;
  if (c == 'x') return RowReduce::Max;
  return std::nullopt;
}

size_t max_stages(std::span<const RowReduce> kinds) {
  return size_t(std::ranges::count(kinds, RowReduce::Max));
}

// d * by with the folds the pointwise backward makes (0 stays 0, 1 * by is by).
scalar::NodeId times(scalar::Graph& g, scalar::NodeId d, scalar::NodeId by) {
  if (g.is_constant(d, 0)) return d;
  if (g.is_constant(d, 1)) return by;
  if (g.is_constant(by, 1)) return d;
  return g.mul(d, by);
}
scalar::NodeId plus(scalar::Graph& g, scalar::NodeId a, scalar::NodeId b) {
  if (g.is_constant(a, 0)) return b;
  if (g.is_constant(b, 0)) return a;
  return g.add(a, b);
}

// The backward's stage kinds from the forward's: the forward's recomputed, a tie count per max,
// an adjoint sum per reduction.
std::vector<RowReduce> backward_kinds(std::span<const RowReduce> forward) {
  std::vector<RowReduce> out(forward.begin(), forward.end());
  out.resize(forward.size() * 2 + max_stages(forward), RowReduce::Sum);
  return out;
}

char learned_letter(DType d) { return d == DType::BF16 ? 'b' : d == DType::FP16 ? 'h' : 'f'; }
std::string_view learned_cuda_type(DType d) {
  return d == DType::BF16 ? "__nv_bfloat16" : d == DType::FP16 ? "__half" : "float";
}

}  // namespace

std::optional<RowReduce> find_row_reduce(std::string_view name) {
  if (name == "sum_last") return RowReduce::Sum;
  if (name == "mean_last") return RowReduce::Mean;
  if (name == "max_last") return RowReduce::Max;
  return std::nullopt;
}

std::string_view row_reduce_name(RowReduce r) {
  return r == RowReduce::Sum ? "sum_last" : r == RowReduce::Mean ? "mean_last" : "max_last";
}

RowProgram derive_row_backward(scalar::Graph& g, const RowProgram& forward, int params) {
  OPFUSE_ASSERT(forward.outputs.size() == 1, "a norm-like forward has one output, not {}",
                forward.outputs.size());
  const RowVars v{params};
  const size_t k_count = forward.stages.size();
  const scalar::NodeId value = forward.outputs[0];
  const scalar::NodeId dy = g.var(RowVars::dy());
  RowProgram out;
  out.stages = forward.stages;  // recomputed: the backward reads x, not saved statistics
  // The tie count of each max: its adjoint is split evenly between the maxima.
  std::vector<scalar::NodeId> ties(k_count, 0);
  int scalars = int(k_count);
  for (size_t k = 0; k < k_count; ++k) {
    if (forward.stages[k].kind != RowReduce::Max) continue;
    const scalar::NodeId r = g.var(v.scalar(int(k)));
    out.stages.push_back({RowReduce::Sum, g.select(scalar::Cmp::Eq, forward.stages[k].root, r,
                                                   g.constant(1), g.constant(0))});
    ties[k] = g.var(v.scalar(scalars++));
  }
  // The adjoint of reduction k (a row scalar) is G_k; each element's share of it is
  // G_k * W_k with W_k = d s_k / d (its root at the element): 1 for a sum, 1 / n for a mean, and
  // for a max 1 / ties at a maximum, 0 elsewhere.
  std::vector<scalar::NodeId> share(k_count, 0);
  const int adjoint_base = scalars;
  auto adjoint = [&](size_t k) { return g.var(v.scalar(adjoint_base + int(k_count - 1 - k))); };
  for (size_t k = 0; k < k_count; ++k) {
    const RowStage& s = forward.stages[k];
    const scalar::NodeId gk = adjoint(k);
    switch (s.kind) {
      case RowReduce::Sum:
        share[k] = gk;
        break;
      case RowReduce::Mean:
        share[k] = g.div(gk, g.var(v.count()));
        break;
      case RowReduce::Max:
        share[k] = g.select(scalar::Cmp::Eq, s.root, g.var(v.scalar(int(k))), g.div(gk, ties[k]),
                            g.constant(0));
        break;
    }
  }
  // G_k = sum over the row of dy * d value / d s_k + sum over later stages m of
  // share_m * d root_m / d s_k: the last reduction's adjoint first (reverse mode).
  for (size_t k = k_count; k-- > 0;) {
    const int sk = v.scalar(int(k));
    scalar::NodeId a = times(g, g.derivative(value, sk), dy);
    for (size_t m = k + 1; m < k_count; ++m)
      a = plus(g, a, times(g, g.derivative(forward.stages[m].root, sk), share[m]));
    out.stages.push_back({RowReduce::Sum, a});
  }
  // Per element: d value / d u * dy plus every reduction's share through its root, for u = x
  // and each learned parameter.
  auto gradient = [&](int var) {
    scalar::NodeId d = times(g, g.derivative(value, var), dy);
    for (size_t k = 0; k < k_count; ++k)
      d = plus(g, d, times(g, g.derivative(forward.stages[k].root, var), share[k]));
    return d;
  };
  out.outputs.push_back(gradient(RowVars::x()));
  for (int j = 0; j < params; ++j) out.outputs.push_back(gradient(v.param(j)));
  return out;
}

AttrList user_row_attrs(std::string_view op_name, std::string_view expression,
                        std::string_view stages, std::string_view params) {
  return {{"op", std::string(op_name)},
          {"expression", std::string(expression)},
          {"stages", std::string(stages)},
          {"params", std::string(params)}};
}

std::string encode_row_stages(std::span<const RowStage> stages) {
  std::string out;
  for (const RowStage& s : stages) out += stage_letter(s.kind);
  return out;
}

std::string encode_row_expression(const scalar::Graph& g, const RowProgram& forward,
                                  const RowProgram& backward) {
  std::vector<scalar::NodeId> roots;
  for (const RowStage& s : forward.stages) roots.push_back(s.root);
  roots.insert(roots.end(), forward.outputs.begin(), forward.outputs.end());
  for (const RowStage& s : backward.stages) roots.push_back(s.root);
  roots.insert(roots.end(), backward.outputs.begin(), backward.outputs.end());
  return scalar::encode_roots(g, roots);
}

RowExpr::RowExpr(const AttrList& attrs) {
  const std::string& op = attr_name(attrs, "op");
  const auto learned = decode_user_params(attr_name(attrs, "params"));
  OPFUSE_ASSERT(learned.has_value(), "norm-like op '{}': malformed params attribute", op);
  learned_ = *learned;
  std::vector<RowReduce> kinds;
  for (const char c : attr_name(attrs, "stages")) {
    const auto k = stage_kind(c);
    OPFUSE_ASSERT(k.has_value(), "norm-like op '{}': unknown stage '{}'", op, c);
    kinds.push_back(*k);
  }
  OPFUSE_ASSERT(!kinds.empty() && kinds.size() <= kMaxRowReductions,
                "norm-like op '{}': {} reductions", op, kinds.size());
  const std::vector<RowReduce> back = backward_kinds(kinds);
  auto decoded = scalar::decode(attr_name(attrs, "expression"));
  const size_t want = kinds.size() + 1 + back.size() + 1 + learned_.size();
  OPFUSE_ASSERT(decoded && decoded->roots.size() == want,
                "norm-like op '{}': its expression is not {} roots", op, want);
  graph_ = std::move(decoded->graph);
  size_t at = 0;
  for (const RowReduce k : kinds) forward_.stages.push_back({k, decoded->roots[at++]});
  forward_.outputs.push_back(decoded->roots[at++]);
  for (const RowReduce k : back) backward_.stages.push_back({k, decoded->roots[at++]});
  while (at < want) backward_.outputs.push_back(decoded->roots[at++]);
}

template <typename T>
void RowExpr::run(const RowProgram& p, std::span<const T> x, std::span<const T> dy,
                  std::span<const std::span<const T>> values, int64_t cols,
                  std::span<const std::span<T>> outputs) const {
  OPFUSE_ASSERT(values.size() == learned_.size() && outputs.size() == p.outputs.size(),
                "row program: {} parameters and {} outputs given for {} and {}", values.size(),
                outputs.size(), learned_.size(), p.outputs.size());
  OPFUSE_ASSERT(cols > 0 && x.size() % size_t(cols) == 0, "row program: {} elements, {} columns",
                x.size(), cols);
  const RowVars v{params()};
  const size_t stages = p.stages.size();
  std::vector<std::vector<scalar::NodeId>> stage_order;
  for (const RowStage& s : p.stages) stage_order.push_back(graph_.schedule(std::span(&s.root, 1)));
  const std::vector<scalar::NodeId> out_order = graph_.schedule(p.outputs);
  std::vector<T> vars(size_t(v.scalar(int(stages))), T(0));
  std::vector<T> scratch(graph_.size());
  vars[size_t(v.count())] = T(cols);
  const int64_t rows = int64_t(x.size()) / cols;
  auto load = [&](int64_t r, int64_t c) {
    const size_t i = size_t(r * cols + c);
    vars[RowVars::x()] = x[i];
    vars[RowVars::dy()] = dy.empty() ? T(0) : dy[i];
    for (size_t j = 0; j < values.size(); ++j)
      vars[size_t(v.param(int(j)))] = values[j][values[j].size() == 1 ? 0 : size_t(c)];
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t k = 0; k < stages; ++k) {
      const RowStage& s = p.stages[k];
      double acc = s.kind == RowReduce::Max ? -std::numeric_limits<double>::infinity() : 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        load(r, c);
        graph_.evaluate<T>(stage_order[k], vars, scratch);
        const double e = double(scratch[s.root]);
        if (s.kind != RowReduce::Max)
          acc += e;
        else if (std::isnan(e) || e > acc)
          acc = std::isnan(acc) ? acc : e;
      }
      if (s.kind == RowReduce::Mean) acc /= double(cols);
      vars[size_t(v.scalar(int(k)))] = T(acc);
    }
    for (int64_t c = 0; c < cols; ++c) {
      load(r, c);
      graph_.evaluate<T>(out_order, vars, scratch);
      for (size_t o = 0; o < outputs.size(); ++o)
        outputs[o][size_t(r * cols + c)] = scratch[p.outputs[o]];
    }
  }
}

template void RowExpr::run<float>(const RowProgram&, std::span<const float>, std::span<const float>,
                                  std::span<const std::span<const float>>, int64_t,
                                  std::span<const std::span<float>>) const;
template void RowExpr::run<double>(const RowProgram&, std::span<const double>,
                                   std::span<const double>,
                                   std::span<const std::span<const double>>, int64_t,
                                   std::span<const std::span<double>>) const;

std::string describe_row_value(const AttrList& attrs) {
  const RowExpr expr(attrs);
  const RowVars v = expr.vars();
  const RowProgram& forward = expr.forward();
  std::vector<std::string> names(size_t(v.scalar(int(forward.stages.size()))));
  names[RowVars::x()] = "x";
  names[RowVars::dy()] = "dy";
  for (int j = 0; j < expr.params(); ++j)
    names[size_t(v.param(j))] = expr.learned()[size_t(j)].name;
  names[size_t(v.count())] = "n";
  for (size_t k = 0; k < forward.stages.size(); ++k)
    names[size_t(v.scalar(int(k)))] =
        fmt::format("{}({})", row_reduce_name(forward.stages[k].kind),
                    scalar::describe(expr.graph(), forward.stages[k].root, names));
  return scalar::describe(expr.graph(), forward.outputs.front(), names);
}

std::string row_functor_name(const AttrList& attrs) {
  std::string op = attr_name(attrs, "op");
  for (char& c : op)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  std::string learned;
  const auto params = decode_user_params(attr_name(attrs, "params"));
  OPFUSE_ASSERT(params.has_value(), "norm-like op '{}': malformed params attribute", op);
  for (const UserParam& p : *params)
    learned += fmt::format("{}{}", learned_letter(p.dtype), p.size == 0 ? 's' : 'v');
  return fmt::format("{}{}_{}_{}_L{}_{}", kRowPrefix, op.size(), op, attr_name(attrs, "stages"),
                     learned, attr_name(attrs, "expression"));
}

namespace {

// row_user_<length>_<name>_<stages>_L<params>_<expression> back to the carrier's attributes
// (the parameters get stand-in names and sizes: the source needs their dtype and kind only).
std::optional<AttrList> parse_row_functor_name(std::string_view name) {
  if (!name.starts_with(kRowPrefix)) return std::nullopt;
  name.remove_prefix(kRowPrefix.size());
  const size_t sep = name.find('_');
  if (sep == std::string_view::npos || sep == 0 || sep > 4) return std::nullopt;
  size_t length = 0;
  for (const char c : name.substr(0, sep)) {
    if (c < '0' || c > '9') return std::nullopt;
    length = length * 10 + size_t(c - '0');
  }
  name.remove_prefix(sep + 1);
  if (name.size() < length + 1 || name[length] != '_') return std::nullopt;
  const std::string op(name.substr(0, length));
  name.remove_prefix(length + 1);
  const size_t stages_end = name.find('_');
  if (stages_end == std::string_view::npos || stages_end == 0) return std::nullopt;
  const std::string stages(name.substr(0, stages_end));
  for (const char c : stages)
    if (!stage_kind(c)) return std::nullopt;
  name.remove_prefix(stages_end + 1);
  if (!name.starts_with('L')) return std::nullopt;
  const size_t learned_end = name.find('_');
  if (learned_end == std::string_view::npos) return std::nullopt;
  const std::string_view letters = name.substr(1, learned_end - 1);
  if (letters.size() % 2 != 0 || letters.size() / 2 > kMaxUserParams) return std::nullopt;
  std::vector<UserParam> params;
  for (size_t i = 0; i < letters.size(); i += 2) {
    UserParam p;
    p.name = fmt::format("p{}", i / 2);
    const char d = letters[i], k = letters[i + 1];
    if ((d != 'b' && d != 'h' && d != 'f') || (k != 's' && k != 'v')) return std::nullopt;
    p.dtype = d == 'b' ? DType::BF16 : d == 'h' ? DType::FP16 : DType::FP32;
    p.size = k == 's' ? 0 : 1;
    params.push_back(std::move(p));
  }
  const std::string_view expression = name.substr(learned_end + 1);
  // The same checks RowExpr asserts, as a refusal: a name is not trusted.
  const auto decoded = scalar::decode(expression);
  std::vector<RowReduce> kinds;
  for (const char c : stages) kinds.push_back(*stage_kind(c));
  if (!decoded || kinds.size() > kMaxRowReductions ||
      decoded->roots.size() != kinds.size() * 3 + max_stages(kinds) + 2 + params.size())
    return std::nullopt;
  return user_row_attrs(op, expression, stages, encode_user_params(params));
}

std::string indent_lines(const std::string& body, std::string_view by) {
  std::string out;
  size_t start = 0;
  while (start < body.size()) {
    const size_t end = body.find('\n', start);
    out += std::string(by) + body.substr(start, end - start + 1);
    start = end + 1;
  }
  return out;
}

// One program's stages as the body of a switch over the stage: each case computes its root
// into `r`.
std::string stage_cases(const scalar::Graph& g, const RowProgram& p,
                        std::span<const std::string> vars) {
  std::string out;
  const std::string r[] = {"r"};
  for (size_t k = 0; k < p.stages.size(); ++k) {
    const scalar::NodeId root[] = {p.stages[k].root};
    out += fmt::format("      case {}: {{\n{}        break;\n      }}\n", k,
                       indent_lines(g.cuda(root, vars, r), "        "));
  }
  return out;
}

std::string kind_list(const RowProgram& p) {
  std::string out;
  for (const RowStage& s : p.stages)
    out += fmt::format("{}{}", out.empty() ? "" : ", ",
                       s.kind == RowReduce::Sum    ? "kRowSum"
                       : s.kind == RowReduce::Mean ? "kRowMean"
                                                   : "kRowMax");
  return out;
}

}  // namespace

std::optional<std::string> row_functor_source(std::string_view functor_name) {
  const auto attrs = parse_row_functor_name(functor_name);
  if (!attrs) return std::nullopt;
  const RowExpr expr(*attrs);
  const scalar::Graph& g = expr.graph();
  const RowVars v = expr.vars();
  const int params = expr.params();
  const size_t scalars = expr.backward().stages.size();
  std::vector<std::string> vars(size_t(v.scalar(int(scalars))));
  vars[RowVars::x()] = "x";
  vars[RowVars::dy()] = "dy";
  for (int j = 0; j < params; ++j) vars[size_t(v.param(j))] = fmt::format("p[{}]", j);
  vars[size_t(v.count())] = "n";
  for (size_t k = 0; k < scalars; ++k) vars[size_t(v.scalar(int(k)))] = fmt::format("s[{}]", k);
  std::vector<std::string> forward_vars = vars;
  forward_vars[RowVars::dy()] = "0.0f";  // the forward never reads dy
  std::string reads;
  for (int j = 0; j < params; ++j) {
    const UserParam& p = expr.learned()[size_t(j)];
    reads +=
        fmt::format("    if (k == {}) return to_float(static_cast<const {}*>(learned[{}])[{}]);\n",
                    j, learned_cuda_type(p.dtype), j, p.size == 0 ? "0" : "col");
  }
  std::vector<std::string> out_names = {"dx"};
  for (int j = 0; j < params; ++j) out_names.push_back(fmt::format("dparam[{}]", j));
  const std::string value_name[] = {"value"};
  const std::string type = std::string(functor_name.substr(std::string_view("opfuse::").size()));
  return fmt::format(
      "// The norm-like op {} (user-defined with last-dimension reductions, docs/language.md\n"
      "// \"User-defined ops\"): its forward and backward row programs (compiler/ir/row_expr.h)\n"
      "// for templates/row_expr.cuh, generated from its definition.\n"
      "#include \"common/scalar_math.cuh\"\n"
      "#include \"common/types.cuh\"\n"
      "namespace opfuse {{\n"
      "struct {} {{\n"
      "  static constexpr int kParams = {};\n"
      "  static constexpr int kParamSlots = {};  // kParams, at least 1 (array sizes)\n"
      "  static constexpr int kForwardStages = {};\n"
      "  static constexpr int kBackwardStages = {};\n"
      "  __device__ __forceinline__ static int forward_kind(int k) {{\n"
      "    constexpr int kinds[] = {{{}}};\n"
      "    return kinds[k];\n"
      "  }}\n"
      "  __device__ __forceinline__ static int backward_kind(int k) {{\n"
      "    constexpr int kinds[] = {{{}}};\n"
      "    return kinds[k];\n"
      "  }}\n"
      "  __device__ __forceinline__ static float param(const void* const "
      "(&learned)[kMaxLearnedParams],\n"
      "                                                int k, int col) {{\n"
      "{}"
      "    return 0.0f;\n"
      "  }}\n"
      "  __device__ __forceinline__ static float forward_stage(int k, float x, const float "
      "(&p)[kParamSlots],\n"
      "                                                        float n, const float* s) {{\n"
      "    float r = 0.0f;\n"
      "    switch (k) {{\n{}"
      "      default:\n"
      "        break;\n"
      "    }}\n"
      "    return r;\n"
      "  }}\n"
      "  __device__ __forceinline__ static float forward_value(float x, const float "
      "(&p)[kParamSlots],\n"
      "                                                        float n, const float* s) {{\n"
      "    float value;\n{}"
      "    return value;\n"
      "  }}\n"
      "  __device__ __forceinline__ static float backward_stage(int k, float x, float dy,\n"
      "                                                         const float (&p)[kParamSlots], "
      "float n,\n"
      "                                                         const float* s) {{\n"
      "    float r = 0.0f;\n"
      "    switch (k) {{\n{}"
      "      default:\n"
      "        break;\n"
      "    }}\n"
      "    return r;\n"
      "  }}\n"
      "  __device__ __forceinline__ static void backward_outputs(float x, float dy,\n"
      "                                                          const float (&p)[kParamSlots], "
      "float n,\n"
      "                                                          const float* s, float& dx,\n"
      "                                                          float (&dparam)[kParamSlots]) "
      "{{\n{}"
      "  }}\n"
      "}};\n"
      "}}  // namespace opfuse\n",
      attr_name(*attrs, "op"), type, params, std::max(params, 1), expr.forward().stages.size(),
      scalars, kind_list(expr.forward()), kind_list(expr.backward()), reads,
      stage_cases(g, expr.forward(), forward_vars),
      indent_lines(g.cuda(expr.forward().outputs, forward_vars, value_name), "    "),
      stage_cases(g, expr.backward(), vars),
      indent_lines(g.cuda(expr.backward().outputs, vars, out_names), "    "));
}

}  // namespace opfuse::ir
