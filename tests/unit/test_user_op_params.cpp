// Learned parameters of user-defined ops (docs/language.md, "User-defined ops", `params(...)`):
// the parser's AST, the IR parameters each use creates (names, shapes, start values), the CPU
// reference's forward against hand-written math, the derived backward (input and parameter
// gradients) against fp64 finite differences, a given backward's parameter gradients used as
// written, SGD training moving a parameter as SGD says, compose-pointwise leaving such an op on
// its own, the functor's name and source, and the kernels compiling with NVRTC.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "dsl/ast.h"
#include "dsl/parser.h"
#include "ir/pointwise_ops.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "test_support.h"

namespace opfuse {
namespace {

namespace fs = std::filesystem;

constexpr const char* kOps = R"(const features = 8
op learnable_scale(x) params(scale: fp32[] = 1.0) = scale * x
op affine(x) params(w: fp32[features] = 1.0, b: fp32[8] = 0.0) = w * x + b
op scaled_tanh(x, k: number = 2) params(a: fp32[] = 0.5, w: fp32[8] = 1.5) = a * tanh(w * x / k)
gated op gated_scale(g, v) params(s: fp32[4] = 0.25) = s * silu(g) * v
op given_scale(x) params(scale: fp32[] = 1.0) = scale * x
  backward(x, dy) = [scale * dy, 3 * x * dy]
)";

ir::Sequence lower(const std::string& text, const std::set<std::string>& disabled = {}) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.disabled_passes = disabled;
  options.last_stage = driver::Stage::Passes;
  driver::CompileResult r = driver::compile_source("params.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all() << text;
  if (!r.ok()) return {};
  EXPECT_TRUE(ir::verify_sequence(r.program.sequences[0]).empty());
  return r.program.sequences[0];
}

// One use of `op` in a bf16-recipe fp32 sequence of 8 features (4 after a gated op).
std::string program(const std::string& op, bool gated = false) {
  return fmt::format(
      "{}sequence s(x: fp32[tokens, 8]) -> (y: fp32[tokens, {}]) uses bf16 {{\n  {}\n}}\n", kOps,
      gated ? 4 : 8, op);
}

const ir::Value* param_named(const ir::Sequence& s, std::string_view name) {
  for (const ir::ValueId v : s.params)
    if (s.value(v).name == name) return &s.value(v);
  return nullptr;
}

// ---- the front end and the IR ------------------------------------------------------------------

TEST(UserOpParams, ParserDumpsParams) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  const FileId file = sources.add_buffer(
      "t.fuse", "op f(x, k: number = 2) params(s: fp32[] = 1.0, w: bf16[64] = -0.5,) = s * x\n");
  const auto module = dsl::parse_module(file, sources, diags);
  ASSERT_FALSE(diags.has_errors()) << diags.format_all();
  EXPECT_EQ(dsl::dump_ast(*module),
            "op f @1:4\n"
            "  input x @1:6\n"
            "  attr k = 2 @1:9\n"
            "  params @1:24\n"
            "    param s: fp32[] = 1.0 @1:31\n"
            "    param w: bf16[64] = (- 0.5) @1:48\n"
            "  = (* s x)\n");
}

TEST(UserOpParams, EachUseCreatesLayerParametersWithTheirStartValues) {
  const ir::Sequence s = lower(program("learnable_scale() as ls\n  affine()\n  affine()"));
  const ir::Value* scale = param_named(s, "ls.scale");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(ir::type_string(scale->type), "fp32[1]");  // a scalar is one element
  EXPECT_EQ(plan::param_init_string(scale->init),
            plan::param_init_string(ir::ParamInit::constant(1)));
  for (const char* layer : {"affine_0", "affine_1"}) {
    const ir::Value* w = param_named(s, fmt::format("{}.w", layer));
    const ir::Value* b = param_named(s, fmt::format("{}.b", layer));
    ASSERT_NE(w, nullptr) << layer;
    ASSERT_NE(b, nullptr) << layer;
    EXPECT_EQ(ir::type_string(w->type), "fp32[8]");
    EXPECT_EQ(plan::param_init_string(w->init),
              plan::param_init_string(ir::ParamInit::constant(1)));
    EXPECT_EQ(plan::param_init_string(b->init),
              plan::param_init_string(ir::ParamInit::constant(0)));
  }
  const std::string text = ir::print_sequence(s, nullptr);
  EXPECT_TRUE(test::contains(text, "param %ls.scale: fp32[1]")) << text;
  EXPECT_TRUE(test::contains(text, "= affine(%0, %affine_0.w, %affine_0.b) {value = (w * x + b)}"))
      << text;
  // The backward gives each parameter's gradient, shaped like the parameter.
  EXPECT_TRUE(test::contains(text, "= activation_backward(%dy, %1, %affine_1.w, %affine_1.b)"))
      << text;
  EXPECT_TRUE(test::contains(text, ": fp32[tokens, 8], fp32[8], fp32[8]")) << text;
  ASSERT_EQ(s.param_grads.size(), 5u);
}

