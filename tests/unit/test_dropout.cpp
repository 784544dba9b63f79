// Dropout (note "Dropout" in docs/language.md): the shared Philox4x32-10 (Random123's known
// answers) and the documented counter/key mapping, the integer keep threshold, the CPU reference
// (keep fraction, exact values, per-step masks, backward from the saved bits, p = 0 and inference
// as the identity, float and double), the front end's located errors, the passes leaving every
// dropout alone, and codegen (training launch, inference variant, backward, the end-of-step
// counter advance); the kernels compile with NVRTC (no GPU needed).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "../../runtime/jit/nvrtc_compiler.h"
#include "../../templates/common/philox.cuh"

#include "codegen/plan.h"
#include "driver/compile.h"
#include "driver/frontend.h"
#include "reference/dropout.h"
#include "reference/reference_executor.h"
#include "test_support.h"

namespace opfuse {
namespace {

using cpu::ReferenceExecutor;
using cpu::Tensor;

// ---- Philox and the mapping ---------------------------------------------------------------------

TEST(DropoutPhilox, Random123KnownAnswers) {
  struct Case {
    Philox4x32 counter;
    unsigned int key0, key1;
    Philox4x32 expected;
  };
  const Case cases[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Case& c : cases) {
    const Philox4x32 out = philox4x32_10(c.counter, c.key0, c.key1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], c.expected.v[i]) << "word " << i;
  }
}

TEST(DropoutPhilox, WordsAreTheDocumentedCounterAndKey) {
  // Counter (i / 4 low, i / 4 high, step, stream), key (seed low, seed high).
  const Philox4x32 words = dropout_random_words(0x500000007ull, 0x0123456789abcdefull, 3, 0xfeed);
  const Philox4x32 direct =
      philox4x32_10(Philox4x32{{0x7u, 0x5u, 3u, 0xfeedu}}, 0x89abcdefu, 0x01234567u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(words.v[i], direct.v[i]) << "word " << i;
}

TEST(DropoutPhilox, ThresholdIsTheIntegerCeilingOfPTimesTwoToThe32) {
  EXPECT_EQ(dropout_threshold(0.0), 0ull);
  EXPECT_EQ(dropout_threshold(0.5), 1ull << 31);
  EXPECT_EQ(dropout_threshold(0.25), 1ull << 30);
  EXPECT_EQ(dropout_threshold(0.1), 429496730ull);  // ceil(429496729.6)
  // u = word / 2^32 >= p exactly when word >= threshold, at the boundary too.
  const double p = 0.1;
  const unsigned long long t = dropout_threshold(p);
  EXPECT_LT(double(t - 1) / 4294967296.0, p);
  EXPECT_GE(double(t) / 4294967296.0, p);
  // Too close to 1: nothing would be kept (the front end refuses it).
  EXPECT_EQ(dropout_threshold(1.0 - std::ldexp(1.0, -34)), 1ull << 32);
}

TEST(DropoutPhilox, StreamIsFnv1aOfTheInstanceName) {
  EXPECT_EQ(dropout_stream("", 0), 2166136261u);
  EXPECT_EQ(dropout_stream("a", 1), 0xe40c292cu);
  EXPECT_NE(dropout_stream("dropout_0", 9), dropout_stream("dropout_1", 9));
}

// ---- the CPU reference --------------------------------------------------------------------------

ir::Program load(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto program = load_program_from_source("dropout.fuse", text, sources, diags);
  EXPECT_FALSE(diags.has_errors()) << diags.format_all() << "\n" << text;
  if (!program) throw std::runtime_error("program did not load");
  return *program;
}

std::string program(double p, int64_t seed = 12345, int cols = 96) {
  return "sequence s(x: fp32[tokens, " + std::to_string(cols) + "]) -> (y: fp32[tokens, " +
         std::to_string(cols) + "]) {\n  dropout(p = " + std::to_string(p) +
         ", seed = " + std::to_string(seed) + ")\n}\n";
}

template <typename T>
Tensor<T> random_tensor(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Tensor<T> t = Tensor<T>::zeros({rows, cols});
  // Never 0, so a zero output means dropped.
  for (T& v : t.data) v = T(float(normal(rng)) + (normal(rng) > 0 ? 1.5f : -1.5f));
  return t;
}

bool kept(const std::vector<uint32_t>& mask, int64_t cols, int64_t r, int64_t c) {
  return cpu::dropout_kept(mask, (cols + 31) / 32, r, c);
}

constexpr int64_t kRows = 1024, kCols = 96;

TEST(DropoutReference, KeepsAboutOneMinusPAndScalesTheKeptExactly) {
  const double p = 0.3;
  ReferenceExecutor<float> ref(load(program(p)).sequences[0], {{"tokens", kRows}});
  const Tensor<float> x = random_tensor<float>(kRows, kCols, 1);
  const Tensor<float> y = ref.forward({x})[0];
  const std::vector<uint32_t>& mask = ref.dropout_mask("dropout_0");
  ASSERT_EQ(mask.size(), size_t(kRows * 3));
  const float scale = float(1.0 / (1.0 - p));
  int64_t kept_count = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      const size_t i = size_t(r * kCols + c);
      if (kept(mask, kCols, r, c)) {
        ++kept_count;
        ASSERT_EQ(y.data[i], x.data[i] * scale) << i;
      } else {
        ASSERT_EQ(y.data[i], 0.0f) << i;
      }
    }
  }
  // Binomial(n, 1 - p): six standard deviations.
  const double n = double(kRows * kCols), fraction = double(kept_count) / n;
  EXPECT_NEAR(fraction, 1 - p, 6 * std::sqrt(p * (1 - p) / n)) << kept_count;
}

