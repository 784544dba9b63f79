// Pointwise op definitions (compiler/ir/pointwise_ops.h): the CPU evaluation is bit-identical to
// the formulas the reference used before the definitions existed (a copy of them is below), the
// device forms equal the reference forms, derived derivatives match finite differences, the
// scalar graph shares common subexpressions, and the generated CUDA functors use only the fast
// device primitives.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ir/pointwise_ops.h"

namespace opfuse::ir {
namespace {

// ---- the formulas of reference/reference_ops.cpp before the definitions, verbatim ----------
namespace old {
enum class Activation { GELU, QGELU, ReLU, SiLU };
template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
constexpr double kQuickGelu = 1.702;
template <typename T>
T activation(Activation kind, T x) {
  switch (kind) {
    case Activation::GELU: {
      const T inner = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
      return T(0.5) * x * (T(1) + std::tanh(inner));
    }
    case Activation::QGELU:
      return x * sigmoid(T(kQuickGelu) * x);
    case Activation::ReLU:
      return x > T(0) ? x : T(0);
    case Activation::SiLU:
      return x * sigmoid(x);
  }
  return x;
}
template <typename T>
T activation_derivative(Activation kind, T x) {
  switch (kind) {
    case Activation::GELU: {
      const T inner = T(kSqrt2OverPi) * (x + T(kGeluCubic) * x * x * x);
      const T t = std::tanh(inner);
      const T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner;
    }
    case Activation::QGELU: {
      const T s = sigmoid(T(kQuickGelu) * x);
      return s + T(kQuickGelu) * x * s * (T(1) - s);
    }
    case Activation::ReLU:
      return x > T(0) ? T(1) : T(0);
    case Activation::SiLU: {
      const T s = sigmoid(x);
      return s * (T(1) + x * (T(1) - s));
    }
  }
  return T(1);
}
}  // namespace old

// Inputs that reach every branch: zeros of both signs, tiny, ordinary, large enough to saturate
// exp and tanh, the largest floats, infinities, NaN, and random values.
template <typename T>
std::vector<T> probe_values() {
  std::vector<T> v = {T(0),
                      -T(0),
                      T(1e-30),
                      T(-1e-30),
                      T(1),
                      T(-1),
                      T(0.5),
                      T(-3.7),
                      T(3.7),
                      T(20),
                      T(-20),
                      T(88.7),
                      T(-88.7),
                      T(1e4),
                      T(-1e4),
                      T(3e38),
                      T(-3e38),
                      std::numeric_limits<T>::infinity(),
                      -std::numeric_limits<T>::infinity(),
                      std::numeric_limits<T>::quiet_NaN()};
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 4.0);
  for (int i = 0; i < 400; ++i) v.push_back(T(normal(rng)));
  return v;
}

// Same bits, or both NaN (a NaN's payload is not part of the formulas' meaning).
template <typename T>
bool same(T a, T b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::bit_cast<std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>(a) ==
         std::bit_cast<std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>(b);
}

struct Evaluator {
  explicit Evaluator(std::string_view name, const AttrList& attrs = {}, bool device = false)
      : expr(*find_pointwise(name), attrs, device),
        scratch_f(expr.graph().size()),
        scratch_d(expr.graph().size()) {}
  template <typename T>
  T value(std::vector<T> in) {
    return expr.forward<T>(in, scratch<T>());
  }
  template <typename T>
  std::vector<T> grads(std::vector<T> in, T dy) {
    std::vector<T> g(in.size());
    expr.backward<T>(in, dy, g, scratch<T>());
    return g;
  }
  template <typename T>
  std::span<T> scratch() {
    if constexpr (std::is_same_v<T, float>)
      return scratch_f;
    else
      return scratch_d;
  }
  PointwiseExpr expr;
  std::vector<float> scratch_f;
  std::vector<double> scratch_d;
};

template <typename T>
void expect_bit_identical_to_old_formulas() {
  const std::vector<std::pair<std::string_view, old::Activation>> plain = {
      {"gelu", old::Activation::GELU},
      {"qgelu", old::Activation::QGELU},
      {"relu", old::Activation::ReLU},
      {"silu", old::Activation::SiLU}};
  const std::vector<std::pair<std::string_view, old::Activation>> gated = {
      {"geglu", old::Activation::GELU},
      {"qgeglu", old::Activation::QGELU},
      {"reglu", old::Activation::ReLU},
      {"swiglu", old::Activation::SiLU}};
  const std::vector<T> xs = probe_values<T>();
  const T dy = T(-1.375);
  for (const auto& [name, kind] : plain) {
    Evaluator e(name);
    for (T x : xs) {
      EXPECT_TRUE(same(e.value<T>({x}), old::activation(kind, x))) << name << "(" << x << ")";
      // old backward: activation_derivative(act, x) * dy
      EXPECT_TRUE(same(e.grads<T>({x}, dy)[0], old::activation_derivative(kind, x) * dy))
          << name << "'(" << x << ")";
    }
  }
  for (const auto& [name, kind] : gated) {
    Evaluator e(name);
    for (size_t i = 0; i < xs.size(); ++i) {
      const T a = xs[i], b = xs[(i * 7 + 3) % xs.size()];
      // old gated_forward: act(a) * b; gated_backward: act'(a) * b * dy and act(a) * dy.
      EXPECT_TRUE(same(e.value<T>({a, b}), old::activation(kind, a) * b)) << name << a << b;
      const std::vector<T> g = e.grads<T>({a, b}, dy);
      EXPECT_TRUE(same(g[0], old::activation_derivative(kind, a) * b * dy)) << name << a << b;
      EXPECT_TRUE(same(g[1], old::activation(kind, a) * dy)) << name << a << b;
    }
  }
}

TEST(PointwiseOps, ReferenceIsBitIdenticalToTheOldFormulasInFloat) {
  expect_bit_identical_to_old_formulas<float>();
}

TEST(PointwiseOps, ReferenceIsBitIdenticalToTheOldFormulasInDouble) {
  expect_bit_identical_to_old_formulas<double>();
}

// GELU's device form x * sigmoid(2u) equals its reference form 0.5 x (1 + tanh(u)), value and
// derivative, in double; the other ops' device forms are their reference forms.
TEST(PointwiseOps, DeviceFormsEqualReferenceFormsInDouble) {
  for (const PointwiseDef* def : pointwise_defs()) {
    AttrList attrs;
    for (const AttrSpec& spec : def->attrs)
      attrs.push_back({std::string(spec.name), spec.default_value});
    Evaluator reference(def->name, attrs, false), device(def->name, attrs, true);
    std::mt19937_64 rng(11);
    std::normal_distribution<double> normal(0.0, 3.0);
    for (int i = 0; i < 300; ++i) {
      std::vector<double> in = {normal(rng)};
      if (def->gated) in.push_back(normal(rng));
      const double want = reference.value<double>(in), got = device.value<double>(in);
      EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, std::fabs(want))) << def->name;
      const auto gw = reference.grads<double>(in, 1.0), gd = device.grads<double>(in, 1.0);
      for (size_t k = 0; k < gw.size(); ++k)
        EXPECT_NEAR(gd[k], gw[k], 1e-12 * std::max(1.0, std::fabs(gw[k]))) << def->name << k;
    }
  }
}