// A per-feature parameter must have the features of the op's output.
TEST(UserOpParams, AFeatureCountThatDoesNotMatchIsAnErrorAtTheUse) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Passes;
  const std::string text = fmt::format(
      "{}sequence s(x: fp32[tokens, 16]) -> (y: fp32[tokens, 16]) {{\n  affine()\n}}\n", kOps);
  EXPECT_FALSE(driver::compile_source("p.fuse", text, sources, diags, options).ok());
  EXPECT_TRUE(test::contains(diags.format_all(),
                             "p.fuse:9:3: error: parameter 'w' of 'affine' has 8 features, but "
                             "the op's output fp32[tokens, 16] has 16"))
      << diags.format_all();
}

// ---- the CPU reference -------------------------------------------------------------------------

// Runs the sequence forward and backward in fp64 with the given parameter values and output
// gradient.
struct RunResult {
  std::vector<double> y, dx;
  std::map<std::string, std::vector<double>> dparams;
};
RunResult run_sequence(const ir::Sequence& s, const std::vector<double>& x, int64_t tokens,
                       const std::map<std::string, std::vector<double>>& params,
                       const std::vector<double>& dy) {
  cpu::ReferenceOptions options;
  options.round_outputs = false;  // fp64 throughout, for the finite differences
  cpu::ReferenceExecutor<double> exec(s, {{"tokens", tokens}}, options);
  for (const auto& [name, values] : params) exec.param(name).data = values;
  exec.params_changed();
  cpu::Tensor<double> in;
  in.shape = exec.input_shapes()[0];
  in.data = x;
  RunResult r;
  r.y = exec.forward({in})[0].data;
  cpu::Tensor<double> g;
  g.shape = exec.output_shapes()[0];
  g.data = dy;
  const auto grads = exec.backward({g});
  r.dx = grads.inputs[0].data;
  for (size_t i = 0; i < exec.param_names().size(); ++i)
    r.dparams[exec.param_names()[i]] = grads.params[i].data;
  return r;
}

std::vector<double> ramp(size_t n, double start, double step) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * double(i % 13) - 0.01 * double(i);
  return v;
}

TEST(UserOpParams, ReferenceForwardIsTheHandWrittenMath) {
  const int64_t tokens = 3;
  const std::vector<double> x = ramp(tokens * 8, -1.2, 0.3);
  const std::vector<double> dy(x.size(), 1.0);
  const RunResult a = run_sequence(lower(program("learnable_scale() as ls")), x, tokens,
                                   {{"ls.scale", {-1.75}}}, dy);
  const std::vector<double> w = ramp(8, 0.5, 0.25), b = ramp(8, -0.3, 0.1);
  const RunResult c =
      run_sequence(lower(program("affine() as af")), x, tokens, {{"af.w", w}, {"af.b", b}}, dy);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_DOUBLE_EQ(a.y[i], -1.75 * x[i]) << i;
    EXPECT_DOUBLE_EQ(c.y[i], w[i % 8] * x[i] + b[i % 8]) << i;
  }
}

// The derived backward: dx and every parameter's gradient (summed over the rows per feature, over
// everything for a scalar) against central differences of L = sum(y * dy) in fp64.
void expect_gradients_match_differences(const std::string& use, bool gated,
                                        const std::map<std::string, std::vector<double>>& params) {
  const ir::Sequence s = lower(program(use, gated));
  const int64_t tokens = 4;
  const size_t out_cols = gated ? 4 : 8;
  const std::vector<double> x = ramp(size_t(tokens) * 8, -1.1, 0.2);
  const std::vector<double> dy = ramp(size_t(tokens) * out_cols, 0.7, -0.15);
  const RunResult base = run_sequence(s, x, tokens, params, dy);
  auto loss = [&](const std::vector<double>& xs,
                  const std::map<std::string, std::vector<double>>& p) {
    const RunResult r = run_sequence(s, xs, tokens, p, dy);
    double l = 0;
    for (size_t i = 0; i < r.y.size(); ++i) l += r.y[i] * dy[i];
    return l;
  };
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> up = x, down = x;
    up[i] += h;
    down[i] -= h;
    EXPECT_NEAR(base.dx[i], (loss(up, params) - loss(down, params)) / (2 * h), 1e-6) << use << i;
  }
  for (const auto& [name, values] : params) {
    ASSERT_EQ(base.dparams.at(name).size(), values.size()) << name;
    for (size_t k = 0; k < values.size(); ++k) {
      auto up = params, down = params;
      up[name][k] += h;
      down[name][k] -= h;
      const double numeric = (loss(x, up) - loss(x, down)) / (2 * h);
      EXPECT_NEAR(base.dparams.at(name)[k], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
          << use << " d" << name << "[" << k << "]";
      EXPECT_GT(std::abs(numeric), 1e-3) << "a gradient that is not zero, so the check can fail";
    }
  }
}

