// float8_block_scaling emulated on architectures without cuBLASLt's block-scale modes (note
// "Emulated block scaling" in docs/architecture.md; sm_89, sm_100a, sm_120), and on sm_90a when
// the compile options ask: the plan (one emulated_cast per copy with its quantizer's blocks, one
// block_fake_quantize launch each, BF16 GEMMs with the bf16 recipe's epilogues, the inference
// variant), the compile note, fp8_weights, and the CPU reference's GEMMs against the oracle of
// runtime/cpu/block_quantization.h. The kernel against the oracle is
// test_block_fake_quantize_emulated.cpp's (and test_block_emulated_gpu.cpp's on a GPU).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "codegen/plan.h"
#include "cpu/block_quantization.h"
#include "cpu/numerics.h"
#include "driver/compile.h"
#include "jit/nvrtc_compiler.h"
#include "opfuse/program.h"
#include "plan/quant_spec.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "support/diagnostics.h"

namespace opfuse {
namespace {

using plan::ScalingKind;

constexpr const char* kMlp = R"(
recipe blocks = float8_block_scaling()
recipe hybrid_blocks = float8_block_scaling(format = hybrid, power_of_2_scale = false)
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses blocks {
  layernorm(256)
  linear(256, 384, bias = true) as fc1
  gelu()
  linear(384, 256, bias = false) as fc2
}
)";

// One linear on the input itself: its fprop, dgrad and wgrad recomputed from the oracle.
constexpr const char* kOne = R"(
recipe blocks = float8_block_scaling(format = hybrid)
sequence one(x: bf16[tokens, 256]) -> (y: bf16[tokens, 128]) uses blocks {
  linear(256, 128, bias = false) as fc
}
)";

constexpr const char* kWeights = R"(
recipe blocks = float8_block_scaling()
sequence fc(x: bf16[tokens, 256]) -> (y: bf16[tokens, 128]) uses blocks with fp8_weights {
  linear(256, 128, bias = false) as fc
}
)";

struct Compiled {
  driver::CompileResult result;
  std::string diagnostics;
};

Compiled compile(const std::string& arch, bool force = false, const char* text = kMlp,
                 const std::string& recipe = "", driver::Stage last_stage = driver::Stage::Plan) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.arch = arch;
  options.emulate_block_scaling = force;
  options.recipe = recipe;
  options.last_stage = last_stage;
  Compiled c;
  c.result = driver::compile_source("mlp.fuse", text, sources, diags, options);
  c.diagnostics = diags.format_all() + c.result.error;
  return c;
}

std::vector<const plan::LaunchStep*> launches(const plan::Plan& p, const std::string& name) {
  std::vector<const plan::LaunchStep*> out;
  for (const plan::Step& step : p.sequences.at(0).steps)
    if (const auto* l = std::get_if<plan::LaunchStep>(&step.body))
      if (p.find_kernel(l->kernel)->template_name == name) out.push_back(l);
  return out;
}

size_t count_ops(const ir::Sequence& s, ir::OpKind kind) {
  size_t n = 0;
  for (const ir::Operation& op : s.ops) {
    n += op.kind == kind;
    for (const ir::Operation& part : op.parts) n += part.kind == kind;
  }
  return n;
}

bool has_gelu_epilogue(const plan::Plan& p) {
  for (const plan::Step& step : p.sequences.at(0).steps)
    if (const auto* g = std::get_if<plan::GemmStep>(&step.body))
      if (g->epilogue == plan::GemmEpilogue::GeluAuxBias) return true;
  return false;
}

// Every GEMM operand is a decoded BF16 copy: no FP8, no scale grid, no quantizer scale.
void expect_bf16_gemms(const plan::Plan& p, const std::string& what) {
  size_t gemms = 0;
  for (const plan::Step& step : p.sequences.at(0).steps) {
    const auto* g = std::get_if<plan::GemmStep>(&step.body);
    if (g == nullptr) continue;
    ++gemms;
    for (const plan::GemmOperand* o : {&g->a, &g->b}) {
      EXPECT_EQ(o->dtype, plan::DType::BF16) << what << ": " << step.what;
      EXPECT_LT(o->scale_inv.quantizer, 0) << what << ": " << step.what;
      EXPECT_LT(o->scale_inv.buffer, 0) << what << ": " << step.what;
    }
  }
  EXPECT_EQ(gemms, 6u) << what;
}