TEST(DropoutReference, TheMaskIsTheDocumentedPhiloxDrawAgainstTheIntegerThreshold) {
  const double p = 0.25;
  const int64_t seed = (int64_t(1) << 40) + 77;
  ReferenceExecutor<double> ref(load(program(p, seed)).sequences[0], {{"tokens", 8}});
  ref.forward({random_tensor<double>(8, kCols, 2)});
  const std::vector<uint32_t>& mask = ref.dropout_mask("dropout_0");
  const unsigned int stream = dropout_stream("dropout_0", 9);
  for (int64_t i = 0; i < 8 * kCols; ++i) {
    const auto group = uint64_t(i / 4);
    const Philox4x32 words = philox4x32_10(Philox4x32{{uint32_t(group), 0u, 0u, stream}},
                                           uint32_t(seed), uint32_t(uint64_t(seed) >> 32));
    EXPECT_EQ(kept(mask, kCols, i / kCols, i % kCols), words.v[i % 4] >= (1u << 30)) << i;
  }
}

TEST(DropoutReference, EachStepDrawsANewMaskAndTheSameSeedAndStepTheSameMask) {
  const ir::Program prog = load(program(0.5));
  ReferenceExecutor<float> a(prog.sequences[0], {{"tokens", 64}});
  ReferenceExecutor<float> b(prog.sequences[0], {{"tokens", 64}});
  const Tensor<float> x = random_tensor<float>(64, kCols, 3);
  a.forward({x});
  b.forward({x});
  EXPECT_EQ(a.dropout_mask("dropout_0"), b.dropout_mask("dropout_0"));
  const std::vector<uint32_t> first = a.dropout_mask("dropout_0");
  EXPECT_EQ(a.dropout_step(), 0u);
  a.step();
  EXPECT_EQ(a.dropout_step(), 1u);
  a.forward({x});
  int64_t differ = 0;
  for (size_t w = 0; w < first.size(); ++w)
    differ += std::popcount(first[w] ^ a.dropout_mask("dropout_0")[w]);
  // Independent masks at p = 0.5 differ in half of the bits.
  EXPECT_GT(differ, 64 * kCols / 4);
  // Another seed, another mask.
  ReferenceExecutor<float> c(load(program(0.5, 99)).sequences[0], {{"tokens", 64}});
  c.forward({x});
  EXPECT_NE(c.dropout_mask("dropout_0"), first);
}

TEST(DropoutReference, BackwardReadsTheSavedMaskNotANewDraw) {
  const double p = 0.4;
  ReferenceExecutor<double> ref(load(program(p)).sequences[0], {{"tokens", 32}},
                                {.round_outputs = false});
  const Tensor<double> x = random_tensor<double>(32, kCols, 4);
  const Tensor<double> y = ref.forward({x})[0];
  // The step moves on before backward: a redrawn mask would be the next step's.
  ref.step();
  const Tensor<double> dy = random_tensor<double>(32, kCols, 5);
  const Tensor<double> dx = ref.backward({dy}).inputs[0];
  const double scale = 1.0 / (1.0 - p);
  for (size_t i = 0; i < y.data.size(); ++i) {
    if (y.data[i] == 0.0) {
      ASSERT_EQ(dx.data[i], 0.0) << i;
    } else {
      ASSERT_EQ(y.data[i], x.data[i] * scale) << i;
      ASSERT_EQ(dx.data[i], dy.data[i] * scale) << i;
    }
  }
}

