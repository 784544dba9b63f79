// User-defined ops (docs/language.md, "User-defined ops"): the parser's AST of op definitions,
// every example op of the language's tutorial against hand-written math (forward) and fp64
// finite differences (derived backward), a given backward used as written (also through calls),
// the device form against the reference form, the carriers' functor names and sources, ops from
// an imported library, a user op fusing with its casts like a built-in (structure and fused vs
// unfused in the CPU reference), a user op written like a built-in running bit-identically to it,
// and the kernels of a user-op program compiling with NVRTC.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "dsl/ast.h"
#include "dsl/parser.h"
#include "ir/pointwise_ops.h"
#include "ir/printer.h"
#include "ir/scalar_code.h"
#include "ir/verifier.h"
#include "passes/fusion/patterns.h"
#include "passes/pipeline.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "test_support.h"

namespace opfuse {
namespace {

namespace fs = std::filesystem;

// The ops of the tutorial (docs/language.md, "User-defined ops") and a few more that reach every
// primitive, as a library the tests below use.
constexpr const char* kLibrary = R"(const half = 0.5
op leaky_relu(x, slope: number = 0.01) = select(x > 0, x, slope * x)
op squared_gelu(x) = gelu(x) * gelu(x)
gated op geglu2(a, b) = gelu(a) * b
op softcap(x, cap: number = 30.0) = cap * tanh(x / cap)
  backward(x, dy) = dy * (1 - tanh(x / cap) ^ 2)
op mish(x) = x * tanh(log(1 + exp(x)))
op gelu_erf(x) = half * x * (1 + erf(x / sqrt(2)))
op inverse_root(x) = rsqrt(abs(x) + 1)
op cube(x) = x ^ 3
op soft_abs(x) = (x * x + 1) ^ 0.75 - x ^ -2
op clip(x, lo: number = -1, hi: number = 1) = min(max(x, lo), hi)
op step_times(x) = (x > 0) * x
  backward(x, dy) = select(x > 0, dy, 0)
op leaky_twice(x) = 2 * leaky_relu(x, slope = 0.2)
op softcap_sq(x) = softcap(x, 10) * x
gated op my_swiglu(a, b) = silu(a) * b
gated op capped_glu(a, b, cap: number = 5) = softcap(a, cap) * sigmoid(b)
  backward(a, b, dy) = [dy * sigmoid(b) * (1 - tanh(a / cap) ^ 2), dy * softcap(a, cap) * sigmoid(b) * (1 - sigmoid(b))]
)";

constexpr const char* kSig = "(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64])";

// Runs the whole pipeline, or stops before the fusion passes.
ir::Sequence lower(const std::string& text, bool fuse) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  if (!fuse) options.disabled_passes = {"fuse-forward", "fuse-backward"};
  options.last_stage = driver::Stage::Passes;
  driver::CompileResult result = driver::compile_source("user.fuse", text, sources, diags, options);
  EXPECT_TRUE(result.ok()) << diags.format_all() << text;
  if (!result.ok()) return {};
  EXPECT_TRUE(ir::verify_sequence(result.program.sequences[0]).empty());
  return result.program.sequences[0];
}

ir::Sequence lower_with(const std::string& text, const std::set<std::string>& disabled) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.disabled_passes = disabled;
  options.last_stage = driver::Stage::Passes;
  driver::CompileResult r = driver::compile_source("user.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all();
  if (!r.ok()) return {};
  return r.program.sequences[0];
}

// The forward op of a user-defined op named `name` (in fused groups too).
const ir::Operation* find_user_op(const ir::Sequence& s, std::string_view name) {
  std::function<const ir::Operation*(const std::vector<ir::Operation>&)> search =
      [&](const std::vector<ir::Operation>& ops) -> const ir::Operation* {
    for (const ir::Operation& op : ops) {
      if (ir::is_pointwise(op.kind) && ir::written_op_name(op.kind, op.attrs) == name) return &op;
      if (const ir::Operation* p = search(op.parts)) return p;
    }
    return nullptr;
  };
  return search(s.ops);
}