// Where cuBLASLt has no 1x128 / 128x128 modes the program still compiles: every copy is an
// emulated_cast under its quantizer's block spec (the weights' one 128 x 128 copy serving fprop
// and dgrad), each a block_fake_quantize launch with those blocks, and the GEMMs are BF16 with the
// bf16 recipe's GELU epilogue; a note says so at the sequence.
TEST(BlockScalingEmulated, ArchitecturesWithoutBlockModesRunItEmulated) {
  for (const char* arch : {"sm_100a", "sm_89", "sm_120"}) {
    SCOPED_TRACE(arch);
    const Compiled c = compile(arch);
    ASSERT_TRUE(c.result.ok()) << c.diagnostics;
    const ir::Sequence& s = c.result.program.sequences.at(0);
    EXPECT_TRUE(s.emulate_block_scaling);
    EXPECT_EQ(count_ops(s, ir::OpKind::CastFp8), 0u);
    EXPECT_EQ(count_ops(s, ir::OpKind::EmulatedCast), 10u)
        << "per linear: x, x^T, one copy of W, dy, dy^T";
    std::map<std::string, int> copies;  // quantizer -> emulated casts
    for (const ir::Operation& op : s.ops) {
      if (op.kind != ir::OpKind::EmulatedCast) continue;
      const ir::QuantizerDecl& q = s.quantizers.at(size_t(op.quantizer));
      ++copies[q.name];
      EXPECT_EQ(q.columnwise_layout, plan::CopyLayout::AsIs) << q.name;
      EXPECT_EQ(s.value(op.results.at(0)).type, s.value(op.operands.at(0)).type) << q.name;
      EXPECT_EQ(s.value(op.results.at(0)).quantizer, -1) << "a high-precision value";
      if (q.role == ir::QuantizerRole::Weight) {
        EXPECT_EQ(q.spec.scaling, ScalingKind::Block2D) << q.name;
        EXPECT_EQ(q.spec.block, (plan::BlockShape{128, 128})) << q.name;
        EXPECT_TRUE(q.usages.rowwise && q.usages.columnwise) << q.name;
      } else {
        EXPECT_EQ(q.spec.scaling, ScalingKind::Block1D) << q.name;
        EXPECT_EQ(q.spec.block, (plan::BlockShape{1, 128})) << q.name;
      }
      EXPECT_TRUE(q.spec.power_of_2_scale) << "the recipe's default";
    }
    for (const char* name : {"fc1.input", "fc1.grad_output", "fc2.input", "fc2.grad_output"})
      EXPECT_EQ(copies[name], 2) << name;
    for (const char* name : {"fc1.weight", "fc2.weight"}) EXPECT_EQ(copies[name], 1) << name;

    // The launches: 1 x 128 row-wise, 128 x 1 column-wise (not transposed), 128 x 128 weights.
    std::map<std::string, int> by_blocks;
    for (const plan::LaunchStep* l : launches(c.result.plan, "block_fake_quantize")) {
      const plan::Kernel& k = *c.result.plan.find_kernel(l->kernel);
      ASSERT_GE(k.template_args.size(), 2u) << l->name_expression;
      ++by_blocks[k.template_args.size() > 2 ? k.template_args[2] : "0"];  // kBlocks' default
      EXPECT_EQ(k.template_args[1], "__nv_fp8_e4m3") << l->name_expression;
    }
    EXPECT_EQ(by_blocks["0"], 4) << "x and dy of each linear, 1 x 128";
    EXPECT_EQ(by_blocks["1"], 4) << "x^T and dy^T of each linear, 128 x 1";
    EXPECT_EQ(by_blocks["2"], 2) << "each weight once, 128 x 128";
    EXPECT_TRUE(launches(c.result.plan, "block_cast_transpose").empty());
    expect_bf16_gemms(c.result.plan, arch);
    EXPECT_TRUE(has_gelu_epilogue(c.result.plan)) << "BF16 GEMMs take the GELU epilogue";
    EXPECT_NE(c.diagnostics.find(fmt::format(
                  "mlp.fuse:4:10: note: sequence 'mlp' runs float8_block_scaling emulated on {} "
                  "(cuBLASLt has no 1x128 / 128x128 block-scale GEMM there)",
                  arch)),
              std::string::npos)
        << c.diagnostics;
  }
}