TEST(UserOpParams, DerivedBackwardMatchesFiniteDifferencesForAScalar) {
  expect_gradients_match_differences("learnable_scale() as ls", false, {{"ls.scale", {1.3}}});
}

TEST(UserOpParams, DerivedBackwardMatchesFiniteDifferencesPerFeature) {
  expect_gradients_match_differences("affine() as af", false,
                                     {{"af.w", ramp(8, 0.5, 0.2)}, {"af.b", ramp(8, -0.2, 0.1)}});
  expect_gradients_match_differences("scaled_tanh(k = 3) as st", false,
                                     {{"st.a", {0.8}}, {"st.w", ramp(8, 0.6, 0.1)}});
}

TEST(UserOpParams, DerivedBackwardMatchesFiniteDifferencesForAGatedOp) {
  expect_gradients_match_differences("gated_scale() as gs", true,
                                     {{"gs.s", {0.5, -1.25, 2, 0.75}}});
}

// A given backward's parameter gradient is used as written: given_scale's is 3 x dy, three times
// the true one, so it is not the derived gradient.
TEST(UserOpParams, AGivenBackwardGivesTheParameterGradientsAsWritten) {
  const int64_t tokens = 2;
  const std::vector<double> x = ramp(tokens * 8, -0.9, 0.2), dy = ramp(tokens * 8, 0.4, 0.1);
  const RunResult given =
      run_sequence(lower(program("given_scale() as g")), x, tokens, {{"g.scale", {0.5}}}, dy);
  const RunResult derived =
      run_sequence(lower(program("learnable_scale() as g")), x, tokens, {{"g.scale", {0.5}}}, dy);
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sum += x[i] * dy[i];
    EXPECT_DOUBLE_EQ(given.dx[i], 0.5 * dy[i]);
  }
  EXPECT_NEAR(derived.dparams.at("g.scale")[0], sum, 1e-12);
  EXPECT_NEAR(given.dparams.at("g.scale")[0], 3 * sum, 1e-12);
}

// Training on the CPU reference: one SGD step moves the parameter by -lr times its gradient.
TEST(UserOpParams, SgdOnTheReferenceMovesTheParameter) {
  const ir::Sequence s = lower(program("learnable_scale() as ls\n  affine() as af"));
  cpu::ReferenceExecutor<float> exec(s, {{"tokens", 16}});
  cpu::init_params_from_seed(exec, 7);
  EXPECT_EQ(exec.param("ls.scale").data, std::vector<float>{1.0f});  // its declared start
  EXPECT_EQ(exec.param("af.b").data, std::vector<float>(8, 0.0f));
  const auto x = cpu::seeded_normal(exec.input_shapes()[0], 1, 1.0);
  const auto y = exec.forward({x});
  const auto grads = exec.backward({y[0]});  // L = 0.5 |y|^2
  const std::vector<float> before = exec.param("af.w").data;
  const double lr = 1e-3;
  exec.sgd_step(grads, lr);
  const size_t scale = 0, w = 1;
  ASSERT_EQ(exec.param_names()[scale], "ls.scale");
  ASSERT_EQ(exec.param_names()[w], "af.w");
  EXPECT_NE(grads.params[scale].data[0], 0.0f);
  EXPECT_FLOAT_EQ(exec.param("ls.scale").data[0], float(1.0 - lr * grads.params[scale].data[0]));
  for (size_t c = 0; c < 8; ++c)
    EXPECT_FLOAT_EQ(exec.param("af.w").data[c], float(before[c] - lr * grads.params[w].data[c]));
  // And the loss went down.
  const auto y2 = exec.forward({x});
  double l1 = 0, l2 = 0;
  for (size_t i = 0; i < y[0].data.size(); ++i) {
    l1 += double(y[0].data[i]) * y[0].data[i];
    l2 += double(y2[0].data[i]) * y2[0].data[i];
  }
  EXPECT_LT(l2, l1);
}