TEST(DropoutReference, PZeroAndInferenceAreTheIdentity) {
  const Tensor<float> x = random_tensor<float>(16, kCols, 6);
  ReferenceExecutor<float> none(load(program(0.0)).sequences[0], {{"tokens", 16}});
  EXPECT_EQ(none.forward({x})[0].data, x.data);
  for (uint32_t word : none.dropout_mask("dropout_0")) EXPECT_EQ(word, 0xffffffffu);
  ReferenceExecutor<float> eval(load(program(0.5)).sequences[0], {{"tokens", 16}});
  EXPECT_EQ(eval.forward_inference({x})[0].data, x.data);
  EXPECT_NE(eval.forward({x})[0].data, x.data);
}

TEST(DropoutReference, UnusedBitsOfARowsLastWordAreZero) {
  ReferenceExecutor<float> ref(load(program(0.0, 1, 40)).sequences[0], {{"tokens", 3}});
  ref.forward({random_tensor<float>(3, 40, 7)});
  EXPECT_EQ(ref.dropout_mask("dropout_0"),
            (std::vector<uint32_t>{0xffffffffu, 0xffu, 0xffffffffu, 0xffu, 0xffffffffu, 0xffu}));
}

// ---- the front end and the passes ---------------------------------------------------------------

std::string first_error(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  (void)load_program_from_source("bad.fuse", text, sources, diags);
  return diags.has_errors() ? diags.format_all() : "";
}

TEST(DropoutFrontEnd, BadAttributesAreLocatedErrors) {
  const std::string head = "sequence s(x: bf16[t, 64]) -> (y: bf16[t, 64]) {\n  ";
  EXPECT_TRUE(test::contains(first_error(head + "dropout(p = 1.5)\n}\n"),
                             "bad.fuse:2:15: error: p = 1.5 is out of range"))
      << first_error(head + "dropout(p = 1.5)\n}\n");
  EXPECT_TRUE(test::contains(first_error(head + "dropout(1.0)\n}\n"),
                             "bad.fuse:2:11: error: dropout p = 1 drops every element"))
      << first_error(head + "dropout(1.0)\n}\n");
  EXPECT_TRUE(
      test::contains(first_error(head + "dropout(seed = -1)\n}\n"), "seed = -1 is out of range"));
  EXPECT_TRUE(test::contains(
      first_error("sequence s(x: bf16[t, n]) -> (y: bf16[t, n]) {\n  dropout()\n}\n"),
      "dropout needs a known last dimension"));
  // p = 1 - 2^-33: p * 2^32 rounds up to 2^32 (nothing would be kept); 1 - 2^-32 keeps the
  // elements whose word is 0xffffffff. A NaN p (if an expression makes one) is refused too.
  EXPECT_TRUE(test::contains(first_error(head + "dropout(p = 0.99999999988358467)\n}\n"),
                             "drops every element"));
  EXPECT_EQ(first_error(head + "dropout(p = 0.99999999976716936)\n}\n"), "");
  EXPECT_TRUE(test::contains(first_error(head + "dropout(p = 0.0 / 0.0)\n}\n"), "error"));
}

ir::Program through_passes(const std::string& text, bool fused = true) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Passes;
  if (!fused) options.disabled_passes = {"fuse-forward", "fuse-backward"};
  driver::CompileResult result = driver::compile_source("d.fuse", text, sources, diags, options);
  EXPECT_TRUE(result.ok()) << diags.format_all() << result.error;
  return std::move(result.program);
}

constexpr const char* kTwoDropouts = R"(
sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 96]) {
  gelu()
  dropout(0.1)
  dropout(0.1)
  relu()
  linear(64, 96)
}
)";

TEST(DropoutPasses, NoPassMergesComposesOrFusesADropout) {
  const ir::Program prog = through_passes(kTwoDropouts);
  ASSERT_EQ(prog.sequences.size(), 1u);
  std::vector<std::string> forward, backward;
  for (const ir::Operation& op : prog.sequences[0].ops) {
    if (op.kind == ir::OpKind::Dropout) forward.push_back(op.instance);
    if (op.kind == ir::OpKind::DropoutBackward) backward.push_back(op.instance);
    for (const ir::Operation& part : op.parts) {
      EXPECT_NE(part.kind, ir::OpKind::Dropout) << "fused into " << op.instance;
      EXPECT_NE(part.kind, ir::OpKind::DropoutBackward) << "fused into " << op.instance;
    }
  }
  EXPECT_EQ(forward, (std::vector<std::string>{"dropout_0", "dropout_1"}));
  EXPECT_EQ(backward, (std::vector<std::string>{"dropout_1", "dropout_0"}));
}

// ---- codegen ------------------------------------------------------------------------------------

const codegen::LaunchStep* launch_of(const codegen::Plan& plan, const codegen::Step& step,
                                     const std::string& template_name) {
  const auto* launch = std::get_if<codegen::LaunchStep>(&step.body);
  if (launch == nullptr || plan.find_kernel(launch->kernel)->template_name != template_name)
    return nullptr;
  return launch;
}

