// The CPU reference's op math: forward values against numbers worked out by hand, and every op
// kind's backward against central finite differences in fp64 (no storage rounding), one op at a
// time and for a whole sequence.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "driver/frontend.h"
#include "ir/pointwise_ops.h"
#include "reference/reference_executor.h"

namespace opfuse::cpu {
namespace {

ir::Program compile(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto program = load_program_from_source("test.fuse", text, sources, diags);
  EXPECT_FALSE(diags.has_errors()) << diags.format_all() << "\n" << text;
  if (!program) throw std::runtime_error("program did not compile");
  return *program;
}

template <typename T>
Tensor<T> random_tensor(std::vector<int64_t> shape, std::mt19937_64& rng, double stddev = 1.0) {
  Tensor<T> t = Tensor<T>::zeros(std::move(shape));
  std::normal_distribution<double> normal(0.0, stddev);
  for (T& v : t.data) v = T(normal(rng));
  return t;
}

// ---- finite-difference gradient check ------------------------------------------------------

// loss = sum over outputs of <output, weight>: its gradient w.r.t. each output is the weight.
double weighted_loss(const std::vector<Tensor<double>>& outputs,
                     const std::vector<Tensor<double>>& weights) {
  double loss = 0;
  for (size_t k = 0; k < outputs.size(); ++k)
    for (size_t i = 0; i < outputs[k].data.size(); ++i)
      loss += outputs[k].data[i] * weights[k].data[i];
  return loss;
}

// Compares backward's gradient of every input and parameter element with (L(v+h) - L(v-h)) / 2h;
// returns the worst error relative to the largest gradient of that tensor.
double worst_gradient_error(const ir::Sequence& seq) {
  ReferenceOptions exact;
  exact.round_outputs = false;
  ReferenceExecutor<double> exec(seq, {{"tokens", 3}}, exact);
  std::mt19937_64 rng(7);
  for (const std::string& name : exec.param_names()) {
    exec.param(name) = random_tensor<double>(exec.param(name).shape, rng, 0.5);
  }
  std::vector<Tensor<double>> inputs, weights;
  for (const auto& shape : exec.input_shapes()) inputs.push_back(random_tensor<double>(shape, rng));
  for (const auto& shape : exec.output_shapes())
    weights.push_back(random_tensor<double>(shape, rng));
  exec.forward(inputs);
  const Gradients<double> grads = exec.backward(weights);

  double worst = 0;
  const double h = 1e-5;
  auto check = [&](std::vector<double>& values, const std::vector<double>& analytic,
                   const std::string& what) {
    double largest = 1e-12;
    for (double g : analytic) largest = std::max(largest, std::fabs(g));
    for (size_t i = 0; i < values.size(); ++i) {
      const double saved = values[i];
      values[i] = saved + h;
      const double up = weighted_loss(exec.forward(inputs), weights);
      values[i] = saved - h;
      const double down = weighted_loss(exec.forward(inputs), weights);
      values[i] = saved;
      const double error = std::fabs((up - down) / (2 * h) - analytic[i]) / largest;
      EXPECT_LT(error, 1e-6) << what << "[" << i << "] in sequence " << seq.name;
      worst = std::max(worst, error);
    }
  };
  for (size_t k = 0; k < inputs.size(); ++k)
    check(inputs[k].data, grads.inputs[k].data, fmt::format("input {}", k));
  for (size_t k = 0; k < exec.param_names().size(); ++k)
    check(exec.param(exec.param_names()[k]).data, grads.params[k].data, exec.param_names()[k]);
  return worst;
}

struct OpCase {
  std::string name;
  std::string signature;  // inputs -> outputs
  std::string body;
  std::string definitions = {};  // before the sequence (a user-defined op)
};

std::vector<OpCase> every_op_kind() {
  const std::string x8 = "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 8])";
  return {
      {"layernorm", x8, "layernorm(8, eps = 1e-3)"},
      {"layernorm_zero_centered", x8, "layernorm(8, zero_centered_gamma = true)"},
      {"rmsnorm", x8, "rmsnorm(8, eps = 1e-3)"},
      {"rmsnorm_zero_centered", x8, "rmsnorm(8, zero_centered_gamma = true)"},
      {"linear", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 6])", "linear(8, 6)"},
      {"linear_no_bias", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 6])",
       "linear(8, 6, bias = false)"},
      {"bias", x8, "bias(8)"},
      {"gelu", x8, "gelu()"},
      {"qgelu", x8, "qgelu()"},
      {"relu", x8, "relu()"},
      {"silu", x8, "silu()"},
      {"swiglu", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 4])", "swiglu()"},
      {"geglu", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 4])", "geglu()"},
      {"srelu", x8, "srelu()"},
      {"sreglu", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 4])", "sreglu()"},
      {"qgeglu", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 4])", "qgeglu()"},
      // limit 0.5: normal(0, 1) inputs cross both clamps.
      {"clamped_swiglu", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 4])",
       "clamped_swiglu(limit = 0.5, alpha = 1.702)"},
      {"reglu", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 4])", "reglu()"},
      {"add_extra_input", "(x: fp32[tokens, 8], r: fp32[tokens, 8]) -> (y: fp32[tokens, 8])",
       "add_extra_input(r)"},
      {"make_extra_output", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 8], e: fp32[tokens, 8])",
       "make_extra_output(e)\n gelu()"},
      {"quantize", x8, "quantize(backward = true)"},
      {"constant_scale", x8, "constant_scale(2.5)"},
      {"identity", x8, "identity()"},
      {"reshape", "(x: fp32[tokens, 8]) -> (y: fp32[tokens, 2, 4])", "reshape([tokens, 2, 4])"},
      // Over one rank the collectives are the identity; test_parallel checks them sharded.
      {"all_reduce", x8, "all_reduce()"},
      {"all_gather", x8, "all_gather()"},
      {"reduce_scatter", x8, "reduce_scatter()"},
      // A fixed mask (one step, one seed): linear in x, dx from the saved bits.
      {"dropout", x8, "dropout(p = 0.5, seed = 3)"},
      // A norm-like user-defined op (its carrier and its backward): nested means, a max and
      // learned parameters (test_user_op_reductions checks more of them).
      {"user_norm_op", x8, "ln_like() as n",
       "op ln_like(x) params(g: fp32[8] = 1.5, b: fp32[] = 0.5) =\n"
       "    g * (x - mean_last(x)) * rsqrt(mean_last((x - mean_last(x)) ^ 2) + 0.1) +\n"
       "    b * max_last(x)\n"},
  };
}