// Every kernel of the emulated program compiles to a cubin for the architectures that run it
// (NVRTC: the plan's own kernel sources, block_fake_quantize's three block shapes among them).
TEST(BlockScalingEmulated, ThePlansKernelsCompileForThoseArchitectures) {
  for (const char* arch : {"sm_100a", "sm_89"}) {
    SCOPED_TRACE(arch);
    const Compiled c = compile(arch, false, kMlp, "hybrid_blocks", driver::Stage::KernelRequests);
    ASSERT_TRUE(c.result.ok()) << c.diagnostics;
    size_t block_kernels = 0;
    for (const driver::KernelRequest& k : c.result.kernels) {
      jit::CompileRequest request;
      request.kernel_name = k.kernel_name;
      request.source = k.source;
      request.name_expressions = k.name_expressions;
      request.arch = k.arch;
      EXPECT_EQ(k.arch, arch);
      jit::CompiledKernel compiled;
      try {
        compiled = jit::compile_kernel(request);
      } catch (const jit::JitError& error) {
        ADD_FAILURE() << k.kernel_name << ": " << error.what();
        continue;
      }
      EXPECT_FALSE(compiled.is_ptx) << k.kernel_name;
      EXPECT_EQ(compiled.spill_store_bytes, 0) << k.kernel_name;
      block_kernels += k.name_expressions.front().starts_with("opfuse::block_fake_quantize<");
    }
    // 1 x 128 (e4m3, e5m2), 128 x 1 (e4m3, e5m2), 128 x 128 (e4m3).
    EXPECT_EQ(block_kernels, 5u);
  }
}

// Only a sequence not planned yet is emulated: one planned natively for sm_90a (cast_fp8 copies
// with scale grids) and then compiled for sm_100a is refused at the linear, never turned into a
// GEMM the target cannot run.
TEST(BlockScalingEmulated, ASequencePlannedNativelyIsRefusedElsewhere) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions hopper;
  hopper.last_stage = driver::Stage::Passes;
  driver::CompileResult planned = driver::compile_source("mlp.fuse", kMlp, sources, diags, hopper);
  ASSERT_TRUE(planned.ok()) << diags.format_all();
  driver::CompileOptions blackwell;
  blackwell.arch = "sm_100a";
  blackwell.last_stage = driver::Stage::Plan;
  const driver::CompileResult r =
      driver::compile_ir(std::move(planned.program), &sources, &diags, blackwell);
  EXPECT_FALSE(r.ok());
  const std::string text = diags.format_all() + r.error;
  EXPECT_NE(text.find("mlp.fuse:6:3: error: linear of 'fc1' reads 'fc1.input' quantized as "
                      "block_1d(e4m3, 1x128"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("cuBLASLt on sm_100 has no 1x128 block-scale mode (VEC128_32F)"),
            std::string::npos)
      << text;
}

// HYBRID: the gradients' copies are E5M2, the recipe's FP32 scales reach the kernels.
TEST(BlockScalingEmulated, TheKernelsTakeEachQuantizersFormatAndScaleRule) {
  const Compiled c = compile("sm_100a", false, kMlp, "hybrid_blocks");
  ASSERT_TRUE(c.result.ok()) << c.diagnostics;
  size_t e5m2 = 0;
  for (const plan::LaunchStep* l : launches(c.result.plan, "block_fake_quantize")) {
    const plan::Kernel& k = *c.result.plan.find_kernel(l->kernel);
    e5m2 += k.template_args[1] == "__nv_fp8_e5m2";
    for (const plan::ParamBinding& p : l->params)
      if (p.field == "power_of_2_scale") {
        EXPECT_EQ(p.int_value.value(), 0) << l->name_expression;
      }
  }
  EXPECT_EQ(e5m2, 4u) << "dy and dy^T of each linear";
}

// sm_90a runs the real block-scaled GEMMs; CompileOptions::emulate_block_scaling makes it run the
// emulated path instead (how the GPU tests run it on an H100), and the note says why.
TEST(BlockScalingEmulated, HopperRunsItNativelyUnlessTheOptionsAsk) {
  const Compiled native = compile("sm_90a");
  ASSERT_TRUE(native.result.ok()) << native.diagnostics;
  EXPECT_FALSE(native.result.program.sequences.at(0).emulate_block_scaling);
  EXPECT_EQ(count_ops(native.result.program.sequences.at(0), ir::OpKind::EmulatedCast), 0u);
  EXPECT_FALSE(launches(native.result.plan, "block_cast_transpose").empty());
  EXPECT_TRUE(launches(native.result.plan, "block_fake_quantize").empty());
  EXPECT_EQ(native.diagnostics.find("emulated"), std::string::npos) << native.diagnostics;

  const Compiled forced = compile("sm_90a", true);
  ASSERT_TRUE(forced.result.ok()) << forced.diagnostics;
  EXPECT_EQ(count_ops(forced.result.program.sequences.at(0), ir::OpKind::CastFp8), 0u);
  EXPECT_EQ(launches(forced.result.plan, "block_fake_quantize").size(), 10u);
  EXPECT_TRUE(launches(forced.result.plan, "block_cast_transpose").empty());
  expect_bf16_gemms(forced.result.plan, "forced");
  EXPECT_NE(forced.diagnostics.find("runs float8_block_scaling emulated on sm_90a (as the compile "
                                    "options ask)"),
            std::string::npos)
      << forced.diagnostics;
}