TEST(DropoutCodegen, TrainingLaunchInferenceVariantBackwardAndStepAdvance) {
  for (const bool variants : {true, false}) {
    SourceManager sources;
    DiagnosticEngine diags(sources);
    driver::CompileOptions options;
    options.last_stage = driver::Stage::Plan;
    // Without the pass, dropout's inference forward is still the identity.
    if (!variants) options.disabled_passes = {"inference-variants"};
    driver::CompileResult result =
        driver::compile_source("d.fuse", kTwoDropouts, sources, diags, options);
    ASSERT_TRUE(result.ok()) << diags.format_all() << result.error;
    const codegen::Plan& plan = result.plan;
    const codegen::SequencePlan& s = plan.sequences.at(0);
    int forward = 0, backward = 0, advances = 0;
    for (const codegen::Step& step : s.steps) {
      if (const auto* fwd = launch_of(plan, step, "dropout_fwd")) {
        ++forward;
        EXPECT_EQ(fwd->name_expression, "opfuse::dropout_fwd<__nv_bfloat16, true>");
        bool reads_step = false, writes_mask = false;
        for (const codegen::ParamBinding& p : fwd->params) {
          reads_step |= p.field == "step" && p.kind == plan::ParamKind::DropoutStep;
          writes_mask |= p.field == "mask" && p.kind == plan::ParamKind::Buffer && p.written;
        }
        EXPECT_TRUE(reads_step);
        EXPECT_TRUE(writes_mask);
        ASSERT_TRUE(step.inference.has_value());
        EXPECT_EQ(step.inference->launch.name_expression,
                  "opfuse::dropout_fwd<__nv_bfloat16, false>");
        for (const codegen::ParamBinding& p : step.inference->launch.params)
          if (p.field == "mask") {
            EXPECT_EQ(p.kind, plan::ParamKind::Null);
          }
      }
      if (launch_of(plan, step, "dropout_bwd") != nullptr) {
        ++backward;
        EXPECT_EQ(step.phase, ir::Phase::Backward);
      }
      if (const auto* advance = launch_of(plan, step, "dropout_advance_step")) {
        ++advances;
        EXPECT_EQ(step.group, -1) << "end_step() runs it";
        EXPECT_EQ(advance->name_expression, "opfuse::dropout_advance_step<>");
      }
    }
    EXPECT_EQ(forward, 2);
    EXPECT_EQ(backward, 2);
    EXPECT_EQ(advances, 1) << "one counter per sequence";
  }
}

TEST(DropoutCodegen, PlanJsonNamesTheStepCounterAndReadsBackExactly) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Plan;
  const driver::CompileResult result =
      driver::compile_source("d.fuse", kTwoDropouts, sources, diags, options);
  ASSERT_TRUE(result.ok()) << diags.format_all() << result.error;
  const std::string text = plan::plan_json_text(result.plan);
  EXPECT_TRUE(test::contains(text, "\"kind\": \"dropout_step\"")) << text;
  EXPECT_EQ(plan::plan_json_text(plan::plan_from_json(plan::plan_to_json(result.plan))), text);
}

TEST(DropoutCodegen, ARowThatIsNotWholeRunsOfEightIsALocatedError) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Plan;
  const driver::CompileResult result = driver::compile_source(
      "w.fuse", "sequence s(x: fp32[t, 12]) -> (y: fp32[t, 12]) {\n  dropout()\n}\n", sources,
      diags, options);
  EXPECT_FALSE(result.ok());
  const std::string text = diags.format_all() + result.error;
  EXPECT_TRUE(test::contains(text, "w.fuse:2:3")) << text;
  EXPECT_TRUE(test::contains(text, "not a multiple of 8")) << text;
}

TEST(DropoutCodegen, KernelsCompileWithNvrtc) {
  jit::CompileRequest request;
  request.kernel_name = "dropout_check";
  request.source = "#include \"dropout.cuh\"\n";
  request.name_expressions = {"opfuse::dropout_fwd<__nv_bfloat16, true>",
                              "opfuse::dropout_fwd<__nv_bfloat16, false>",
                              "opfuse::dropout_fwd<float, true>", "opfuse::dropout_bwd<__half>",
                              "opfuse::dropout_advance_step<>"};
  request.arch = "sm_90a";
  const jit::CompiledKernel compiled = jit::compile_kernel(request);
  EXPECT_FALSE(compiled.binary.empty());
  EXPECT_EQ(compiled.lowered_names.size(), request.name_expressions.size());
}

}  // namespace
}  // namespace opfuse
