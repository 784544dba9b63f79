// The pointwise op definitions: one entry per op (compiler/ir/pointwise_ops.h says what an entry
// holds and what is made from it). The reference forms keep the operation order of the formulas
// they replaced, so the CPU reference stays bit-identical (tests/unit/test_pointwise_ops.cpp
// compares them with a copy of the old formulas).
#include <array>
#include <vector>

#include "ir/pointwise_ops.h"
#include "ir/scalar_code.h"
#include "support/assert.h"

namespace opfuse::ir {

namespace {

using scalar::Cmp;
using scalar::NodeId;

// tanh-approximation GELU constants (TE's gelu and dgelu).
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
constexpr double kQuickGelu = 1.702;

// ---- plain activations: value, with the derivative hinted where the definition gives it ----

// GELU (tanh approximation): reference 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// Device form x * sigmoid(2u) (0.5 (1 + tanh(u)) = sigmoid(2u)): no tanhf in the kernel.
NodeId gelu(scalar::Graph& g, NodeId x, bool device) {
  auto c = [&](double v) { return g.constant(v); };
  if (device) {
    const NodeId x2 = g.mul(x, x);
    const NodeId u = g.mul(g.mul(c(kSqrt2OverPi), x), g.add(c(1), g.mul(c(kGeluCubic), x2)));
    const NodeId s = g.sigmoid(g.mul(c(2), u));
    const NodeId value = g.mul(x, s);
    const NodeId du = g.mul(c(kSqrt2OverPi), g.add(c(1), g.mul(c(3 * kGeluCubic), x2)));
    g.hint_derivative(value, x,
                      g.add(s, g.mul(g.mul(g.mul(g.mul(c(2), x), s), g.sub(c(1), s)), du)));
    return value;
  }
  const NodeId inner =
      g.mul(c(kSqrt2OverPi), g.add(x, g.mul(g.mul(g.mul(c(kGeluCubic), x), x), x)));
  const NodeId t = g.tanh(inner);
  const NodeId value = g.mul(g.mul(c(0.5), x), g.add(c(1), t));
  const NodeId dinner = g.mul(c(kSqrt2OverPi), g.add(c(1), g.mul(g.mul(c(3 * kGeluCubic), x), x)));
  g.hint_derivative(value, x,
                    g.add(g.mul(c(0.5), g.add(c(1), t)),
                          g.mul(g.mul(g.mul(c(0.5), x), g.sub(c(1), g.mul(t, t))), dinner)));
  return value;
}

// Quick GELU: x * sigmoid(1.702 x); d = s + 1.702 x s (1 - s).
NodeId qgelu(scalar::Graph& g, NodeId x) {
  const NodeId s = g.sigmoid(g.mul(g.constant(kQuickGelu), x));
  const NodeId value = g.mul(x, s);
  g.hint_derivative(
      value, x,
      g.add(s, g.mul(g.mul(g.mul(g.constant(kQuickGelu), x), s), g.sub(g.constant(1), s))));
  return value;
}

// ReLU: x > 0 ? x : 0 (NaN -> 0, as TE).
NodeId relu(scalar::Graph& g, NodeId x) {
  const NodeId zero = g.constant(0);
  const NodeId value = g.select(Cmp::Gt, x, zero, x, zero);
  g.hint_derivative(value, x, g.select(Cmp::Gt, x, zero, g.constant(1), zero));
  return value;
}

// SiLU: x * sigmoid(x); d = s (1 + x (1 - s)).
NodeId silu(scalar::Graph& g, NodeId x) {
  const NodeId s = g.sigmoid(x);
  const NodeId value = g.mul(x, s);
  g.hint_derivative(value, x, g.mul(s, g.add(g.constant(1), g.mul(x, g.sub(g.constant(1), s)))));
  return value;
}

// Squared ReLU (TE's srelu): x > 0 ? x^2 : 0; the derivative is derived (x > 0 ? x + x : 0).
NodeId srelu(scalar::Graph& g, NodeId x) {
  const NodeId zero = g.constant(0);
  return g.select(Cmp::Gt, x, zero, g.mul(x, x), zero);
}

// ---- gated: act(gate) * linear -------------------------------------------------------------

template <NodeId (*Act)(scalar::Graph&, NodeId)>
NodeId gated(const PointwiseBuilder& b) {
  return b.g.mul(Act(b.g, b.inputs[0]), b.inputs[1]);
}
template <NodeId (*Act)(scalar::Graph&, NodeId)>
NodeId plain(const PointwiseBuilder& b) {
  return Act(b.g, b.inputs[0]);
}
NodeId gelu_plain(const PointwiseBuilder& b) { return gelu(b.g, b.inputs[0], b.device); }
NodeId geglu(const PointwiseBuilder& b) {
  return b.g.mul(gelu(b.g, b.inputs[0], b.device), b.inputs[1]);
}

// gpt-oss SwiGLU as TE's clamped_swiglu: the gate (first half) clamped to at most `limit`, the
// linear half to [-limit, limit] plus one: min(g, L) sigmoid(alpha min(g, L)) (clamp(l) + 1).
// Derived gradients follow TE's: zero where a clamp is active, passed at the bounds themselves.
NodeId clamped_swiglu(const PointwiseBuilder& b) {
  scalar::Graph& g = b.g;
  const NodeId limit = g.constant(attr_float(b.attrs, "limit"));
  const NodeId alpha = g.constant(attr_float(b.attrs, "alpha"));
  const NodeId gate = g.min(b.inputs[0], limit);
  const NodeId act = g.mul(gate, g.sigmoid(g.mul(alpha, gate)));
  const NodeId linear = g.min(g.max(b.inputs[1], g.neg(limit)), limit);
  return g.mul(act, g.add(linear, g.constant(1)));
}

constexpr double kMaxFloat = 3.4e38;
constexpr AttrSpec kClampedSwigluAttrs[] = {
    {"limit", AttrType::Float, false, 7.0, 0, kMaxFloat,
     "the gate is clamped to at most limit, the linear half to [-limit, limit]"},
    {"alpha", AttrType::Float, false, 1.702, 0, kMaxFloat, "the sigmoid's slope"},
};

constexpr PointwiseDef kGelu{.name = "gelu",
                             .doc = "GELU, tanh approximation",
                             .cublaslt_gelu_epilogue = true,
                             .build = gelu_plain};
constexpr PointwiseDef kQGelu{
    .name = "qgelu", .doc = "quick GELU: x * sigmoid(1.702 x)", .build = plain<qgelu>};
constexpr PointwiseDef kRelu{.name = "relu", .doc = "max(x, 0)", .build = plain<relu>};
constexpr PointwiseDef kSilu{.name = "silu", .doc = "x * sigmoid(x)", .build = plain<silu>};
constexpr PointwiseDef kSrelu{
    .name = "srelu", .doc = "squared ReLU: max(x, 0)^2", .build = plain<srelu>};
constexpr PointwiseDef kSwiglu{
    .name = "swiglu", .gated = true, .doc = "silu(first half) * second half", .build = gated<silu>};
constexpr PointwiseDef kGeglu{
    .name = "geglu", .gated = true, .doc = "gelu(first half) * second half", .build = geglu};
constexpr PointwiseDef kReglu{
    .name = "reglu", .gated = true, .doc = "relu(first half) * second half", .build = gated<relu>};
constexpr PointwiseDef kQGeglu{.name = "qgeglu",
                               .gated = true,
                               .doc = "qgelu(first half) * second half",
                               .build = gated<qgelu>};
constexpr PointwiseDef kSReglu{.name = "sreglu",
                               .gated = true,
                               .doc = "srelu(first half) * second half",
                               .build = gated<srelu>};
constexpr PointwiseDef kClampedSwiglu{
    .name = "clamped_swiglu",
    .gated = true,
    .attrs = kClampedSwigluAttrs,
    .doc =
        "gpt-oss SwiGLU: g = min(first half, limit), g sigmoid(alpha g) (clamp(second half, "
        "-limit, limit) + 1)",
    .build = clamped_swiglu};

// Table order is the order `fusec ops` and docs/language.md list them in.
constexpr std::array<const PointwiseDef*, 11> kDefs = {
    &kGelu,  &kQGelu, &kRelu,   &kSilu,   &kSrelu,         &kSwiglu,
    &kGeglu, &kReglu, &kQGeglu, &kSReglu, &kClampedSwiglu,
};

// ---- the carriers of user-defined ops -----------------------------------------------------

// The value and gradients come decoded from the `expression` attribute, in the form asked for.
NodeId user_defined(const PointwiseBuilder& b) {
  const auto decoded = scalar::decode(attr_name(b.attrs, "expression"));
  const size_t inputs = b.inputs.size();
  // The learned parameters' gradients follow the inputs' (var(inputs + 1 + j) stays itself).
  const size_t params = user_params(user_pointwise_def(false), b.attrs).size();
  const size_t per_form = inputs + 1 + params;
  OPFUSE_ASSERT(decoded && decoded->roots.size() == 2 * per_form,
                "user op '{}': its expression is not {} roots", attr_name(b.attrs, "op"),
                2 * per_form);
  const auto half = std::span(decoded->roots).subspan(b.device ? per_form : 0, per_form);
  const std::vector<NodeId> roots = b.g.copy_from(decoded->graph, half, b.inputs);
  if (b.gradients != nullptr) b.gradients->assign(roots.begin() + 1, roots.end());
  return roots.front();
}

constexpr AttrSpec kUserAttrs[] = {
    {"op", AttrType::Name, true, 0, 0, 0, "the user-defined op's name"},
    {"expression", AttrType::Name, true, 0, 0, 0,
     "its value and gradients, reference and device forms (compiler/ir/scalar_code.h)"},
    {"parts", AttrType::Name, false, 0, 0, 0,
     "a composed chain's ops, name@file:line:col joined by '+' (compiler/passes/"
     "compose_pointwise.h); empty for an op as written"},
    {"params", AttrType::Name, false, 0, 0, 0,
     "its learned parameters, name:dtype:size:init joined by ',' (ir::encode_user_params)"},
};
constexpr PointwiseDef kUserPlain{.name = "user_op",
                                  .attrs = kUserAttrs,
                                  .doc = "a user-defined pointwise op",
                                  .user_defined = true,
                                  .build = user_defined};
constexpr PointwiseDef kUserGated{.name = "user_gated_op",
                                  .gated = true,
                                  .attrs = kUserAttrs,
                                  .doc = "a user-defined gated op",
                                  .user_defined = true,
                                  .build = user_defined};

constexpr std::array<const PointwiseDef*, kDefs.size() + 2> kAllDefs = [] {
  std::array<const PointwiseDef*, kDefs.size() + 2> all{};
  for (size_t i = 0; i < kDefs.size(); ++i) all[i] = kDefs[i];
  all[kDefs.size()] = &kUserPlain;
  all[kDefs.size() + 1] = &kUserGated;
  return all;
}();

}  // namespace

std::span<const PointwiseDef* const> pointwise_defs() { return kDefs; }
std::span<const PointwiseDef* const> all_pointwise_defs() { return kAllDefs; }
const PointwiseDef& user_pointwise_def(bool gated) { return gated ? kUserGated : kUserPlain; }

}  // namespace opfuse::ir