// The instantiated expression of `use` (a statement such as "softcap(cap = 50)") of the library.
struct Instance {
  ir::Operation op;
  const ir::PointwiseDef* def = nullptr;
};
Instance instance(const std::string& name, const std::string& use, bool gated) {
  const std::string text = fmt::format(
      "{}sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, {}]) "
      "{{\n  {}\n}}\n",
      kLibrary, gated ? 32 : 64, use);
  const ir::Sequence s = lower(text, false);
  const ir::Operation* op = find_user_op(s, name);
  EXPECT_NE(op, nullptr) << name;
  if (op == nullptr) return {};
  return {*op, ir::pointwise_def(op->kind)};
}

struct Eval {
  explicit Eval(const Instance& i, bool device = false)
      : expr(*i.def, i.op.attrs, device), scratch(expr.graph().size()) {}
  double value(std::vector<double> in) { return expr.forward<double>(in, scratch); }
  std::vector<double> grads(std::vector<double> in, double dy) {
    std::vector<double> g(in.size());
    expr.backward<double>(in, dy, g, scratch);
    return g;
  }
  ir::PointwiseExpr expr;
  std::vector<double> scratch;
};

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// Probe points away from the kinks (0 and the clip bounds), where finite differences hold.
const std::vector<double> kProbes = {-3.1, -1.7, -0.45, 0.3, 0.8, 1.6, 2.9};

struct ExampleOp {
  std::string name, use;
  bool gated;
  std::function<double(double, double)> math;  // (x or gate, value half) -> y
};

