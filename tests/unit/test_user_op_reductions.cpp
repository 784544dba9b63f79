// Last-dimension reductions in user-defined ops (docs/language.md, "User-defined ops":
// sum_last, mean_last, max_last) and the standard library's l2_normalization: the IR op they
// become, the CPU reference's forward against hand-written math (an L2 norm, an RMSNorm with a
// learned weight, a nested LayerNorm, a softmax), the derived backward (input and parameter
// gradients) against fp64 finite differences, max_last's gradient split between tied maxima,
// the located errors, and the row functor's name and source.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "ir/row_expr.h"
#include "ir/verifier.h"
#include "reference/reference_executor.h"
#include "test_support.h"

namespace opfuse {
namespace {

constexpr int64_t kCols = 8;

constexpr const char* kOps = R"(import "std"
const features = 8
op l2norm(x, eps: number = 1e-6) = x * rsqrt(sum_last(x * x) + eps)
op rms(x, eps: number = 1e-5) params(w: fp32[features] = 1.0) =
    w * x * rsqrt(mean_last(x ^ 2) + eps)
op ln(x, eps: number = 1e-5) params(g: fp32[features] = 1.0, b: fp32[] = 0.0) =
    g * (x - mean_last(x)) * rsqrt(mean_last((x - mean_last(x)) ^ 2) + eps) + b
op softmax(x) = exp(x - max_last(x)) / sum_last(exp(x - max_last(x)))
op centered_softmax(x) = softmax(x - mean_last(x)) * 2
op top(x) = max_last(x) + 0 * x
)";

std::string program(const std::string& use) {
  return fmt::format(
      "{}sequence s(x: fp32[tokens, 8]) -> (y: fp32[tokens, 8]) uses bf16 {{\n  {}\n}}\n", kOps,
      use);
}

ir::Sequence lower(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Passes;
  driver::CompileResult r = driver::compile_source("red.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all() << text;
  if (!r.ok()) return {};
  EXPECT_TRUE(ir::verify_sequence(r.program.sequences[0]).empty());
  return r.program.sequences[0];
}

std::string errors_of(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Passes;
  driver::CompileResult r = driver::compile_source("bad.fuse", text, sources, diags, options);
  EXPECT_FALSE(r.ok()) << text;
  return diags.format_all();
}

const ir::Operation* norm_op(const ir::Sequence& s) {
  for (const ir::Operation& o : s.ops)
    if (o.kind == ir::OpKind::UserNorm) return &o;
  return nullptr;
}

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

// ---- the front end and the IR ------------------------------------------------------------------

TEST(UserOpReductions, ANormLikeOpIsOneUserNormOpWithItsStages) {
  const ir::Sequence s = lower(program("ln() as ln1"));
  const ir::Operation* op = norm_op(s);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(ir::attr_name(op->attrs, "op"), "ln");
  // mean_last(x) is written three times and reduced once: two stages.
  EXPECT_EQ(ir::attr_name(op->attrs, "stages"), "mm");
  EXPECT_EQ(ir::written_op_name(op->kind, op->attrs), "ln");
  EXPECT_EQ(op->operands.size(), 3u);  // x, ln1.g, ln1.b
  const ir::Sequence t = lower(program("softmax()"));
  ASSERT_NE(norm_op(t), nullptr);
  EXPECT_EQ(ir::attr_name(norm_op(t)->attrs, "stages"), "xs");
  // Inlined: a call of a norm-like op makes the caller norm-like, its reductions the caller's.
  const ir::Sequence u = lower(program("centered_softmax()"));
  ASSERT_NE(norm_op(u), nullptr);
  EXPECT_EQ(ir::attr_name(norm_op(u)->attrs, "stages"), "mxs");
}

TEST(UserOpReductions, NormLikeOpsAreNotComposedIntoPointwiseChains) {
  const ir::Sequence s = lower(program("gelu()\n  l2norm()\n  gelu()"));
  size_t norms = 0, pointwise = 0;
  for (const ir::Operation& o : s.ops) {
    norms += o.kind == ir::OpKind::UserNorm;
    pointwise += ir::is_pointwise(o.kind);
  }
  EXPECT_EQ(norms, 1u);
  EXPECT_EQ(pointwise, 2u);  // the two gelus, on either side of the norm
}

// ---- the CPU reference -------------------------------------------------------------------------

TEST(UserOpReductions, ReferenceForwardIsTheHandWrittenMath) {
  const int64_t tokens = 3;
  const std::vector<double> x = ramp(size_t(tokens * kCols), -1.2, 0.3);
  const std::vector<double> dy(x.size(), 1.0);
  const std::vector<double> w = ramp(kCols, 0.5, 0.25);
  const RunResult l2 = run_sequence(lower(program("l2_normalization()")), x, tokens, {}, dy);
  const RunResult rms = run_sequence(lower(program("rms() as r")), x, tokens, {{"r.w", w}}, dy);
  const RunResult ln = run_sequence(lower(program("ln(eps = 1e-3) as n")), x, tokens,
                                    {{"n.g", w}, {"n.b", {0.25}}}, dy);
  const RunResult sm = run_sequence(lower(program("softmax()")), x, tokens, {}, dy);
  for (int64_t r = 0; r < tokens; ++r) {
    const double* row = x.data() + r * kCols;
    double sq = 0, sum = 0, mx = -INFINITY;
    for (int64_t c = 0; c < kCols; ++c) {
      sq += row[c] * row[c];
      sum += row[c];
      mx = std::max(mx, row[c]);
    }
    const double mean = sum / kCols;
    double var = 0, expsum = 0;
    for (int64_t c = 0; c < kCols; ++c) {
      var += (row[c] - mean) * (row[c] - mean) / kCols;
      expsum += std::exp(row[c] - mx);
    }
    for (int64_t c = 0; c < kCols; ++c) {
      const size_t i = size_t(r * kCols + c);
      EXPECT_NEAR(l2.y[i], row[c] / std::sqrt(sq + 1e-6), 1e-12) << i;
      EXPECT_NEAR(rms.y[i], w[size_t(c)] * row[c] / std::sqrt(sq / kCols + 1e-5), 1e-12) << i;
      EXPECT_NEAR(ln.y[i], w[size_t(c)] * (row[c] - mean) / std::sqrt(var + 1e-3) + 0.25, 1e-12)
          << i;
      EXPECT_NEAR(sm.y[i], std::exp(row[c] - mx) / expsum, 1e-12) << i;
    }
  }
}

// The derived backward: dx and every parameter's gradient (per feature summed over the rows, a
// scalar over everything) against central differences of L = sum(y * dy) in fp64.
void expect_gradients_match_differences(const std::string& use,
                                        const std::map<std::string, std::vector<double>>& params,
                                        std::vector<double> x = {}) {
  const ir::Sequence s = lower(program(use));
  const int64_t tokens = 4;
  if (x.empty()) x = ramp(size_t(tokens * kCols), -1.1, 0.2);
  const std::vector<double> dy = ramp(size_t(tokens * kCols), 0.7, -0.15);
  const RunResult base = run_sequence(s, x, tokens, params, dy);
  auto loss = [&](const std::vector<double>& xs,
                  const std::map<std::string, std::vector<double>>& p) {
    const RunResult r = run_sequence(s, xs, tokens, p, dy);
    double l = 0;
    for (size_t i = 0; i < r.y.size(); ++i) l += r.y[i] * dy[i];
    return l;
  };
  const double h = 1e-6;
  double largest = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> up = x, down = x;
    up[i] += h;
    down[i] -= h;
    const double numeric = (loss(up, params) - loss(down, params)) / (2 * h);
    largest = std::max(largest, std::abs(numeric));
    EXPECT_NEAR(base.dx[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << use << " " << i;
  }
  EXPECT_GT(largest, 1e-3) << use << ": a gradient that is not zero, so the check can fail";
  for (const auto& [name, values] : params) {
    ASSERT_EQ(base.dparams.at(name).size(), values.size()) << name;
    for (size_t k = 0; k < values.size(); ++k) {
      auto up = params, down = params;
      up[name][k] += h;
      down[name][k] -= h;
      const double numeric = (loss(x, up) - loss(x, down)) / (2 * h);
      EXPECT_NEAR(base.dparams.at(name)[k], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
          << use << " d" << name << "[" << k << "]";
    }
  }
}

TEST(UserOpReductions, DerivedBackwardOfSumsMatchesFiniteDifferences) {
  expect_gradients_match_differences("l2_normalization()", {});
  expect_gradients_match_differences("l2norm(eps = 0.5)", {});
}

TEST(UserOpReductions, DerivedBackwardWithLearnedParametersMatchesFiniteDifferences) {
  expect_gradients_match_differences("rms() as r", {{"r.w", ramp(kCols, 0.5, 0.2)}});
  expect_gradients_match_differences("ln() as n",
                                     {{"n.g", ramp(kCols, 0.6, 0.1)}, {"n.b", {-0.3}}});
}

TEST(UserOpReductions, DerivedBackwardThroughMaxAndNestingMatchesFiniteDifferences) {
  // Distinct values per row: max_last is differentiable there.
  expect_gradients_match_differences("softmax()", {});
  expect_gradients_match_differences("centered_softmax()", {});
}

// max_last passes its adjoint to the maxima, split evenly between tied ones (PyTorch's amax).
TEST(UserOpReductions, MaxLastSplitsTheGradientBetweenTiedMaxima) {
  const ir::Sequence s = lower(program("top()"));
  // Row 0: two maxima (3); row 1: one (5).
  const std::vector<double> x = {1, 3, -2, 3, 0, 2, 1, -1, 5, 0, 1, 2, 3, 4, -5, 0};
  std::vector<double> dy(x.size(), 0.5);
  const RunResult r = run_sequence(s, x, 2, {}, dy);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_DOUBLE_EQ(r.y[i], 3.0) << i;
    EXPECT_DOUBLE_EQ(r.dx[i], x[i] == 3 ? 0.5 * 8 / 2 : 0.0) << i;
    EXPECT_DOUBLE_EQ(r.y[8 + i], 5.0) << i;
    EXPECT_DOUBLE_EQ(r.dx[8 + i], i == 0 ? 0.5 * 8 : 0.0) << i;
  }
}

// float and double evaluate the same programs: float agrees to its precision.
TEST(UserOpReductions, FloatReferenceAgreesWithDouble) {
  const ir::Sequence s = lower(program("ln() as n"));
  const int64_t tokens = 5;
  const std::vector<double> x = ramp(size_t(tokens * kCols), -2.0, 0.45);
  cpu::ReferenceExecutor<float> exec(s, {{"tokens", tokens}});
  cpu::Tensor<float> in;
  in.shape = exec.input_shapes()[0];
  in.data.assign(x.begin(), x.end());
  const std::vector<float> y = exec.forward({in})[0].data;
  const RunResult d = run_sequence(s, x, tokens, {}, std::vector<double>(x.size(), 1.0));
  ASSERT_EQ(y.size(), d.y.size());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], d.y[i], 1e-5) << i;
}

// ---- errors ------------------------------------------------------------------------------------

TEST(UserOpReductions, ErrorsAreLocatedWithHints) {
  auto one = [](const std::string& defs, const std::string& use = "relu()") {
    return errors_of(fmt::format(
        "{}\nsequence s(x: fp32[tokens, 8]) -> (y: fp32[tokens, 8]) {{\n  {}\n}}\n", defs, use));
  };
  std::string e = one("op f(x) = sum_last(x, x)");
  EXPECT_TRUE(test::contains(e, "bad.fuse:1:11: error: 'sum_last' takes 1 argument, got 2")) << e;
  e = one("op f(x) = mean_last()");
  EXPECT_TRUE(test::contains(e, "'mean_last' takes 1 argument, got 0")) << e;
  e = one("gated op g(a, b) = a * max_last(b)");
  EXPECT_TRUE(test::contains(e,
                             "bad.fuse:1:24: error: gated op 'g' uses max_last; reductions "
                             "are supported in plain ops only"))
      << e;
  e = one("op n(x) = x * rsqrt(sum_last(x * x))\ngated op g(a, b) = n(a) * b");
  EXPECT_TRUE(test::contains(e,
                             "bad.fuse:2:20: error: gated op 'g' calls 'n', which reduces "
                             "over the last dimension"))
      << e;
  e = one("op n(x) = x - mean_last(x) backward(x, dy) = dy");
  EXPECT_TRUE(test::contains(e,
                             "bad.fuse:1:28: error: op 'n' reduces over the last dimension; "
                             "a given backward is not supported"))
      << e;
  e = one("op n(x) = x * x backward(x, dy) = dy * sum_last(x)");
  EXPECT_TRUE(test::contains(e, "bad.fuse:1:40: error: the backward of op 'n' uses sum_last")) << e;
  e = one("op sum_last(x) = x");
  EXPECT_TRUE(test::contains(e, "op 'sum_last' shadows the built-in function 'sum_last'")) << e;
  e = one("op n(x) = x - mean_last(x)\nfusion f { n; relu }");
  EXPECT_TRUE(test::contains(e, "bad.fuse:2:12: error: op 'n' reduces over the last dimension"))
      << e;
  e = one("op n(x) = x / sum_lats(x)");
  EXPECT_TRUE(test::contains(e, "did you mean 'sum_last'")) << e;
  // The standard library's ops are defined once: a program's own definition of one is an error
  // naming the library's.
  e = one("import \"std\"\nop l2_normalization(x) = x");
  EXPECT_TRUE(test::contains(e, "op 'l2_normalization' is already defined")) << e;
  EXPECT_TRUE(test::contains(e, "<std>/std.fuse")) << e;
}

TEST(UserOpReductions, WithoutTheImportTheStandardLibraryIsUnknown) {
  const std::string e = errors_of(
      "sequence s(x: fp32[tokens, 8]) -> (y: fp32[tokens, 8]) {\n  l2_normalization()\n}\n");
  EXPECT_TRUE(test::contains(e, "l2_normalization")) << e;
}

// ---- the functor -------------------------------------------------------------------------------

TEST(UserOpReductions, TheFunctorNameGivesTheSource) {
  const ir::Sequence s = lower(program("ln() as n"));
  const ir::Operation* op = norm_op(s);
  ASSERT_NE(op, nullptr);
  const std::string name = ir::row_functor_name(op->attrs);
  EXPECT_TRUE(name.starts_with("opfuse::row_user_2_ln_mm_Lfvfs_")) << name;
  const auto source = ir::row_functor_source(name);
  ASSERT_TRUE(source.has_value()) << name;
  EXPECT_TRUE(test::contains(*source, "static constexpr int kForwardStages = 2;")) << *source;
  // Backward: the two recomputed means, then the two adjoints (no max: no tie counts).
  EXPECT_TRUE(test::contains(*source, "static constexpr int kBackwardStages = 4;")) << *source;
  EXPECT_TRUE(test::contains(*source, "static_cast<const float*>(learned[0])[col]")) << *source;
  EXPECT_TRUE(test::contains(*source, "static_cast<const float*>(learned[1])[0]")) << *source;
  EXPECT_TRUE(test::contains(*source, "dparam[1] = ")) << *source;
  std::string bad = name;
  bad.replace(bad.find("_mm_"), 4, "_mq_");
  EXPECT_FALSE(ir::row_functor_source(bad).has_value());
  EXPECT_FALSE(ir::row_functor_source("opfuse::row_user_2_ln_mm_Lfvfs_v0_out0").has_value());
}

// The row kernels of norm-like ops (templates/row_expr.cuh with the generated functors: sums,
// nested means, a max, scalar and per-feature parameters in fp32 and bf16, fp32 and bf16
// tensors) compile with NVRTC, the parameters' column sums included.
TEST(UserOpReductions, RowKernelsCompileWithNvrtc) {
  namespace fs = std::filesystem;
  const std::string dir = test::make_temp_dir("user-op-reductions-build");
  std::ofstream(dir + "/r.fuse") << R"(import "std"
const hidden = 256
op ln_like(x, eps: number = 1e-5) params(g: bf16[hidden] = 1.0, b: fp32[] = 0.0) =
    g * (x - mean_last(x)) * rsqrt(mean_last((x - mean_last(x)) ^ 2) + eps) + b
op softmax_like(x) = exp(x - max_last(x)) / sum_last(exp(x - max_last(x)))
recipe fp8 = delayed_scaling()
sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) uses fp8 {
  ln_like()
  linear(hidden, hidden, bias = false)
  softmax_like()
  linear(hidden, hidden)
  l2_normalization()
}
sequence t(x: fp32[tokens, hidden]) -> (y: fp32[tokens, hidden]) {
  ln_like()
}
)";
  const auto r = test::run_command(
      "OPFUSE_CACHE_DIR=" + test::shell_quoted(dir + "/cache") + " " + test::fusec_path() +
      " build " + test::shell_quoted(dir + "/r.fuse") + " -o " + test::shell_quoted(dir + "/out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> cubins;
  for (const auto& e : fs::directory_iterator(dir + "/out/kernels"))
    if (e.path().extension() == ".cubin") cubins.insert(e.path().stem().string());
  for (const char* kernel :
       {"row_expr_fwd_user_ln_like", "row_expr_bwd_user_ln_like", "row_expr_fwd_user_softmax_like",
        "row_expr_bwd_user_softmax_like", "row_expr_fwd_user_l2_normalization",
        "row_expr_bwd_user_l2_normalization", "learned_scalar_sum"}) {
    bool found = false;
    for (const std::string& c : cubins) found |= c.starts_with(kernel);
    EXPECT_TRUE(found) << kernel << " in " << r.output;
  }
  bool fp32 = false;
  for (const std::string& c : cubins)
    fp32 |= c.starts_with("row_expr_bwd_user_ln_like") && c.ends_with("_fp32_fp32");
  EXPECT_TRUE(fp32);
}

}  // namespace
}  // namespace opfuse
