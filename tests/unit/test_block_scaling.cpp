// float8_block_scaling end to end on the CPU (docs/language.md, "float8_block_scaling"): the
// recipe and its specs, the plan (block casts, scale-grid buffers, the GEMMs that read them) and
// the CPU reference's block casts and block GEMMs. The numerics of one block are
// test_block_quantization.cpp's; the GPU's kernels and GEMMs against these are the gpu tests'.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/plan.h"
#include "cpu/block_quantization.h"
#include "cpu/numerics.h"
#include "driver/compile.h"
#include "plan/quant_spec.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "support/diagnostics.h"

namespace opfuse {
namespace {

using plan::ScalingKind;

constexpr const char* kMlp = R"(
recipe blocks = float8_block_scaling()
recipe hybrid_blocks = float8_block_scaling(format = hybrid, power_of_2_scale = false, amax_epsilon = 1e-6)
recipe row_weights = float8_block_scaling(w_block = 1, x_block = 2)
recipe current = current_scaling(format = e4m3)
recipe plain = bf16()
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses blocks {
  layernorm(256)
  linear(256, 384, bias = true) as fc1
  gelu()
  linear(384, 256, bias = false) as fc2
}
)";

// One linear, no norm before it to squash an outlier of its input.
constexpr const char* kOne = R"(
recipe blocks = float8_block_scaling()
recipe current = current_scaling(format = e4m3)
recipe plain = bf16()
sequence one(x: bf16[tokens, 256]) -> (y: bf16[tokens, 128]) uses blocks {
  linear(256, 128, bias = false) as fc
}
)";

// `text` (kMlp: mlp.fuse, kOne: one.fuse) through the plan, under `recipe` ("": its own `uses`).
driver::CompileResult compile(const std::string& recipe, const char* text = kMlp) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.recipe = recipe;
  options.last_stage = driver::Stage::Plan;
  return driver::compile_source(text == kOne ? "one.fuse" : "mlp.fuse", text, sources, diags,
                                options);
}

driver::CompileResult compile_one(const std::string& recipe) { return compile(recipe, kOne); }

// The name by value: GCC 13's -Wdangling-reference (note in test_quantized_boundary.cpp).
const plan::QuantizerPlan& quantizer(const plan::SequencePlan& s, std::string_view name) {
  for (const plan::QuantizerPlan& q : s.quantizers)
    if (q.name == name) return q;
  throw std::runtime_error("no quantizer " + std::string(name));
}

size_t launches_of(const plan::Plan& p, const std::string& template_name) {
  size_t n = 0;
  for (const plan::Step& step : p.sequences.at(0).steps)
    if (const auto* l = std::get_if<plan::LaunchStep>(&step.body))
      n += p.find_kernel(l->kernel)->template_name == template_name;
  return n;
}

// The first launch of a template (a test failure where there is none).
plan::LaunchStep launch_of(const plan::Plan& p, const std::string& template_name) {
  for (const plan::Step& step : p.sequences.at(0).steps)
    if (const auto* l = std::get_if<plan::LaunchStep>(&step.body))
      if (p.find_kernel(l->kernel)->template_name == template_name) return *l;
  ADD_FAILURE() << "no launch of " << template_name;
  return {};
}

std::vector<std::string> texts(const std::vector<plan::SymExpr>& shape) {
  std::vector<std::string> out;
  out.reserve(shape.size());
  for (const plan::SymExpr& d : shape) out.push_back(d.text());
  return out;
}