std::vector<ExampleOp> example_ops() {
  return {
      {"leaky_relu", "leaky_relu(slope = 0.2)", false,
       [](double x, double) { return x > 0 ? x : 0.2 * x; }},
      {"squared_gelu", "squared_gelu()", false,
       [](double x, double) { return gelu_tanh(x) * gelu_tanh(x); }},
      {"geglu2", "geglu2()", true, [](double a, double b) { return gelu_tanh(a) * b; }},
      {"softcap", "softcap(cap = 2.5)", false,
       [](double x, double) { return 2.5 * std::tanh(x / 2.5); }},
      {"mish", "mish()", false,
       [](double x, double) { return x * std::tanh(std::log(1 + std::exp(x))); }},
      {"gelu_erf", "gelu_erf()", false,
       [](double x, double) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {"inverse_root", "inverse_root()", false,
       [](double x, double) { return 1 / std::sqrt(std::abs(x) + 1); }},
      {"cube", "cube()", false, [](double x, double) { return x * x * x; }},
      {"soft_abs", "soft_abs()", false,
       [](double x, double) { return std::pow(x * x + 1, 0.75) - 1 / (x * x); }},
      {"clip", "clip(lo = -0.5, hi = 2)", false,
       [](double x, double) { return std::min(std::max(x, -0.5), 2.0); }},
      {"step_times", "step_times()", false, [](double x, double) { return x > 0 ? x : 0.0; }},
      {"leaky_twice", "leaky_twice()", false,
       [](double x, double) { return 2 * (x > 0 ? x : 0.2 * x); }},
      {"softcap_sq", "softcap_sq()", false,
       [](double x, double) { return 10 * std::tanh(x / 10) * x; }},
      {"my_swiglu", "my_swiglu()", true, [](double a, double b) { return a * sigmoid(a) * b; }},
      {"capped_glu", "capped_glu(cap = 3)", true,
       [](double a, double b) { return 3 * std::tanh(a / 3) * sigmoid(b); }},
  };
}

class UserOpExample : public ::testing::TestWithParam<ExampleOp> {};

TEST_P(UserOpExample, ForwardMatchesHandWrittenMath) {
  const ExampleOp& c = GetParam();
  const Instance inst = instance(c.name, c.use, c.gated);
  ASSERT_NE(inst.def, nullptr);
  EXPECT_EQ(inst.def->gated, c.gated);
  Eval eval(inst);
  for (const double x : kProbes) {
    for (const double v : {-1.3, 0.7}) {
      const std::vector<double> in = c.gated ? std::vector<double>{x, v} : std::vector<double>{x};
      const double want = c.math(x, v);
      EXPECT_NEAR(eval.value(in), want, 1e-12 * std::max(1.0, std::abs(want)))
          << c.name << " at " << x << ", " << v;
      if (!c.gated) break;
    }
  }
}

// The backward (derived, or given where the definition has one) against central differences of
// the hand-written math in fp64, scaled by dy.
TEST_P(UserOpExample, BackwardMatchesFiniteDifferences) {
  const ExampleOp& c = GetParam();
  const Instance inst = instance(c.name, c.use, c.gated);
  ASSERT_NE(inst.def, nullptr);
  Eval eval(inst);
  const double dy = 0.7;
  for (const double x : kProbes) {
    for (const double v : {-1.3, 0.7}) {
      const std::vector<double> in = c.gated ? std::vector<double>{x, v} : std::vector<double>{x};
      const std::vector<double> g = eval.grads(in, dy);
      for (size_t i = 0; i < in.size(); ++i) {
        auto f = [&](double t) {
          std::vector<double> p = in;
          p[i] = t;
          return c.math(p[0], p.size() > 1 ? p[1] : 0.0);
        };
        const double h = 1e-6 * std::max(1.0, std::abs(in[i]));
        const double want = dy * (f(in[i] + h) - f(in[i] - h)) / (2 * h);
        EXPECT_NEAR(g[i], want, 1e-6 * std::max(1.0, std::abs(want)))
            << c.name << " d/d input " << i << " at " << x << ", " << v;
      }
      if (!c.gated) break;
    }
  }
}

// The device form (the CUDA functor's graph) agrees with the reference form in fp64.
TEST_P(UserOpExample, DeviceFormEqualsReferenceForm) {
  const ExampleOp& c = GetParam();
  const Instance inst = instance(c.name, c.use, c.gated);
  ASSERT_NE(inst.def, nullptr);
  Eval reference(inst, false), device(inst, true);
  for (const double x : kProbes) {
    const std::vector<double> in = c.gated ? std::vector<double>{x, 0.4} : std::vector<double>{x};
    EXPECT_NEAR(device.value(in), reference.value(in), 1e-12) << c.name << " at " << x;
    const auto gd = device.grads(in, 1.0), gr = reference.grads(in, 1.0);
    for (size_t i = 0; i < in.size(); ++i)
      EXPECT_NEAR(gd[i], gr[i], 1e-11) << c.name << " input " << i << " at " << x;
  }
}

INSTANTIATE_TEST_SUITE_P(Tutorial, UserOpExample, ::testing::ValuesIn(example_ops()),
                         [](const ::testing::TestParamInfo<ExampleOp>& info) {
                           return info.param.name;
                         });

// ---- backward conventions ------------------------------------------------------------------

TEST(UserOps, AGivenBackwardIsUsedAsWrittenNotDerived) {
  // A deliberately "wrong" backward: the gradient is what the definition says.
  const std::string text = fmt::format(
      "op odd(x) = x * x\n  backward(x, dy) = dy * 5\nsequence s{} {{\n  odd()\n}}\n", kSig);
  const ir::Sequence s = lower(text, false);
  const ir::Operation* op = find_user_op(s, "odd");
  ASSERT_NE(op, nullptr);
  Eval eval({*op, ir::pointwise_def(op->kind)});
  EXPECT_EQ(eval.value({3.0}), 9.0);
  EXPECT_EQ(eval.grads({3.0}, 2.0)[0], 10.0);
  EXPECT_EQ(eval.grads({-7.0}, 1.0)[0], 5.0);
}

TEST(UserOps, ACalleesGivenBackwardIsUsedThroughTheCall) {
  const std::string text = fmt::format(
      "op odd(x) = x * x\n  backward(x, dy) = dy * 5\nop outer(x) = 3 * odd(2 * x)\n"
      "sequence s{} {{\n  outer()\n}}\n",
      kSig);
  const ir::Sequence s = lower(text, false);
  const ir::Operation* op = find_user_op(s, "outer");
  ASSERT_NE(op, nullptr);
  Eval eval({*op, ir::pointwise_def(op->kind)});
  EXPECT_EQ(eval.value({1.5}), 27.0);
  EXPECT_EQ(eval.grads({1.5}, 1.0)[0], 30.0);  // 3 * 5 * 2, not 3 * 2 (2x) * 2 = 36
}

// Relu-like kinks follow TE: relu(x) and select(x > 0, ...) have derivative 0 at 0; min and max
// pass the gradient to their first argument at a tie (TE's clamped_swiglu at its bounds).
TEST(UserOps, KinksTakeTheConventionsOfTE) {
  const std::string text = fmt::format(
      "op r1(x) = relu(x)\nop r2(x) = select(x > 0, x, 0)\nop r3(x) = max(x, 0)\n"
      "op r4(x) = abs(x)\nsequence s{} {{\n  r1()\n  r2()\n  r3()\n  r4()\n}}\n",
      kSig);
  const ir::Sequence s = lower_with(text, {"compose-pointwise"});  // each op on its own
  const std::vector<std::pair<std::string, double>> want = {
      {"r1", 0.0}, {"r2", 0.0}, {"r3", 1.0}, {"r4", 0.0}};
  for (const auto& [name, derivative] : want) {
    const ir::Operation* op = find_user_op(s, name);
    ASSERT_NE(op, nullptr) << name;
    Eval eval({*op, ir::pointwise_def(op->kind)});
    EXPECT_EQ(eval.grads({0.0}, 1.0)[0], derivative) << name;
    EXPECT_EQ(eval.grads({2.0}, 1.0)[0], 1.0) << name;
  }
}

// Under tensor parallelism a gated user op takes each rank's [gate | value] share as swiglu does:
// the column-parallel linear before it cuts its output features as two blocks.
TEST(UserOps, AGatedUserOpSplitsItsProducerLikeABuiltInUnderTensorParallelism) {
  auto fc1_blocks = [](const std::string& act) {
    const std::string text = fmt::format(
        "{}sequence s(x: bf16[tokens / tp, 64]) -> (y: bf16[tokens / tp, 64])\n"
        "    with parallel(tp = 2, sp = true) {{\n"
        "  layernorm(64)\n  linear(64, 256, bias = false, parallel = column) as fc1\n  {}()\n"
        "  linear(128, 64, bias = false, parallel = row) as fc2\n}}\n",
        kLibrary, act);
    const ir::Sequence s = lower(text, false);
    for (const ir::ValueId p : s.params)
      if (s.value(p).name == "fc1.weight") return s.value(p).shard.blocks;
    return -1;
  };
  EXPECT_EQ(fc1_blocks("swiglu"), 2);
  EXPECT_EQ(fc1_blocks("my_swiglu"), 2);
}

// ---- the carriers ----------------------------------------------------------------------------

TEST(UserOps, CarriersAreNotOpsAProgramCanName) {
  EXPECT_EQ(ir::find_op("user_op"), nullptr);
  EXPECT_EQ(ir::find_op("user_gated_op"), nullptr);
  EXPECT_EQ(ir::find_pointwise("user_op"), nullptr);
  for (const ir::OpInfo& info : ir::all_ops())
    EXPECT_TRUE(info.pointwise == nullptr || !info.pointwise->user_defined) << info.name;
  EXPECT_EQ(ir::all_pointwise_defs().size(), ir::pointwise_defs().size() + 2);
  EXPECT_TRUE(ir::is_pointwise(ir::pointwise_kind(ir::user_pointwise_def(true))));
  EXPECT_TRUE(
      ir::is_pointwise_backward(ir::pointwise_backward_kind(ir::user_pointwise_def(false))));
}

TEST(UserOps, FunctorNameGivesTheFunctorSource) {
  const Instance inst = instance("softcap", "softcap(cap = 50)", false);
  ASSERT_NE(inst.def, nullptr);
  const std::string name = ir::pointwise_functor_name(*inst.def, inst.op.attrs);
  EXPECT_TRUE(name.starts_with("opfuse::pointwise_user_7_softcap_")) << name;
  const auto source = ir::pointwise_functor_source(name);
  ASSERT_TRUE(source.has_value());
  EXPECT_TRUE(test::contains(*source, "struct " + name.substr(8) + " {")) << *source;
  EXPECT_TRUE(test::contains(*source, "The pointwise op softcap = 50 * tanh(x / 50)")) << *source;
  EXPECT_TRUE(test::contains(*source, "tanhf(")) << *source;
  EXPECT_TRUE(test::contains(*source, "static constexpr int kInputs = 1;")) << *source;
  // A damaged name is refused, never trusted.
  EXPECT_FALSE(ir::pointwise_functor_source(name.substr(0, name.size() - 3)).has_value());
  EXPECT_FALSE(ir::pointwise_functor_source("opfuse::pointwise_user_99_softcap_v0").has_value());
  // Gated: two inputs.
  const Instance gated = instance("geglu2", "geglu2()", true);
  ASSERT_NE(gated.def, nullptr);
  const auto gated_source =
      ir::pointwise_functor_source(ir::pointwise_functor_name(*gated.def, gated.op.attrs));
  ASSERT_TRUE(gated_source.has_value());
  EXPECT_TRUE(test::contains(*gated_source, "static constexpr int kInputs = 2;"));
  EXPECT_TRUE(test::contains(*gated_source, "grad[1] = ")) << *gated_source;
}

TEST(UserOps, EncodedRootsRoundTrip) {
  ir::scalar::Graph g;
  const auto x = g.var(0), dy = g.var(1);
  const auto v = g.pow(g.add(g.abs(g.log(x)), g.erf(g.sqrt(x))), g.rsqrt(x));
  const auto s = g.select(ir::scalar::Cmp::Eq, x, g.constant(1), v, x);
  const ir::scalar::NodeId roots[] = {s, g.mul(g.derivative(s, 0), dy)};
  const std::string text = ir::scalar::encode_roots(g, roots);
  const auto d = ir::scalar::decode(text);
  ASSERT_TRUE(d.has_value()) << text;
  ASSERT_EQ(d->roots.size(), 2u);
  EXPECT_EQ(ir::scalar::encode_roots(d->graph, d->roots), text);
  EXPECT_FALSE(ir::scalar::decode(text + "x9999"));  // a root past the nodes
}

// ---- in programs ------------------------------------------------------------------------------

TEST(UserOps, PrintedIrNamesTheOpAndItsValue) {
  const ir::Sequence s =
      lower(fmt::format("{}sequence s{} {{\n  softcap(cap = 50)\n}}\n", kLibrary, kSig), false);
  const std::string text = ir::print_sequence(s, nullptr);
  EXPECT_TRUE(test::contains(text, "= softcap(%x) {value = 50 * tanh(x / 50)} as \"softcap_0\""))
      << text;
  EXPECT_TRUE(test::contains(text, "activation_backward(%dy, %x) {activation = softcap, value = "))
      << text;
}

TEST(UserOps, OpsComeFromAnImportedLibrary) {
  const std::string dir = test::make_temp_dir("user-ops-import");
  std::ofstream(dir + "/ops.fuse") << kLibrary;
  std::ofstream(dir + "/main.fuse")
      << "import \"ops.fuse\"\nsequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 32]) {\n"
         "  linear(64, 64)\n  softcap(cap = 50)\n  geglu2()\n}\n";
  const auto r =
      test::run_command(test::fusec_path() + " ir " + test::shell_quoted(dir + "/main.fuse"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The two compose into one op (compiler/passes/compose_pointwise.h).
  EXPECT_TRUE(test::contains(r.output, "= softcap+geglu2(%0) {value = ")) << r.output;
}

// A gated op written like the built-in swiglu runs bit-identically to it on the CPU reference:
// the same expression, so the same operations in the same order, forward and backward.
TEST(UserOps, AUserSwigluRunsBitIdenticallyToTheBuiltIn) {
  auto run = [](const std::string& act) {
    const std::string text = fmt::format(
        "{}recipe fp8 = delayed_scaling(amax_history = 4)\n"
        "sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {{\n"
        "  rmsnorm(64)\n  linear(64, 256, bias = false)\n  {}()\n  linear(128, 64)\n}}\n",
        kLibrary, act);
    const ir::Sequence s = lower(text, true);
    cpu::ReferenceExecutor<float> exec(s, {{"tokens", 32}});
    cpu::init_params_from_seed(exec, 3);
    const auto out = exec.forward({cpu::seeded_normal(exec.input_shapes()[0], 1, 1.0)});
    const auto grads = exec.backward({cpu::seeded_normal(exec.output_shapes()[0], 2, 1e-2)});
    std::vector<float> all = out[0].data;
    for (const auto& g : grads.inputs) all.insert(all.end(), g.data.begin(), g.data.end());
    for (const auto& g : grads.params) all.insert(all.end(), g.data.begin(), g.data.end());
    return all;
  };
  const std::vector<float> builtin = run("swiglu"), user = run("my_swiglu");
  ASSERT_EQ(builtin.size(), user.size());
  EXPECT_TRUE(builtin == user);
  // And a different op really differs (the comparison can fail).
  EXPECT_FALSE(run("geglu2") == builtin);
}

// A user op between two linears fuses with its casts exactly like a built-in activation:
// activation_cast forward, dact_cast backward; fused and unfused agree within FP8 rounding.
TEST(UserOps, FusesWithItsCastsLikeABuiltInAndAgreesUnfused) {
  const std::string text = fmt::format(
      "{}recipe fp8 = delayed_scaling(amax_history = 4)\n"
      "sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {{\n"
      "  layernorm(64)\n  linear(64, 128) as up\n  softcap(cap = 4)\n  linear(128, 64) as down\n"
      "}}\n",
      kLibrary);
  const ir::Sequence fused = lower(text, true), unfused = lower(text, false);
  auto patterns = [](const ir::Sequence& s) {
    std::vector<std::string> out;
    for (const ir::Operation& op : s.ops) {
      if (op.kind != ir::OpKind::Fused) continue;
      bool has_user = false;
      for (const ir::Operation& p : op.parts)
        has_user |= ir::pointwise_def(p.kind) != nullptr && ir::pointwise_def(p.kind)->user_defined;
      if (has_user) out.push_back(ir::attr_name(op.attrs, "pattern"));
    }
    return out;
  };
  EXPECT_EQ(patterns(fused), (std::vector<std::string>{"activation_cast", "dact_cast"}));
  EXPECT_TRUE(patterns(unfused).empty());
  auto run = [](const ir::Sequence& s) {
    cpu::ReferenceExecutor<float> exec(s, {{"tokens", 48}});
    cpu::init_params_from_seed(exec, 3);
    const auto out = exec.forward({cpu::seeded_normal(exec.input_shapes()[0], 1, 1.0)});
    const auto grads = exec.backward({cpu::seeded_normal(exec.output_shapes()[0], 2, 1e-2)});
    return std::make_pair(out[0], grads.inputs[0]);
  };
  const auto a = run(fused), b = run(unfused);
  auto relative = [](const cpu::Tensor<float>& x, const cpu::Tensor<float>& y) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < x.data.size(); ++i) {
      diff += std::pow(double(x.data[i]) - double(y.data[i]), 2);
      norm += std::pow(double(y.data[i]), 2);
    }
    return std::sqrt(diff / norm);
  };
  EXPECT_LT(relative(a.first, b.first), 6e-2);
  EXPECT_LT(relative(a.second, b.second), 6e-2);
}

// ---- automatic fusion of pointwise chains (compiler/passes/compose_pointwise.h) ----------------

int count_ops(const ir::Sequence& s, bool (*is)(ir::OpKind)) {
  int n = 0;
  for (const ir::Operation& op : s.ops) {
    n += is(op.kind) ? 1 : 0;
    for (const ir::Operation& p : op.parts) n += is(p.kind) ? 1 : 0;
  }
  return n;
}

std::string chain_program(const char* recipe, const std::string& chain, int out) {
  return fmt::format(
      "{}recipe fp8 = {}\n"
      "sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {{\n"
      "  layernorm(64)\n  linear(64, 128) as up\n{}  linear({}, 64) as down\n}}\n",
      kLibrary, recipe, chain, out);
}

TEST(PointwiseChains, FiveOpsBetweenTwoGemmsBecomeOneKernelEachWay) {
  const std::string text = chain_program(
      "delayed_scaling(amax_history = 4)",
      "  softcap(cap = 4)\n  leaky_relu()\n  mish()\n  gelu()\n  squared_gelu()\n", 128);
  const ir::Sequence composed = lower(text, true);
  EXPECT_EQ(count_ops(composed, ir::is_pointwise), 1);
  EXPECT_EQ(count_ops(composed, ir::is_pointwise_backward), 1);
  const ir::Operation* op = find_user_op(composed, "softcap+leaky_relu+mish+gelu+squared_gelu");
  ASSERT_NE(op, nullptr) << ir::print_sequence(composed, nullptr);
  // ... fused with the FP8 cast of the next GEMM's input, and its backward with the gradient's.
  bool forward_cast = false, backward_cast = false;
  for (const ir::Operation& f : composed.ops) {
    if (f.kind != ir::OpKind::Fused) continue;
    const std::string& pattern = ir::attr_name(f.attrs, "pattern");
    for (const ir::Operation& p : f.parts) {
      forward_cast |= ir::is_pointwise(p.kind) && pattern == "activation_cast";
      backward_cast |= ir::is_pointwise_backward(p.kind) && pattern == "dact_cast";
    }
  }
  EXPECT_TRUE(forward_cast);
  EXPECT_TRUE(backward_cast);
  // Without the pass: five of each.
  const ir::Sequence plain = lower_with(text, {"compose-pointwise"});
  EXPECT_EQ(count_ops(plain, ir::is_pointwise), 5);
  EXPECT_EQ(count_ops(plain, ir::is_pointwise_backward), 5);
}

// The composed op computes the chain: its value and gradients against the ops one by one.
TEST(PointwiseChains, TheComposedExpressionIsTheChain) {
  const std::string text =
      chain_program("bf16()", "  leaky_relu(0.2)\n  geglu2()\n  softcap(cap = 3)\n", 64);
  const ir::Sequence s = lower(text, true);
  EXPECT_EQ(count_ops(s, ir::is_pointwise), 1);
  const ir::Operation* op = find_user_op(s, "leaky_relu+geglu2+softcap");
  ASSERT_NE(op, nullptr) << ir::print_sequence(s, nullptr);
  Eval eval({*op, ir::pointwise_def(op->kind)});
  auto leaky = [](double x) { return x > 0 ? x : 0.2 * x; };
  auto math = [&](double a, double b) { return 3 * std::tanh(gelu_tanh(leaky(a)) * leaky(b) / 3); };
  for (const double a : kProbes) {
    for (const double b : {-1.1, 0.6}) {
      EXPECT_NEAR(eval.value({a, b}), math(a, b), 1e-12);
      const auto g = eval.grads({a, b}, 1.0);
      const double h = 1e-6;
      EXPECT_NEAR(g[0], (math(a + h, b) - math(a - h, b)) / (2 * h), 1e-6) << a << ", " << b;
      EXPECT_NEAR(g[1], (math(a, b + h) - math(a, b - h)) / (2 * h), 1e-6) << a << ", " << b;
    }
  }
}

// Composed and one-by-one runs agree on the CPU reference within the bf16 roundings the
// composition drops between the ops (and really differ: those roundings are gone).
TEST(PointwiseChains, ComposedAndUncomposedAgreeOnTheReference) {
  const std::string text = chain_program(
      "bf16()", "  softcap(cap = 4)\n  mish()\n  leaky_relu(0.1)\n  squared_gelu()\n", 128);
  auto run = [&](bool compose) {
    const ir::Sequence s = compose ? lower_with(text, {}) : lower_with(text, {"compose-pointwise"});
    cpu::ReferenceExecutor<float> exec(s, {{"tokens", 48}});
    cpu::init_params_from_seed(exec, 3);
    const auto out = exec.forward({cpu::seeded_normal(exec.input_shapes()[0], 1, 1.0)});
    const auto grads = exec.backward({cpu::seeded_normal(exec.output_shapes()[0], 2, 1e-2)});
    std::vector<float> all = out[0].data;
    for (const auto& g : grads.inputs) all.insert(all.end(), g.data.begin(), g.data.end());
    for (const auto& g : grads.params) all.insert(all.end(), g.data.begin(), g.data.end());
    return all;
  };
  const std::vector<float> a = run(true), b = run(false);
  ASSERT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += std::pow(double(a[i]) - double(b[i]), 2);
    norm += std::pow(double(b[i]), 2);
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-2);
  EXPECT_FALSE(a == b);
}