TEST(ReferenceOps, FiniteDifferenceGradientOfEveryOpKind) {
  std::vector<bool> covered(256, false);  // fixed and pointwise kinds (ir::OpKind)
  for (const OpCase& c : every_op_kind()) {
    const ir::Program program = compile(
        fmt::format("{}sequence {}{} {{\n {}\n}}\n", c.definitions, c.name, c.signature, c.body));
    // The executor runs the lowered training graph: count its forward and backward op kinds.
    const ReferenceExecutor<double> lowered(program.sequences[0], {{"tokens", 3}});
    for (const ir::Operation& op : lowered.sequence().ops) covered[size_t(op.kind)] = true;
    EXPECT_LT(worst_gradient_error(program.sequences[0]), 1e-6) << c.name;
  }
  // FP8 casts and fused ops are not differentiable math of their own: test_fusion and
  // test_reference_executor check them.
  std::vector<ir::OpKind> kinds;
  for (size_t k = 0; k < ir::kNumOpKinds; ++k) kinds.push_back(ir::OpKind(k));
  for (const ir::PointwiseDef* def : ir::pointwise_defs()) {
    kinds.push_back(ir::pointwise_kind(*def));
    kinds.push_back(ir::pointwise_backward_kind(*def));
  }
  for (const ir::OpKind kind : kinds) {
    // tensor_stats and tensor_capture compute no value (test_debug_variants checks the records,
    // test_debug_captures the captures); modify_tensor replaces a GEMM operand in a debug
    // variant (test_debug_modify checks it); fp8_transpose moves FP8 codes (test_parallel
    // checks the gathered FP8 path against the unsharded program); emulated_cast quantizes a
    // GEMM operand after build-backward (test_micro_recipes checks it against the oracle).
    if (kind == ir::OpKind::CastFp8 || kind == ir::OpKind::Fp8Transpose ||
        kind == ir::OpKind::EmulatedCast || kind == ir::OpKind::Fused ||
        kind == ir::OpKind::TensorStats || kind == ir::OpKind::TensorCapture ||
        kind == ir::OpKind::ModifyTensor) {
      continue;
    }
    EXPECT_TRUE(covered[size_t(kind)])
        << "no gradient check for " << ir::op_info(kind).name << " "
        << (ir::pointwise_def(kind) ? ir::pointwise_def(kind)->name : "");
  }
}