TEST(BlockScaling, TheRecipeGivesEachTensorItsBlocks) {
  const driver::CompileResult r = compile("");
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  const plan::SequencePlan& s = r.plan.sequences.at(0);
  EXPECT_EQ(s.recipe,
            "float8_block_scaling(format = e4m3, x_block = 1, w_block = 2, grad_block = 1, "
            "power_of_2_scale = true, amax_epsilon = 0)");
  const plan::QuantSpec& x = quantizer(s, "fc1.input").spec;
  EXPECT_EQ(x.scaling, ScalingKind::Block1D);
  EXPECT_EQ(x.block, (plan::BlockShape{1, 128}));
  EXPECT_EQ(x.format, plan::DType::E4M3);
  EXPECT_TRUE(x.power_of_2_scale);
  const plan::QuantSpec& w = quantizer(s, "fc1.weight").spec;
  EXPECT_EQ(w.scaling, ScalingKind::Block2D);
  EXPECT_EQ(w.block, (plan::BlockShape{128, 128}));
  EXPECT_EQ(quantizer(s, "fc2.grad_output").spec.scaling, ScalingKind::Block1D);
  EXPECT_EQ(quantizer(s, "fc2.grad_output").spec.format, plan::DType::E4M3);

  const driver::CompileResult h = compile("hybrid_blocks");
  ASSERT_EQ(h.status, driver::CompileStatus::Ok) << h.error;
  const plan::QuantSpec& g = quantizer(h.plan.sequences.at(0), "fc2.grad_output").spec;
  EXPECT_EQ(g.format, plan::DType::E5M2) << "hybrid: E5M2 gradients";
  EXPECT_FALSE(g.power_of_2_scale);
  EXPECT_EQ(g.epsilon, 1e-6);

  const driver::CompileResult rw = compile("row_weights");
  ASSERT_EQ(rw.status, driver::CompileStatus::Ok) << rw.error;
  EXPECT_EQ(quantizer(rw.plan.sequences.at(0), "fc1.input").spec.scaling, ScalingKind::Block2D);
  EXPECT_EQ(quantizer(rw.plan.sequences.at(0), "fc1.weight").spec.scaling, ScalingKind::Block1D);
}

// Every FP8 copy has a grid buffer of the layout cuBLASLt reads (note "Block scale grids"); each
// cast is one launch writing the copies and their grids: block_cast_transpose, or the activation's
// kernel where the cast folds into it (forward and backward, templates/block_activation.cuh); the
// norm writes its output's row-wise copy (norm_block_cast), a column-only block_cast_transpose the
// column-wise one; and no quantizer state is updated after the step.
TEST(BlockScaling, ThePlanCastsInOneKernelAndGivesEveryCopyItsGrid) {
  const driver::CompileResult r = compile("");
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  const plan::SequencePlan& s = r.plan.sequences.at(0);
  EXPECT_EQ(launches_of(r.plan, "block_cast_transpose"), 4u)
      << "fc1's x (column-wise only), both W, fc2's dy";
  EXPECT_EQ(launches_of(r.plan, "layernorm_block_fwd"), 1u) << "fc1's x, row-wise";
  EXPECT_EQ(launches_of(r.plan, "layernorm_fwd"), 0u);
  EXPECT_EQ(launches_of(r.plan, "block_activation_fwd"), 1u) << "fc2's x, the GELU's output";
  EXPECT_EQ(launches_of(r.plan, "block_activation_bwd"), 1u) << "fc1's dy, the GELU's gradient";
  EXPECT_EQ(launches_of(r.plan, "activation_fwd") + launches_of(r.plan, "activation_bwd"), 0u);
  // The fused activations stage 32 KiB per input in shared memory (templates/README.md,
  // "Block-scaled activations"): the GELU forward one input, its backward two (dy, x) and the
  // warps' column sums of fc1's bias gradient.
  EXPECT_EQ(launch_of(r.plan, "block_activation_fwd").dynamic_smem_bytes, 32 * 1024);
  EXPECT_EQ(launch_of(r.plan, "block_activation_bwd").dynamic_smem_bytes, 64 * 1024 + 128 * 8 * 4);
  EXPECT_EQ(launches_of(r.plan, "cast_transpose"), 0u);
  EXPECT_EQ(launches_of(r.plan, "update_scales"), 0u);
  EXPECT_EQ(launches_of(r.plan, "amax_reduce"), 0u);
  for (const plan::Step& step : s.steps) EXPECT_NE(step.pattern, "norm_cast") << step.what;
  EXPECT_EQ(s.steps.at(0).pattern, "norm_block_cast");
  EXPECT_EQ(s.steps.at(1).pattern, "norm_block_cast");

  std::set<std::vector<std::string>> grids;
  for (const plan::Buffer& b : s.buffers) {
    if (b.quantizer < 0) continue;
    ASSERT_GE(b.scale_inv.buffer, 0) << b.name << " has no grid";
    EXPECT_LT(b.scale_inv.quantizer, 0) << b.name;
    const plan::Buffer& g = s.buffers.at(size_t(b.scale_inv.buffer));
    EXPECT_EQ(g.dtype, plan::DType::FP32);
    EXPECT_EQ(g.name, b.name + ".scale_inv");
    EXPECT_EQ(g.first_use, b.first_use) << "written by the cast that writes " << b.name;
    grids.insert(texts(g.shape));
  }
  // fc1.input [tokens, 256]: rowwise 1-D [2][roundup(tokens, 4)], transposed [256, tokens]:
  // [ceil(tokens / 128)][256]; fc1.weight [384, 256] 2-D: [3][4], transposed [256, 384]: [2][4].
  EXPECT_TRUE(grids.count({"2", "ceil_div(tokens, 4) * 4"}));
  EXPECT_TRUE(grids.count({"ceil_div(tokens, 128)", "256"}));
  EXPECT_TRUE(grids.count({"3", "4"}));
  EXPECT_TRUE(grids.count({"2", "4"}));

  size_t gemms = 0;
  for (const plan::Step& step : s.steps) {
    const auto* g = std::get_if<plan::GemmStep>(&step.body);
    if (g == nullptr) continue;
    ++gemms;
    EXPECT_FALSE(g->fast_accum) << step.what;
    for (const plan::GemmOperand* o : {&g->a, &g->b}) {
      ASSERT_GE(o->scale_inv.buffer, 0) << step.what;
      EXPECT_EQ(s.buffers.at(size_t(o->buffer)).scale_inv.buffer, o->scale_inv.buffer);
      EXPECT_NE(std::find(step.reads.begin(), step.reads.end(), o->scale_inv.buffer),
                step.reads.end())
          << step.what << " reads its grid";
    }
  }
  EXPECT_EQ(gemms, 6u);
}