TEST(PointwiseChains, DumpedKernelShowsTheComposedExpressionAndItsLine) {
  const std::string dir = test::make_temp_dir("user-ops-chain");
  std::ofstream(dir + "/chain.fuse")
      << chain_program("bf16()", "  softcap(cap = 4)\n  leaky_relu(0.1)\n", 128);
  const auto r = test::run_command(test::fusec_path() + " dump-kernels " +
                                   test::shell_quoted(dir + "/chain.fuse") + " -o " +
                                   test::shell_quoted(dir + "/out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string forward;
  for (const auto& e : fs::directory_iterator(dir + "/out/kernels")) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("activation_fwd_user_softcap_leaky_relu"))
      forward = test::read_text(e.path().string());
  }
  ASSERT_FALSE(forward.empty()) << r.output;
  // Each op of the chain with its line (the library takes 19 lines, the recipe one, the
  // sequence's header, layernorm and linear three more: softcap is on line 24).
  EXPECT_TRUE(test::contains(forward,
                             "//     softcap \"softcap_0\" (chain.fuse:24)\n"
                             "//     leaky_relu \"softcap_0\" (chain.fuse:25)\n"))
      << forward;
  EXPECT_TRUE(test::contains(forward, "4 * tanh(x / 4) > 0 ? 4 * tanh(x / 4) : 0.1 * 4 * tanh"))
      << forward;
}