// Every op's gradients (given or derived) against central differences of its value, in double.
TEST(PointwiseOps, GradientsMatchFiniteDifferences) {
  for (const PointwiseDef* def : pointwise_defs()) {
    AttrList attrs;
    for (const AttrSpec& spec : def->attrs)
      attrs.push_back({std::string(spec.name), spec.default_value});
    // clamped_swiglu with limit 7: the normal(0, 5) inputs cross both clamps.
    Evaluator e(def->name, attrs);
    std::mt19937_64 rng(3);
    std::normal_distribution<double> normal(0.0, 5.0);
    const double h = 1e-6;
    for (int i = 0; i < 300; ++i) {
      std::vector<double> in = {normal(rng)};
      if (def->gated) in.push_back(normal(rng));
      const auto g = e.grads<double>(in, 1.0);
      for (size_t k = 0; k < in.size(); ++k) {
        if (std::fabs(std::fabs(in[k]) - 7.0) < 1e-3 || std::fabs(in[k]) < 1e-3) continue;  // kinks
        std::vector<double> up = in, down = in;
        up[k] += h;
        down[k] -= h;
        const double numeric = (e.value<double>(up) - e.value<double>(down)) / (2 * h);
        EXPECT_NEAR(g[k], numeric, 1e-6 * std::max(1.0, std::fabs(numeric)))
            << def->name << " input " << k << " at " << in[0] << ", " << in.back();
      }
    }
  }
}

TEST(PointwiseOps, QuickGegluGatesWithQuickGelu) {
  Evaluator qgeglu("qgeglu");
  const double s = 1 / (1 + std::exp(-1.702 * 0.5));
  EXPECT_NEAR(qgeglu.value<double>({0.5, 4.0}), 0.5 * s * 4.0, 1e-15);
}

