#include "ir/pointwise_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "ir/scalar_code.h"
#include "support/assert.h"

namespace opfuse::ir {

namespace {

constexpr std::string_view kFunctorPrefix = "opfuse::pointwise_";
constexpr std::string_view kExpressionPrefix = "opfuse::pointwise_expr_";
constexpr std::string_view kUserPrefix = "opfuse::pointwise_user_";

// An attribute value as part of a C++ identifier: 1.702 -> 1p702, -1e-05 -> m1em05.
double attr_number(const Attr& a) {
  if (const auto* d = std::get_if<double>(&a.value)) return *d;
  if (const auto* i = std::get_if<int64_t>(&a.value)) return double(*i);
  if (const auto* b = std::get_if<bool>(&a.value)) return *b ? 1 : 0;
  internal_failure(__FILE__, __LINE__,
                   fmt::format("pointwise attribute '{}' is not a number", a.name));
}

Attr number_attr(const AttrSpec& spec, double v) {
  switch (spec.type) {
    case AttrType::Int:
      return {std::string(spec.name), int64_t(v)};
    case AttrType::Bool:
      return {std::string(spec.name), v != 0};
    default:
      return {std::string(spec.name), v};
  }
}

// A learned parameter's dtype as one letter of a functor name, and back.
char learned_letter(DType d) { return d == DType::BF16 ? 'b' : d == DType::FP16 ? 'h' : 'f'; }
std::optional<DType> learned_dtype(char c) {
  if (c == 'b') return DType::BF16;
  if (c == 'h') return DType::FP16;
  if (c == 'f') return DType::FP32;
  return std::nullopt;
}
std::string_view learned_cuda_type(DType d) {
  return d == DType::BF16 ? "__nv_bfloat16" : d == DType::FP16 ? "__half" : "float";
}

// name_limit_7_alpha_1p702 -> the def and its attributes, in the def's attribute order.
std::optional<std::pair<const PointwiseDef*, AttrList>> parse_functor_name(std::string_view name) {
  if (name.starts_with(kUserPrefix)) {
    // user_<length>_<name>_<expression>: the roots say whether it is gated (2 (inputs + 1)).
    name.remove_prefix(kUserPrefix.size());
    const size_t sep = name.find('_');
    if (sep == std::string_view::npos || sep == 0 || sep > 4) return std::nullopt;
    size_t length = 0;
    for (const char c : name.substr(0, sep)) {
      if (c < '0' || c > '9') return std::nullopt;
      length = length * 10 + size_t(c - '0');
    }
    name.remove_prefix(sep + 1);
    if (name.size() < length + 2 || name[length] != '_') return std::nullopt;
    const std::string_view op = name.substr(0, length);
    std::string_view text = name.substr(length + 1);
    // Learned parameters: "L" then per parameter its dtype letter and s (scalar) or v (per
    // feature), before the expression (whose tokens never start with an upper-case letter).
    std::vector<UserParam> learned;
    if (text.starts_with('L')) {
      const size_t end = text.find('_');
      if (end == std::string_view::npos || end % 2 == 0 || (end - 1) / 2 > kMaxUserParams)
        return std::nullopt;
      for (size_t i = 1; i < end; i += 2) {
        UserParam p;
        p.name = fmt::format("p{}", learned.size());
        const auto dtype = learned_dtype(text[i]);
        if (!dtype || (text[i + 1] != 's' && text[i + 1] != 'v')) return std::nullopt;
        p.dtype = *dtype;
        p.size = text[i + 1] == 'v' ? 1 : 0;
        learned.push_back(std::move(p));
      }
      text.remove_prefix(end + 1);
    }
    const auto decoded = scalar::decode(text);
    const size_t k = learned.size();
    if (!decoded || (decoded->roots.size() != 2 * (2 + k) && decoded->roots.size() != 2 * (3 + k)))
      return std::nullopt;
    return std::make_pair(&user_pointwise_def(decoded->roots.size() == 2 * (3 + k)),
                          user_pointwise_attrs(op, text, {}, encode_user_params(learned)));
  }
  if (!name.starts_with(kFunctorPrefix)) return std::nullopt;
  name.remove_prefix(kFunctorPrefix.size());
  for (const PointwiseDef* def : pointwise_defs()) {
    if (!name.starts_with(def->name)) continue;
    std::string_view rest = name.substr(def->name.size());
    AttrList attrs;
    bool ok = true;
    for (size_t i = 0; i < def->attrs.size() && ok; ++i) {
      const std::string key = fmt::format("_{}_", def->attrs[i].name);
      if (!rest.starts_with(key)) {
        ok = false;
        break;
      }
      rest.remove_prefix(key.size());
      size_t end = rest.size();
      if (i + 1 < def->attrs.size()) end = rest.find(fmt::format("_{}_", def->attrs[i + 1].name));
      const auto v = scalar::decode_number(rest.substr(0, end));
      if (end == std::string_view::npos || !v) {
        ok = false;
        break;
      }
      attrs.push_back(number_attr(def->attrs[i], *v));
      rest.remove_prefix(end);
    }
    if (ok && rest.empty()) return std::make_pair(def, std::move(attrs));
  }
  return std::nullopt;
}

}  // namespace

const PointwiseDef* find_pointwise(std::string_view name) {
  const auto defs = pointwise_defs();
  const auto it = std::ranges::find(defs, name, &PointwiseDef::name);
  return it == defs.end() ? nullptr : *it;
}

std::vector<std::string> expression_var_names(const PointwiseDef& def, const AttrList& attrs) {
  std::vector<std::string> names(def.gated ? 3 : 2);
  for (UserParam& p : user_params(def, attrs)) names.push_back(std::move(p.name));
  return names;
}

AttrList user_pointwise_attrs(std::string_view op_name, std::string_view expression,
                              std::string_view parts, std::string_view params) {
  return {{"op", std::string(op_name)},
          {"expression", std::string(expression)},
          {"parts", std::string(parts)},
          {"params", std::string(params)}};
}

std::string encode_user_params(std::span<const UserParam> params) {
  std::string out;
  for (const UserParam& p : params)
    out += fmt::format("{}{}:{}:{}:{}", out.empty() ? "" : ",", p.name, dtype_name(p.dtype), p.size,
                       scalar::encode_number(p.init));
  return out;
}

std::optional<std::vector<UserParam>> decode_user_params(std::string_view text) {
  std::vector<UserParam> out;
  size_t start = 0;
  while (start < text.size()) {
    if (out.size() >= kMaxUserParams) return std::nullopt;
    const size_t end = std::min(text.find(',', start), text.size());
    std::string_view item = text.substr(start, end - start);
    start = end + 1;
    std::string_view fields[4];
    for (int i = 0; i < 4; ++i) {
      const size_t colon = i == 3 ? item.size() : item.find(':');
      if (colon == std::string_view::npos) return std::nullopt;
      fields[i] = item.substr(0, colon);
      item.remove_prefix(i == 3 ? item.size() : colon + 1);
    }
    UserParam p;
    p.name = std::string(fields[0]);
    const auto dtype = parse_user_dtype(fields[1]);
    const auto init = scalar::decode_number(fields[3]);
    if (p.name.empty() || !dtype || !init || fields[2].empty() || fields[2].size() > 12)
      return std::nullopt;
    p.dtype = *dtype;
    p.init = *init;
    for (const char c : fields[2]) {
      if (c < '0' || c > '9') return std::nullopt;
      p.size = p.size * 10 + (c - '0');
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<UserParam> user_params(const PointwiseDef& def, const AttrList& attrs) {
  if (!def.user_defined) return {};
  const auto it = std::ranges::find(attrs, std::string_view("params"), &Attr::name);
  if (it == attrs.end()) return {};
  const auto decoded = decode_user_params(std::get<std::string>(it->value));
  OPFUSE_ASSERT(decoded.has_value(), "user op '{}': its params attribute '{}' is malformed",
                attr_name(attrs, "op"), std::get<std::string>(it->value));
  return *decoded;
}

std::string composed_part_text(std::string_view name, SourceLoc loc) {
  return fmt::format("{}@{}:{}:{}", name, loc.file, loc.line, loc.col);
}

std::vector<ComposedPart> composed_parts(const PointwiseDef& def, const AttrList& attrs) {
  std::vector<ComposedPart> out;
  if (!def.user_defined) return out;
  const std::string& text = attr_name(attrs, "parts");
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('+', start), text.size());
    const std::string part = text.substr(start, end - start);
    start = end + 1;
    ComposedPart p;
    const size_t at = part.find('@');
    p.name = part.substr(0, at);
    if (at != std::string::npos) {
      unsigned file = 0, line = 0, col = 0;
      if (std::sscanf(part.c_str() + at + 1, "%u:%u:%u", &file, &line, &col) == 3)
        p.loc = SourceLoc{FileId(file), line, col};
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::string_view pointwise_op_name(const PointwiseDef& def, const AttrList& attrs) {
  return def.user_defined ? std::string_view(attr_name(attrs, "op")) : def.name;
}

std::string_view written_op_name(OpKind kind, const AttrList& attrs) {
  const PointwiseDef* def = pointwise_def(kind);
  if (def != nullptr && def->user_defined && is_pointwise(kind)) return attr_name(attrs, "op");
  if (kind == OpKind::UserNorm) return attr_name(attrs, "op");
  return op_info(kind).name;
}

bool has_gelu_epilogue(OpKind kind) {
  const PointwiseDef* def = pointwise_def(kind);
  return def != nullptr && def->cublaslt_gelu_epilogue;
}

bool fused_gemm_activation(const PointwiseDef& def) {
  return def.gated && def.attrs.empty() && !def.user_defined;
}

PointwiseExpr::PointwiseExpr(const PointwiseDef& def, const AttrList& attrs, bool device) {
  inputs_ = def.gated ? 2 : 1;
  params_ = int(user_params(def, attrs).size());
  std::vector<scalar::NodeId> in(size_t(inputs_), 0);
  for (int i = 0; i < inputs_; ++i) in[size_t(i)] = graph_.var(i);
  std::vector<scalar::NodeId> given;
  value_ = def.build(PointwiseBuilder{graph_, in, attrs, device, &given});
  // The backward multiplies each partial derivative by dy last, as the hand-written kernels did.
  const scalar::NodeId dy = graph_.var(inputs_);
  if (!given.empty()) gradients_ = given;
  for (int i = 0; i < inputs_ && given.empty(); ++i) {
    const scalar::NodeId d = graph_.derivative(value_, i);
    gradients_.push_back(graph_.is_constant(d, 0)   ? d
                         : graph_.is_constant(d, 1) ? dy
                                                    : graph_.mul(d, dy));
  }
  OPFUSE_ASSERT(gradients_.size() == size_t(inputs_ + params_),
                "pointwise op '{}': {} gradients for {} inputs and {} parameters",
                pointwise_op_name(def, attrs), gradients_.size(), inputs_, params_);
  // The expression reads no var past the parameters (a decoded attribute is not trusted).
  for (size_t id = 0; id < graph_.size(); ++id) {
    const scalar::Node& n = graph_.node(scalar::NodeId(id));
    OPFUSE_ASSERT(n.op != scalar::Op::Var || (n.var >= 0 && n.var <= inputs_ + params_),
                  "pointwise op '{}' reads var {} of {}", pointwise_op_name(def, attrs), n.var,
                  inputs_ + params_ + 1);
  }
  const scalar::NodeId roots[] = {value_};
  forward_order_ = graph_.schedule(roots);
  backward_order_ = graph_.schedule(gradients_);
}

namespace {

// The expression's vars: the inputs, dy, the learned parameters (var(inputs + 1 + j)).
template <typename T>
std::array<T, 3 + kMaxUserParams> expression_vars(int inputs, std::span<const T> in,
                                                  std::span<const T> params, T dy) {
  std::array<T, 3 + kMaxUserParams> vars{};
  std::copy(in.begin(), in.end(), vars.begin());
  vars[size_t(inputs)] = dy;
  std::copy(params.begin(), params.end(), vars.begin() + inputs + 1);
  return vars;
}

}  // namespace

template <typename T>
T PointwiseExpr::forward(std::span<const T> in, std::span<const T> params,
                         std::span<T> scratch) const {
  OPFUSE_ASSERT(params.size() == size_t(params_), "{} parameter values for {} parameters",
                params.size(), params_);
  const auto vars = expression_vars<T>(inputs_, in, params, T(0));
  graph_.evaluate<T>(forward_order_, std::span<const T>(vars.data(), size_t(inputs_ + 1 + params_)),
                     scratch);
  return scratch[value_];
}

template <typename T>
void PointwiseExpr::backward(std::span<const T> in, std::span<const T> params, T dy,
                             std::span<T> grads, std::span<T> scratch) const {
  OPFUSE_ASSERT(params.size() == size_t(params_), "{} parameter values for {} parameters",
                params.size(), params_);
  const auto vars = expression_vars<T>(inputs_, in, params, dy);
  graph_.evaluate<T>(backward_order_,
                     std::span<const T>(vars.data(), size_t(inputs_ + 1 + params_)), scratch);
  for (size_t i = 0; i < gradients_.size(); ++i) grads[i] = scratch[gradients_[i]];
}

template float PointwiseExpr::forward<float>(std::span<const float>, std::span<const float>,
                                             std::span<float>) const;
template double PointwiseExpr::forward<double>(std::span<const double>, std::span<const double>,
                                               std::span<double>) const;
template void PointwiseExpr::backward<float>(std::span<const float>, std::span<const float>, float,
                                             std::span<float>, std::span<float>) const;
template void PointwiseExpr::backward<double>(std::span<const double>, std::span<const double>,
                                              double, std::span<double>, std::span<double>) const;

std::string pointwise_functor_name(const PointwiseDef& def, const AttrList& attrs) {
  if (def.user_defined) {
    // A composed chain's name ("softcap+leaky_relu", compiler/passes/compose_pointwise.h) as an
    // identifier.
    std::string op = attr_name(attrs, "op");
    for (char& c : op)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
    std::string learned;
    for (const UserParam& p : user_params(def, attrs))
      learned += fmt::format("{}{}", learned_letter(p.dtype), p.size == 0 ? 's' : 'v');
    return fmt::format("{}{}_{}_{}{}", kUserPrefix, op.size(), op,
                       learned.empty() ? "" : "L" + learned + "_", attr_name(attrs, "expression"));
  }
  std::string name = fmt::format("{}{}", kFunctorPrefix, def.name);
  for (const AttrSpec& spec : def.attrs) {
    const auto it = std::ranges::find(attrs, spec.name, &Attr::name);
    OPFUSE_ASSERT(it != attrs.end(), "{} has no attribute '{}'", def.name, spec.name);
    name += fmt::format("_{}_{}", spec.name, scalar::encode_number(attr_number(*it)));
  }
  return name;
}

std::string expression_functor_name(std::string_view expression_text) {
  return fmt::format("{}{}", kExpressionPrefix, expression_text);
}

namespace {

std::string indent_lines(const std::string& body) {
  std::string out;
  size_t start = 0;
  while (start < body.size()) {
    const size_t end = body.find('\n', start);
    out += "    " + body.substr(start, end - start + 1);
    start = end + 1;
  }
  return out;
}

// The functor of an expression_functor_name: forward is f, backward f'(x) dy (derived).
std::optional<std::string> expression_functor_source(std::string_view functor_name) {
  auto decoded = scalar::decode(functor_name.substr(kExpressionPrefix.size()));
  if (!decoded) return std::nullopt;
  scalar::Graph& g = decoded->graph;
  const scalar::NodeId value[] = {decoded->value};
  const scalar::NodeId grad[] = {g.mul(g.derivative(decoded->value, 0), g.var(1))};
  const std::string in[] = {"in[0]"};
  const std::string in_dy[] = {"in[0]", "dy"};
  const std::string value_name[] = {"value"};
  const std::string grad_name[] = {"grad[0]"};
  const std::string type = std::string(functor_name.substr(std::string_view("opfuse::").size()));
  return fmt::format(
      "// y = {} (a precision-debug modification, compiler/passes/debug_modify.h).\n"
      "#include \"common/scalar_math.cuh\"\n"
      "namespace opfuse {{\n"
      "struct {} {{\n"
      "  static constexpr int kInputs = 1;\n"
      "  __device__ __forceinline__ static float forward(const float (&in)[1]) {{\n"
      "    float value;\n{}"
      "    return value;\n"
      "  }}\n"
      "  __device__ __forceinline__ static void backward(const float (&in)[1], float dy,\n"
      "                                                  float (&grad)[1]) {{\n{}"
      "  }}\n"
      "}};\n"
      "}}  // namespace opfuse\n",
      scalar::describe(g, decoded->value), type, indent_lines(g.cuda(value, in, value_name)),
      indent_lines(g.cuda(grad, in_dy, grad_name)));
}

// The functor of a user-defined op with learned parameters (templates/activation.cuh, "learned
// contract"): param() reads parameter k at column col in its dtype, forward and backward take
// the parameters' values and backward also gives each one's share of its gradient.
std::string learned_functor_source(std::string_view functor_name, std::string_view op_name,
                                   const PointwiseExpr& expr, const std::vector<UserParam>& learned,
                                   std::span<const std::string> names) {
  const int n = expr.inputs();
  const size_t k = learned.size();
  std::vector<std::string> vars;
  vars.reserve(size_t(n) + 1 + k);
  for (int i = 0; i < n; ++i) vars.push_back(fmt::format("in[{}]", i));
  vars.push_back("dy");
  for (size_t j = 0; j < k; ++j) vars.push_back(fmt::format("p[{}]", j));
  std::vector<std::string> forward_vars = vars;
  forward_vars[size_t(n)] = "0.0f";  // the value never reads dy
  std::vector<std::string> grads;
  grads.reserve(size_t(n) + k);
  for (int i = 0; i < n; ++i) grads.push_back(fmt::format("grad[{}]", i));
  for (size_t j = 0; j < k; ++j) grads.push_back(fmt::format("dparam[{}]", j));
  std::string reads;
  for (size_t j = 0; j < k; ++j)
    reads +=
        fmt::format("    if (k == {}) return to_float(static_cast<const {}*>(learned[{}])[{}]);\n",
                    j, learned_cuda_type(learned[j].dtype), j, learned[j].size == 0 ? "0" : "col");
  const scalar::NodeId value[] = {expr.value()};
  const std::string value_name[] = {"value"};
  const std::string type = std::string(functor_name.substr(std::string_view("opfuse::").size()));
  return fmt::format(
      "// The pointwise op {} = {} (user-defined with {} learned parameter{}, docs/language.md\n"
      "// \"User-defined ops\"), generated from its definition.\n"
      "#include \"common/scalar_math.cuh\"\n"
      "#include \"common/types.cuh\"\n"
      "namespace opfuse {{\n"
      "struct {} {{\n"
      "  static constexpr int kInputs = {};\n"
      "  static constexpr int kParams = {};\n"
      "  __device__ __forceinline__ static float param(const void* const "
      "(&learned)[kMaxLearnedParams],\n"
      "                                                int k, int col) {{\n"
      "{}"
      "    return 0.0f;\n"
      "  }}\n"
      "  __device__ __forceinline__ static float forward(const float (&in)[{}], const float "
      "(&p)[{}]) "
      "{{\n"
      "    float value;\n{}"
      "    return value;\n"
      "  }}\n"
      "  __device__ __forceinline__ static void backward(const float (&in)[{}], const float "
      "(&p)[{}],\n"
      "                                                  float dy, float (&grad)[{}],\n"
      "                                                  float (&dparam)[{}]) {{\n{}"
      "  }}\n"
      "}};\n"
      "}}  // namespace opfuse\n",
      op_name, scalar::describe(expr.graph(), expr.value(), names), k, k == 1 ? "" : "s", type, n,
      k, reads, n, k, indent_lines(expr.graph().cuda(value, forward_vars, value_name)), n, k, n, k,
      indent_lines(expr.graph().cuda(expr.gradients(), vars, grads)));
}

}  // namespace

std::optional<std::string> pointwise_functor_source(std::string_view functor_name) {
  if (functor_name.starts_with(kExpressionPrefix)) return expression_functor_source(functor_name);
  const auto parsed = parse_functor_name(functor_name);
  if (!parsed) return std::nullopt;
  const auto& [def, attrs] = *parsed;
  const PointwiseExpr expr(*def, attrs, /*device=*/true);
  const int n = expr.inputs();
  const std::vector<UserParam> learned = user_params(*def, attrs);
  if (!learned.empty())
    return learned_functor_source(functor_name, pointwise_op_name(*def, attrs), expr, learned,
                                  expression_var_names(*def, attrs));
  std::vector<std::string> vars;
  vars.reserve(size_t(n) + 1);
  for (int i = 0; i < n; ++i) vars.push_back(fmt::format("in[{}]", i));
  const std::vector<std::string> forward_vars = vars;
  vars.push_back("dy");
  std::vector<std::string> grads;
  grads.reserve(size_t(n));
  for (int i = 0; i < n; ++i) grads.push_back(fmt::format("grad[{}]", i));
  const scalar::NodeId value[] = {expr.value()};
  const std::string value_name[] = {"value"};
  auto indent = [](const std::string& body) {
    std::string out;
    size_t start = 0;
    while (start < body.size()) {
      const size_t end = body.find('\n', start);
      out += "    " + body.substr(start, end - start + 1);
      start = end + 1;
    }
    return out;
  };
  std::string attr_text;
  if (def->user_defined) {
    attr_text = fmt::format(" = {} (user-defined, docs/language.md \"User-defined ops\")",
                            scalar::describe(expr.graph(), expr.value()));
  } else {
    for (const Attr& a : attrs)
      attr_text += fmt::format(", {} = {}", a.name, attr_value_string(a.value));
    attr_text += " (compiler/ir/pointwise_defs.cpp)";
  }
  const std::string type = std::string(functor_name.substr(std::string_view("opfuse::").size()));
  return fmt::format(
      "// The pointwise op {}{}, generated from its definition.\n"
      "#include \"common/scalar_math.cuh\"\n"
      "namespace opfuse {{\n"
      "struct {} {{\n"
      "  static constexpr int kInputs = {};\n"
      "  __device__ __forceinline__ static float forward(const float (&in)[{}]) {{\n"
      "    float value;\n{}"
      "    return value;\n"
      "  }}\n"
      "  __device__ __forceinline__ static void backward(const float (&in)[{}], float dy,\n"
      "                                                  float (&grad)[{}]) {{\n{}"
      "  }}\n"
      "}};\n"
      "}}  // namespace opfuse\n",
      pointwise_op_name(*def, attrs), attr_text, type, n, n,
      indent(expr.graph().cuda(value, forward_vars, value_name)), n, n,
      indent(expr.graph().cuda(expr.gradients(), vars, grads)));
}

}  // namespace opfuse::ir