// ---- the front end -----------------------------------------------------------------------------

TEST(UserOps, ParserDumpsOpDefinitions) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  const FileId file = sources.add_buffer(
      "t.fuse",
      "op f(x, k: number = 2, m: number) = -x ^ 2 * select(x <= k, exp(x), max(x, m))\n"
      "  backward(x, dy) = dy * (x != 0)\n"
      "gated op g(a, b) = a * b backward(a, b, dy) = [dy * b, dy * a]\n");
  const auto module = dsl::parse_module(file, sources, diags);
  ASSERT_FALSE(diags.has_errors()) << diags.format_all();
  EXPECT_EQ(dsl::dump_ast(*module),
            "op f @1:4\n"
            "  input x @1:6\n"
            "  attr k = 2 @1:9\n"
            "  attr m @1:24\n"
            "  = (* (- (^ x 2)) select((<= x k), exp(x), max(x, m)))\n"
            "  backward @2:3\n"
            "    input x @2:12\n"
            "    input dy @2:15\n"
            "    = (* dy (!= x 0))\n"
            "gated op g @3:10\n"
            "  input a @3:12\n"
            "  input b @3:15\n"
            "  = (* a b)\n"
            "  backward @3:26\n"
            "    input a @3:35\n"
            "    input b @3:38\n"
            "    input dy @3:41\n"
            "    = [(* dy b), (* dy a)]\n");
}