// cuBLASLt 13 runs no block-scaled GEMM with the GELU_AUX_BIAS epilogue: the GELU that the
// fprop's epilogue computes under per-tensor scaling stays a kernel under block scaling.
TEST(BlockScaling, TheGeluStaysAKernelOfItsOwn) {
  auto has_gelu_epilogue = [](const driver::CompileResult& r) {
    for (const plan::Step& step : r.plan.sequences.at(0).steps)
      if (const auto* g = std::get_if<plan::GemmStep>(&step.body))
        if (g->epilogue == plan::GemmEpilogue::GeluAuxBias) return true;
    return false;
  };
  const driver::CompileResult blocks = compile(""), current = compile("current");
  ASSERT_EQ(blocks.status, driver::CompileStatus::Ok) << blocks.error;
  ASSERT_EQ(current.status, driver::CompileStatus::Ok) << current.error;
  EXPECT_FALSE(has_gelu_epilogue(blocks));
  EXPECT_TRUE(has_gelu_epilogue(current));
}

// An inference forward makes no column-wise copy: the GELU's fused block_activation_fwd drops the
// transposed copy and its grid (kWriteTranspose = false); the norm drops the 16-bit output the
// column-wise cast reads (kWriteColumnwiseSource = false), and that cast runs nothing (an empty
// grid, the trained kernel: none is compiled only to be skipped).
TEST(BlockScaling, TheInferenceVariantDropsTheTransposedCopyAndItsGrid) {
  const driver::CompileResult r = compile("");
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  const plan::SequencePlan& s = r.plan.sequences.at(0);
  auto named = [&](const plan::Step& step, int id) {
    std::vector<int> ids = step.writes;
    ids.insert(ids.end(), step.reads.begin(), step.reads.end());
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  size_t variants = 0;
  int source = -1;
  for (const plan::Step& step : s.steps) {
    if (!step.inference) continue;
    const auto& launch = step.inference->launch;
    const auto& kernel = *r.plan.find_kernel(launch.kernel);
    const auto& trained = std::get<plan::LaunchStep>(step.body);
    ++variants;
    if (kernel.template_name == "layernorm_block_fwd") {
      EXPECT_EQ(kernel.template_args.back(), "false") << "kWriteColumnwiseSource";
      for (const plan::ParamBinding& p : trained.params)
        if (p.field == "y_hp") source = p.buffers.at(0);
      ASSERT_GE(source, 0);
      EXPECT_EQ(s.buffers.at(size_t(source)).role, plan::BufferRole::Workspace);
      for (const plan::ParamBinding& p : launch.params) {
        if (p.field == "y_hp") {
          EXPECT_EQ(p.kind, plan::ParamKind::Null);
        }
        if (p.field == "y" || p.field == "y_scale_inv") {
          EXPECT_EQ(p.kind, plan::ParamKind::Buffer) << p.field;
        }
      }
      EXPECT_EQ(std::find(step.inference->writes.begin(), step.inference->writes.end(), source),
                step.inference->writes.end());
      EXPECT_EQ(step.inference->writes.size() + 1, step.writes.size());
      continue;
    }
    if (kernel.template_name == "block_cast_transpose") {
      EXPECT_EQ(launch.grid.x.value(), std::optional<int64_t>(0)) << step.what;
      EXPECT_EQ(launch.kernel, trained.kernel) << "no kernel compiled only to be skipped";
      EXPECT_TRUE(named(step, source)) << "the column-wise cast reads the norm's 16-bit output";
      continue;
    }
    ASSERT_EQ(kernel.template_name, "block_activation_fwd") << step.what;
    EXPECT_EQ(kernel.template_args.back(), "false") << "kWriteTranspose";
    for (const plan::ParamBinding& p : launch.params) {
      if (p.field == "y_t" || p.field == "y_t_scale_inv") {
        EXPECT_EQ(p.kind, plan::ParamKind::Null) << p.field;
      }
      if (p.field == "y" || p.field == "y_scale_inv") {
        EXPECT_EQ(p.kind, plan::ParamKind::Buffer) << p.field;
      }
    }
    EXPECT_LT(step.inference->writes.size(), step.writes.size());
  }
  EXPECT_EQ(variants, 3u) << "the norm, fc1's column-wise cast, the GELU (weight casts are cached)";
  // The 16-bit output takes no memory in an inference forward.
  EXPECT_LT(s.buffers.at(size_t(source)).inference.first, 0);
  EXPECT_GE(s.buffers.at(size_t(source)).training.first, 0);
}

// A norm output the program also returns in high precision (make_extra_output) is needed in bf16
// as well as quantized: the cast does not fold into the norm, which writes bf16 as before.
TEST(BlockScaling, ANormOutputReadTwiceStaysUnfused) {
  constexpr const char* kTwice = R"(
recipe blocks = float8_block_scaling()
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256], n: bf16[tokens, 256]) uses blocks {
  layernorm(256)
  make_extra_output(n)
  linear(256, 256, bias = false) as fc
}
)";
  const driver::CompileResult r = compile("", kTwice);
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  EXPECT_EQ(launches_of(r.plan, "layernorm_block_fwd"), 0u);
  EXPECT_EQ(launches_of(r.plan, "layernorm_fwd"), 1u);
}