TEST(ReferenceOps, FiniteDifferenceGradientOfWholeSequence) {
  const ir::Program program = compile(R"(
sequence block(x: fp32[tokens, 8], residual: fp32[tokens, 8])
    -> (y: fp32[tokens, 8], skip: fp32[tokens, 8]) {
  make_extra_output(skip)
  rmsnorm(8)
  linear(8, 12) as up
  swiglu()
  linear(6, 8, bias = false) as down
  constant_scale(0.5)
  add_extra_input(residual)
  layernorm(8)
}
)");
  EXPECT_LT(worst_gradient_error(program.sequences[0]), 1e-6);
}

// ---- forward values by hand --------------------------------------------------------------

template <typename T>
std::vector<Tensor<T>> run_forward(
    const std::string& text, std::vector<Tensor<T>> inputs,
    const std::vector<std::pair<std::string, std::vector<T>>>& params, ir::Program& keep) {
  keep = compile(text);
  // fp32 storage would round the double results to float; the hand values are exact.
  ReferenceOptions options;
  options.round_outputs = std::is_same_v<T, float>;
  ReferenceExecutor<T> exec(keep.sequences[0], {}, options);
  for (const auto& [name, values] : params) exec.param(name).data = values;
  exec.params_changed();
  return exec.forward(inputs);
}

TEST(ReferenceOps, LayerNormMatchesHandComputedValues) {
  // x = [1, 2, 3, 4]: mean 2.5, biased variance 1.25, rstd = 1 / sqrt(1.25 + 0.75) = 1/sqrt(2).
  ir::Program p;
  const auto y = run_forward<double>(
      "sequence s(x: fp32[1, 4]) -> (y: fp32[1, 4]) { layernorm(4, eps = 0.75) as ln }",
      {{{1, 4}, {1, 2, 3, 4}}}, {{"ln.weight", {1, 2, 1, 1}}, {"ln.bias", {0, 0, 0, 10}}}, p);
  const double r = 1 / std::sqrt(2.0);
  const std::vector<double> want = {-1.5 * r, -0.5 * r * 2, 0.5 * r, 1.5 * r + 10};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(y[0].data[i], want[i], 1e-12) << i;
}

TEST(ReferenceOps, ZeroCenteredRmsNormAddsOneToGamma) {
  // x = [3, 4]: mean square 12.5, eps 1 -> rstd = 1 / sqrt(13.5); weights stored minus one.
  ir::Program p;
  const auto y = run_forward<double>(
      "sequence s(x: fp32[1, 2]) -> (y: fp32[1, 2]) {\n"
      " rmsnorm(2, eps = 1, zero_centered_gamma = true) as n }",
      {{{1, 2}, {3, 4}}}, {{"n.weight", {0, 1}}}, p);
  const double rstd = 1 / std::sqrt(13.5);
  EXPECT_NEAR(y[0].data[0], 3 * rstd * 1, 1e-12);
  EXPECT_NEAR(y[0].data[1], 4 * rstd * 2, 1e-12);
}

TEST(ReferenceOps, LinearComputesXTimesWTransposedPlusBias) {
  // W is [out = 2, in = 3]: y0 = 1*1 + 2*0 + 3*(-1) + 0.5 = -1.5; y1 = 1*2 + 2*1 + 3*1 - 1 = 6.
  ir::Program p;
  const auto y = run_forward<float>(
      "sequence s(x: fp32[1, 3]) -> (y: fp32[1, 2]) { linear(3, 2) as fc }", {{{1, 3}, {1, 2, 3}}},
      {{"fc.weight", {1, 0, -1, 2, 1, 1}}, {"fc.bias", {0.5f, -1}}}, p);
  EXPECT_EQ(y[0].data, (std::vector<float>{-1.5f, 6.0f}));
}