// The embedding API asks for it the same way (opfuse::CompileOptions::emulate_block_scaling): the
// compiled program's plan quantizes with block_fake_quantize and casts nothing for a block GEMM.
TEST(BlockScalingEmulated, TheEmbeddingApiCompileOptionsAskForIt) {
  EXPECT_FALSE(opfuse::CompileOptions{}.emulate_block_scaling) << "native by default";
  opfuse::CompileOptions options;
  options.arch = "sm_90a";
  options.use_cache = false;
  options.emulate_block_scaling = true;
  const opfuse::Program program = opfuse::Program::compile(kMlp, "mlp.fuse", options);
  const std::string plan = program.plan_json();
  EXPECT_NE(plan.find("block_fake_quantize"), std::string::npos);
  EXPECT_EQ(plan.find("block_cast_transpose"), std::string::npos);
}

// An inference forward makes no column-wise copy: those launches run with an empty grid.
TEST(BlockScalingEmulated, TheInferenceVariantMakesNoColumnwiseCopy) {
  const Compiled c = compile("sm_100a");
  ASSERT_TRUE(c.result.ok()) << c.diagnostics;
  size_t dropped = 0;
  for (const plan::Step& step : c.result.plan.sequences.at(0).steps) {
    if (!step.inference) continue;
    const plan::LaunchStep& launch = step.inference->launch;
    if (c.result.plan.find_kernel(launch.kernel)->template_name != "block_fake_quantize") continue;
    ++dropped;
    EXPECT_NE(step.what.find("column-wise copy"), std::string::npos) << step.what;
    EXPECT_EQ(launch.grid.x.value(), 0) << step.what;
    EXPECT_TRUE(step.inference->writes.empty()) << step.what;
  }
  EXPECT_EQ(dropped, 2u) << "x^T of fc1 and fc2 (the weights' copy is read by fprop)";
}

// `with fp8_weights` keeps nothing in FP8 when emulated: a warning, and the weights stay
// parameters (decoded every step).
TEST(BlockScalingEmulated, Fp8WeightsHaveNoEffectWhenEmulated) {
  const Compiled c = compile("sm_100a", false, kWeights);
  ASSERT_TRUE(c.result.ok()) << c.diagnostics;
  EXPECT_FALSE(c.result.plan.sequences.at(0).fp8_weights);
  EXPECT_NE(c.diagnostics.find("warning: fp8_weights has no effect: sequence 'fc' runs "
                               "float8_block_scaling emulated on sm_100a"),
            std::string::npos)
      << c.diagnostics;
  const Compiled native = compile("sm_90a", false, kWeights);
  ASSERT_TRUE(native.result.ok()) << native.diagnostics;
  EXPECT_TRUE(native.result.plan.sequences.at(0).fp8_weights);
}

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = cpu::bf16_to_float(cpu::float_to_bf16(x));
  return v;
}

// Row t scaled by 2^(sign * (t % 21 - 10)). With power-of-2 scales FP8 rounding is the same at
// any scale while values stay normal, so only a range wider than the format's tells blocks apart:
// in a 128 x 1 block the rows 2^20 below its largest flush to zero, in their own 1 x 128 block
// they keep their bits. x and dy scale oppositely, so every token's term of wgrad counts alike.
cpu::Tensor<float> uneven_rows(std::vector<int64_t> shape, uint64_t seed, double stddev, int sign) {
  cpu::Tensor<float> t = cpu::seeded_normal(shape, seed, stddev);
  const int64_t cols = shape.back();
  for (size_t i = 0; i < t.data.size(); ++i)
    t.data[i] = std::ldexp(t.data[i], sign * (int((i / size_t(cols)) % 21) - 10));
  t.data = bf16_rounded(t.data);
  return t;
}