// An fp32 norm fuses too (an fp32 1 x 128 block spans the 32 lanes of one slot): one
// rmsnorm_block_fwd with the fp32 source for the column-wise cast, which keeps its own launch.
TEST(BlockScaling, AnFp32NormWritesItsRowwiseCopy) {
  constexpr const char* kFp32 = R"(
recipe blocks = float8_block_scaling()
sequence mlp(x: fp32[tokens, 256]) -> (y: fp32[tokens, 256]) uses blocks {
  rmsnorm(256)
  linear(256, 256, bias = false) as fc
}
)";
  const driver::CompileResult r = compile("", kFp32);
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  EXPECT_EQ(launches_of(r.plan, "rmsnorm_block_fwd"), 1u);
  EXPECT_EQ(launches_of(r.plan, "rmsnorm_fwd"), 0u);
  EXPECT_EQ(launches_of(r.plan, "block_cast_transpose"), 3u)
      << "fc's x (column-wise only), W and dy";
  bool fp32_source = false;
  for (const plan::Kernel& k : r.plan.kernels) {
    if (k.template_name == "rmsnorm_block_fwd") fp32_source = k.template_args.at(0) == "float";
  }
  EXPECT_TRUE(fp32_source) << "the kernel is instantiated for fp32 inputs";
}