TEST(ReferenceOps, ActivationsMatchTheirFormulas) {
  // gelu(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)); qgelu(1) = sigmoid(1.702);
  // silu(-1) = -sigmoid(-1); relu(-1) = 0.
  const double gelu1 = 0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * 1.044715));
  const char* text = "sequence s(x: fp32[1, 1]) -> (y: fp32[1, 1]) {{ {}() }}";
  const std::vector<std::tuple<const char*, double, double>> cases = {
      {"gelu", 1.0, gelu1},
      {"qgelu", 1.0, 1 / (1 + std::exp(-1.702))},
      {"silu", -1.0, -1 / (1 + std::exp(1.0))},
      {"relu", -1.0, 0.0},
      {"relu", 2.0, 2.0},
      {"srelu", 3.0, 9.0},
      {"srelu", -3.0, 0.0}};
  for (const auto& [op, x, want] : cases) {
    ir::Program p;
    const auto y = run_forward<double>(fmt::format(fmt::runtime(text), op), {{{1, 1}, {x}}}, {}, p);
    EXPECT_NEAR(y[0].data[0], want, 1e-12) << op << "(" << x << ")";
  }
}

TEST(ReferenceOps, GatedActivationGatesWithTheFirstHalf) {
  // x = [a | b] = [1, -2 | 3, 4]: y = silu(a) * b = [silu(1) * 3, silu(-2) * 4].
  ir::Program p;
  const auto y = run_forward<double>("sequence s(x: fp32[1, 4]) -> (y: fp32[1, 2]) { swiglu() }",
                                     {{{1, 4}, {1, -2, 3, 4}}}, {}, p);
  EXPECT_NEAR(y[0].data[0], 3 / (1 + std::exp(-1.0)), 1e-12);
  EXPECT_NEAR(y[0].data[1], 4 * -2 / (1 + std::exp(2.0)), 1e-12);
}

TEST(ReferenceOps, SquaredReluGatesWithTheFirstHalfAndDoublesItsSlope) {
  // sreglu([a | b]) = max(a, 0)^2 * b; d/da = (a > 0 ? 2a : 0) * b * dy, d/db = max(a, 0)^2 * dy.
  ir::Program p;
  const auto y = run_forward<double>("sequence s(x: fp32[1, 4]) -> (y: fp32[1, 2]) { sreglu() }",
                                     {{{1, 4}, {2, -1, -1.5, 4}}}, {}, p);
  EXPECT_EQ(y[0].data, (std::vector<double>{-6, 0}));
  ReferenceOptions exact;
  exact.round_outputs = false;
  ReferenceExecutor<double> exec(p.sequences[0], {}, exact);
  exec.forward({{{1, 4}, {2, -1, -1.5, 4}}});
  const Gradients<double> g = exec.backward({{{1, 2}, {0.5, 1}}});
  EXPECT_EQ(g.inputs[0].data, (std::vector<double>{2 * 2 * -1.5 * 0.5, 0, 4 * 0.5, 0}));
}

TEST(ReferenceOps, Bf16StorageRoundsEveryOpResult) {
  // 1 + 2^-9 is not a bf16 (8 mantissa bits): the stored result rounds to 1 (ties to even);
  // with rounding off the fp32 value survives.
  const ir::Program p =
      compile("sequence s(x: bf16[1, 1]) -> (y: bf16[1, 1]) { constant_scale(1.001953125) }");
  ReferenceExecutor<float> rounded(p.sequences[0], {});
  EXPECT_EQ(rounded.forward({{{1, 1}, {1.0f}}})[0].data[0], 1.0f);
  ReferenceOptions unrounded;
  unrounded.round_outputs = false;
  ReferenceExecutor<float> exact(p.sequences[0], {}, unrounded);
  EXPECT_EQ(exact.forward({{{1, 1}, {1.0f}}})[0].data[0], 1.001953125f);
}

TEST(ReferenceOps, UnboundSymbolIsAClearError) {
  const ir::Program p =
      compile("sequence s(x: fp32[tokens, 4]) -> (y: fp32[tokens, 4]) { gelu() }");
  try {
    ReferenceExecutor<float> exec(p.sequences[0], {});
    FAIL() << "expected an error";
  } catch (const ReferenceError& e) {
    EXPECT_NE(std::string(e.what()).find("'tokens'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--bind"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ReferenceExecutor<float>(p.sequences[0], {{"tokens", 0}}), ReferenceError);
}

}  // namespace
}  // namespace opfuse::cpu