// `op`, `gated` and `backward` stay ordinary names elsewhere (quantize's backward attribute).
TEST(UserOps, TheNewWordsAreNotReserved) {
  const std::string text = fmt::format(
      "const op = 2\nsequence s{} {{\n  quantize(backward = true) as gated\n}}\n", kSig);
  const ir::Sequence s = lower(text, false);
  EXPECT_FALSE(s.ops.empty());
}

// The kernels of a user-op program compile with NVRTC (no GPU needed): the generated functors
// of plain and gated user ops in forward, backward and FP8-cast kernels.
TEST(UserOps, KernelsCompileWithNvrtc) {
  const std::string dir = test::make_temp_dir("user-ops-build");
  const auto r = test::run_command(
      "OPFUSE_CACHE_DIR=" + test::shell_quoted(dir + "/cache") + " " + test::fusec_path() +
      " build " + test::shell_quoted(test::source_path("dsl_examples/gemma_block.fuse")) + " -o " +
      test::shell_quoted(dir + "/out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t user_cubins = 0;
  for (const auto& e : fs::directory_iterator(dir + "/out/kernels")) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".cubin" && test::contains(name, "_user_")) ++user_cubins;
  }
  EXPECT_GE(user_cubins, 4u) << "forward and backward kernels of softcap and geglu_tanh";
}

}  // namespace
}  // namespace opfuse