// How far `got` ([m, n]) is from a @ b^T (a [m, k], b [n, k], exact in double), in units of a bf16
// rounding of the result plus fp32 summation (got is an fp32 sum in some order, rounded to bf16).
double worst_gemm_error(const std::vector<float>& got, const std::vector<float>& a,
                        const std::vector<float>& b, int64_t m, int64_t n, int64_t k) {
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, scale = 0;
      for (int64_t l = 0; l < k; ++l) {
        want += double(a[size_t(i * k + l)]) * b[size_t(j * k + l)];
        scale += std::fabs(double(a[size_t(i * k + l)]) * b[size_t(j * k + l)]);
      }
      worst = std::max(worst, std::fabs(double(got[size_t(i * n + j)]) - want) /
                                  (std::fabs(want) * 0x1p-8 + scale * 1e-6 + 1e-30));
    }
  }
  return worst;
}

std::vector<float> transposed(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = v[size_t(r * cols + c)];
  return t;
}

// The CPU reference models the emulated path: fprop, dgrad and wgrad are BF16 GEMMs over the
// oracle's decoded copies (x 1 x 128, W 128 x 128, dy 1 x 128 in E5M2 for dgrad; x and dy 128 x 1
// for wgrad). The same GEMMs over the wrong blocks (row blocks for wgrad's copies) miss.
TEST(BlockScalingEmulated, TheReferenceGemmsReadTheOraclesDecodedCopies) {
  constexpr int64_t kTokens = 256, kIn = 256, kOut = 128;
  const Compiled c = compile("sm_100a", false, kOne, "", driver::Stage::Passes);
  ASSERT_TRUE(c.result.ok()) << c.diagnostics;
  cpu::ReferenceExecutor<float> ref(c.result.program.sequences.at(0), {{"tokens", kTokens}});
  cpu::init_params_from_seed(ref, 11);
  const cpu::Tensor<float> x = uneven_rows({kTokens, kIn}, 5, 1.0, 1);
  const std::vector<cpu::Tensor<float>> y = ref.forward({x});
  const cpu::Tensor<float> dy = uneven_rows({kTokens, kOut}, 6, 0.05, -1);
  const cpu::Gradients<float> grads = ref.backward({dy});
  const std::vector<float> w = ref.param("fc.weight").data;

  cpu::BlockQuantParams forward;  // E4M3, power-of-2 scales, bf16's value_for_inf
  forward.value_for_inf = cpu::bf16_max_finite();
  cpu::BlockQuantParams weight = forward;
  weight.two_d = true;
  cpu::BlockQuantParams gradient = forward;
  gradient.format = cpu::Fp8Format::E5M2;
  auto decoded = [](const std::vector<float>& v, int64_t rows, int64_t cols,
                    const cpu::BlockQuantParams& p, bool columnwise) {
    return bf16_rounded(cpu::block_fake_quantize(v, rows, cols, p, columnwise));
  };
  const std::vector<float> qx = decoded(x.data, kTokens, kIn, forward, false);
  const std::vector<float> qw = decoded(w, kOut, kIn, weight, false);
  const std::vector<float> qdy = decoded(dy.data, kTokens, kOut, gradient, false);
  const std::vector<float> qx_t = decoded(x.data, kTokens, kIn, forward, true);
  const std::vector<float> qdy_t = decoded(dy.data, kTokens, kOut, gradient, true);

  EXPECT_LE(worst_gemm_error(y.at(0).data, qx, qw, kTokens, kOut, kIn), 1.0) << "fprop";
  // dx = dy W: a [tokens, out] by W^T [in, out].
  EXPECT_LE(
      worst_gemm_error(grads.inputs.at(0).data, qdy, transposed(qw, kOut, kIn), kTokens, kIn, kOut),
      1.0)
      << "dgrad";
  // dW = dy^T x: dy^T [out, tokens] by x^T [in, tokens], both copies with 128 x 1 blocks.
  EXPECT_LE(worst_gemm_error(grads.params.at(0).data, transposed(qdy_t, kTokens, kOut),
                             transposed(qx_t, kTokens, kIn), kOut, kIn, kTokens),
            1.0)
      << "wgrad";
  EXPECT_GT(worst_gemm_error(grads.params.at(0).data, transposed(qdy, kTokens, kOut),
                             transposed(qx, kTokens, kIn), kOut, kIn, kTokens),
            1.0)
      << "wgrad over the row-wise copies: the test cannot tell the blocks apart";
}

}  // namespace
}  // namespace opfuse