// ---- passes and codegen ------------------------------------------------------------------------

// An op with parameters stays out of compose-pointwise chains (its parameters would need their
// gradients through the chain): the ops around it still compose with each other, not with it.
TEST(UserOpParams, AnOpWithParametersIsNotComposed) {
  const ir::Sequence s =
      lower(program("gelu()\n  relu()\n  learnable_scale() as ls\n  gelu()\n  silu()"), {});
  std::vector<std::string> names;
  for (const ir::Operation& op : s.ops)
    if (ir::is_pointwise(op.kind)) names.emplace_back(ir::written_op_name(op.kind, op.attrs));
  EXPECT_EQ(names, (std::vector<std::string>{"gelu+relu", "learnable_scale", "gelu+silu"}));
}

TEST(UserOpParams, TheFunctorNameCarriesTheParametersAndGivesTheSource) {
  const ir::Sequence s = lower(program("scaled_tanh() as st"));
  const ir::Operation* op = nullptr;
  for (const ir::Operation& o : s.ops)
    if (ir::is_pointwise(o.kind)) op = &o;
  ASSERT_NE(op, nullptr);
  const std::string name = ir::pointwise_functor_name(*ir::pointwise_def(op->kind), op->attrs);
  EXPECT_TRUE(name.starts_with("opfuse::pointwise_user_11_scaled_tanh_Lfsfv_")) << name;
  const auto source = ir::pointwise_functor_source(name);
  ASSERT_TRUE(source.has_value()) << name;
  EXPECT_TRUE(test::contains(*source, "static constexpr int kParams = 2;")) << *source;
  EXPECT_TRUE(test::contains(*source, "static_cast<const float*>(learned[0])[0]")) << *source;
  EXPECT_TRUE(test::contains(*source, "static_cast<const float*>(learned[1])[col]")) << *source;
  EXPECT_TRUE(test::contains(*source, "dparam[1] = ")) << *source;
  // A name whose parameter list is malformed gives no source (names are not trusted).
  std::string bad = name;
  bad.replace(bad.find("_Lfsfv_"), 7, "_Lfxfv_");
  EXPECT_FALSE(ir::pointwise_functor_source(bad).has_value());
}

// The kernels of a program with learned parameters (scalar and per feature, bf16 and fp32, plain
// and gated, fused with FP8 casts) compile with NVRTC, the scalar's final sum included.
TEST(UserOpParams, KernelsCompileWithNvrtc) {
  const std::string dir = test::make_temp_dir("user-op-params-build");
  std::ofstream(dir + "/p.fuse") << R"(const hidden = 256
op learnable_scale(x) params(scale: fp32[] = 1.0) = scale * x
op affine(x) params(w: fp32[hidden] = 1.0, b: bf16[hidden] = 0.0) = w * x + b
gated op gated_scale(a, b) params(g: fp32[128] = 0.5) = g * a * sigmoid(b)
recipe fp8 = delayed_scaling()
sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) uses fp8 {
  learnable_scale() as ls
  affine()
  linear(hidden, hidden, bias = false)
  gated_scale()
  linear(128, hidden)
  affine()
}
)";
  const auto r = test::run_command(
      "OPFUSE_CACHE_DIR=" + test::shell_quoted(dir + "/cache") + " " + test::fusec_path() +
      " build " + test::shell_quoted(dir + "/p.fuse") + " -o " + test::shell_quoted(dir + "/out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> cubins;
  for (const auto& e : fs::directory_iterator(dir + "/out/kernels"))
    if (e.path().extension() == ".cubin") cubins.insert(e.path().stem().string());
  for (const char* kernel : {"activation_fwd_user_learnable_scale",
                             "activation_bwd_user_learnable_scale", "activation_fwd_user_affine",
                             "activation_bwd_user_affine", "gated_activation_fwd_user_gated_scale",
                             "gated_activation_bwd_user_gated_scale", "learned_scalar_sum_fp32"}) {
    bool found = false;
    for (const std::string& c : cubins) found |= c.starts_with(kernel);
    EXPECT_TRUE(found) << kernel << " in " << r.output;
  }
  // The affine's backward before the second linear fuses its gradient's FP8 cast (and dbias).
  bool fused_cast = false;
  for (const std::string& c : cubins)
    fused_cast |= c.starts_with("activation_bwd_user_affine") && test::contains(c, "_e5m2_t_dbias");
  EXPECT_TRUE(fused_cast);
}

}  // namespace
}  // namespace opfuse