// TE's clamped_swiglu (gpt-oss): gate min(g, limit), linear clamp(l, -limit, limit) + 1; the
// gradient is zero where a clamp is active and passes at the bounds themselves.
TEST(PointwiseOps, ClampedSwigluFollowsTransformerEngine) {
  const AttrList attrs = {{"limit", 2.0}, {"alpha", 1.5}};
  Evaluator e("clamped_swiglu", attrs);
  auto sig = [](double z) { return 1 / (1 + std::exp(-z)); };
  // Inside both clamps: g sigmoid(alpha g) (l + 1).
  EXPECT_NEAR(e.value<double>({1.0, 0.5}), 1.0 * sig(1.5) * 1.5, 1e-15);
  // Gate above the limit uses the limit; linear beyond +-limit uses +-limit.
  EXPECT_NEAR(e.value<double>({5.0, 9.0}), 2.0 * sig(3.0) * 3.0, 1e-15);
  EXPECT_NEAR(e.value<double>({-1.0, -9.0}), -1.0 * sig(-1.5) * -1.0, 1e-15);
  // A gate far below is not clamped (only at most limit).
  EXPECT_NEAR(e.value<double>({-5.0, 0.0}), -5.0 * sig(-7.5), 1e-15);
  const auto clamped = e.grads<double>({5.0, 9.0}, 1.0);
  EXPECT_EQ(clamped[0], 0.0);
  EXPECT_EQ(clamped[1], 0.0);
  const auto at_bounds = e.grads<double>({2.0, -2.0}, 1.0);
  const double s = sig(3.0);
  EXPECT_NEAR(at_bounds[0], (s + 1.5 * 2.0 * s * (1 - s)) * (-2.0 + 1), 1e-12);
  EXPECT_NEAR(at_bounds[1], 2.0 * s, 1e-12);
}

TEST(ScalarExpr, EqualNodesAreOneNode) {
  scalar::Graph g;
  const scalar::NodeId x = g.var(0);
  const scalar::NodeId a = g.sigmoid(g.mul(g.constant(2), x));
  const size_t size = g.size();
  EXPECT_EQ(g.sigmoid(g.mul(g.constant(2), x)), a);
  EXPECT_EQ(g.size(), size);
  EXPECT_NE(g.sigmoid(g.mul(x, g.constant(2))), a);  // operand order is part of the node
}

// The backward of swiglu needs sigmoid(gate) once, shared with the value; the device code
// divides and exponentiates with the fast intrinsics only (the kernels stay memory-bound).
TEST(PointwiseFunctors, ShareSubexpressionsAndUseFastPrimitives) {
  const std::string name = pointwise_functor_name(*find_pointwise("swiglu"), {});
  EXPECT_EQ(name, "opfuse::pointwise_swiglu");
  const std::string swiglu = *pointwise_functor_source(name);
  const std::string backward = swiglu.substr(swiglu.find("backward("));
  size_t sigmoids = 0;
  for (size_t at = backward.find("opfuse::sigmoid("); at != std::string::npos;
       at = backward.find("opfuse::sigmoid(", at + 1))
    ++sigmoids;
  EXPECT_EQ(sigmoids, 1u) << swiglu;
  for (const PointwiseDef* def : pointwise_defs()) {
    AttrList attrs;
    for (const AttrSpec& spec : def->attrs)
      attrs.push_back({std::string(spec.name), spec.default_value});
    const std::string source = *pointwise_functor_source(pointwise_functor_name(*def, attrs));
    EXPECT_EQ(source.find("tanhf("), std::string::npos) << source;
    EXPECT_EQ(source.find(" / "), std::string::npos) << source;
    for (size_t at = source.find("expf("); at != std::string::npos;
         at = source.find("expf(", at + 1))
      EXPECT_EQ(source.substr(at - 2, 2), "__") << source;
    EXPECT_NE(source.find("static constexpr int kInputs = " + std::to_string(def->gated ? 2 : 1)),
              std::string::npos)
        << source;
  }
}

// Attribute values are spelled into the functor name and read back from it.
TEST(PointwiseFunctors, AttributesRoundTripThroughTheName) {
  const PointwiseDef& def = *find_pointwise("clamped_swiglu");
  const std::string name = pointwise_functor_name(def, {{"limit", 7.0}, {"alpha", 1.702}});
  EXPECT_EQ(name, "opfuse::pointwise_clamped_swiglu_limit_7_alpha_1p702");
  const auto source = pointwise_functor_source(name);
  ASSERT_TRUE(source.has_value());
  EXPECT_NE(source->find("clamped_swiglu, limit = 7, alpha = 1.702"), std::string::npos) << *source;
  EXPECT_NE(source->find("1.702f"), std::string::npos) << *source;
  EXPECT_NE(source->find("7.0f"), std::string::npos) << *source;
  const std::string small = pointwise_functor_name(def, {{"limit", 0.25}, {"alpha", 1e-05}});
  EXPECT_EQ(small, "opfuse::pointwise_clamped_swiglu_limit_0p25_alpha_1em05");
  EXPECT_TRUE(pointwise_functor_source(small).has_value());
  EXPECT_FALSE(pointwise_functor_source("opfuse::pointwise_clamped_swiglu").has_value());
  EXPECT_FALSE(pointwise_functor_source("opfuse::pointwise_gelu_limit_1").has_value());
  EXPECT_FALSE(pointwise_functor_source("opfuse::Gelu").has_value());
}

}  // namespace
}  // namespace opfuse::ir