// The CPU reference's block GEMM is TE's semantics over the block casts of its operands: the
// fprop of one linear recomputed from cpu::block_quantize_* and cpu::block_scaled_gemm.
TEST(BlockScaling, TheReferenceFpropIsTheBlockGemmOfTheBlockCasts) {
  const driver::CompileResult r = compile_one("");
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  cpu::ReferenceExecutor<float> ref(r.program.sequences.at(0), {{"tokens", 40}});
  cpu::init_params_from_seed(ref, 11);
  cpu::Tensor<float> x = cpu::seeded_normal({40, 256}, 5, 1.0);
  x.data[3] = 900.0f;  // an outlier: its block gets a small scale, the others keep theirs
  for (float& v : x.data) v = cpu::bf16_to_float(cpu::float_to_bf16(v));  // a bf16 input
  const std::vector<cpu::Tensor<float>> y = ref.forward({x});
  const std::vector<float> xs(x.data.begin(), x.data.end());
  const cpu::Tensor<float>& w = ref.param("fc.weight");
  cpu::BlockQuantParams one_d;
  cpu::BlockQuantParams two_d;
  two_d.two_d = true;
  const auto qx = cpu::block_quantize_rowwise(xs, 40, 256, one_d);
  const auto qw = cpu::block_quantize_rowwise(w.data, 128, 256, two_d);
  std::vector<float> want =
      cpu::block_scaled_gemm(qx, false, qw, true, cpu::Fp8Format::E4M3, cpu::Fp8Format::E4M3);
  for (float& v : want) v = cpu::bf16_to_float(cpu::float_to_bf16(v));  // y is stored in bf16
  EXPECT_EQ(y.at(0).data, want);
}

// What block scaling is for: one outlier costs precision only in its own block. Against the BF16
// product, the rows without the outlier stay close under block scaling; under per-tensor current
// scaling the outlier sets the one scale, and their values fall into E4M3's subnormals.
TEST(BlockScaling, AnOutlierCostsLessThanUnderPerTensorScaling) {
  const cpu::Bindings bindings{{"tokens", 64}};
  cpu::Tensor<float> x = cpu::seeded_normal({64, 256}, 9, 1.0);
  x.data[130] = 2.0e5f;
  for (float& v : x.data) v = cpu::bf16_to_float(cpu::float_to_bf16(v));
  auto run = [&](const std::string& recipe) {
    const driver::CompileResult r = compile_one(recipe);
    EXPECT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
    cpu::ReferenceExecutor<float> ref(r.program.sequences.at(0), bindings);
    cpu::init_params_from_seed(ref, 21);
    return ref.forward({x}).at(0).data;
  };
  const std::vector<float> exact = run("plain");
  // Over the rows without the outlier (row 0 holds it).
  auto error = [&](const std::vector<float>& got) {
    double e = 0, n = 0;
    for (size_t i = 128; i < got.size(); ++i) {
      e += (double(got[i]) - exact[i]) * (double(got[i]) - exact[i]);
      n += double(exact[i]) * exact[i];
    }
    return std::sqrt(e / n);
  };
  const double blocks = error(run("")), current = error(run("current"));
  std::cout << "[ errors   ] rows without the outlier vs bf16: blocks " << blocks << ", current "
            << current << "\n";
  EXPECT_LT(blocks, 0.05);
  EXPECT_LT(blocks * 4, current);
}

}  // namespace
}  // namespace opfuse
