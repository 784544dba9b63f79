// Note "Block summaries" (runtime/cpu/block_summary.h): the per-copy summaries `fusec run` prints
// for block-scaled and micro-scaled quantizers, on hand-made tensors whose every block is known:
// zero blocks, ragged edges, padding entries of the scale grids, power-of-2 and exact scales,
// MXFP8's E8M0 and NVFP4's E4M3 block scales (2-D blocks counted once, the Hadamard-transformed
// copy's blocks from the transformed values). The reference executor's summaries of a whole run
// are checked through `fusec run` at the end.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/block_summary.h"
#include "cpu/numerics.h"
#include "driver/compile.h"
#include "gpu/summary_copies.h"
#include "opfuse/error.h"
#include "reference/reference_executor.h"
#include "reference/run_steps.h"
#include "support/diagnostics.h"
#include "test_support.h"

namespace opfuse {
namespace {

using cpu::BlockSummary;

// Row-major [rows, cols] of zeros.
struct Matrix {
  int64_t rows, cols;
  std::vector<float> v;
  Matrix(int64_t r, int64_t c) : rows(r), cols(c), v(size_t(r * c), 0.0f) {}
  float& at(int64_t r, int64_t c) { return v[size_t(r * cols + c)]; }
  Matrix transposed() const {
    Matrix t(cols, rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t.at(c, r) = v[size_t(r * cols + c)];
    return t;
  }
};

BlockSummary summary(int64_t blocks, int64_t zero, float min, float max) {
  return {blocks, zero, min, max};
}

// 3 x 200 with power-of-2 scales: two 1 x 128 blocks per row (the second ragged, 72 wide), and a
// grid padded to 4 rows whose padding (0) must not count as a block's scale_inv.
Matrix ragged() {
  Matrix x(3, 200);
  for (int64_t c = 0; c < 128; ++c) x.at(0, c) = 1.0f;
  x.at(0, 5) = 3.0f;      // block (0, 0): 448 / 3 -> 128
  x.at(1, 0) = 448.0f;    // block (1, 0): scale 1
  x.at(1, 130) = 0.5f;    // block (1, 1): 896 -> 512
  x.at(2, 10) = 7.0f;     // block (2, 0): 64
  x.at(2, 199) = 100.0f;  // block (2, 1): 4.48 -> 4; block (0, 1) is all zero: scale 1
  return x;
}

TEST(BlockSummary, RowwiseBlocksSkipTheGridPaddingAndCountTheZeroBlock) {
  const Matrix x = ragged();
  cpu::BlockQuantParams params;  // E4M3, 1-D, power-of-2 scales
  const cpu::BlockQuantizedCopy copy = cpu::block_quantize_rowwise(x.v, 3, 200, params);
  ASSERT_EQ(copy.scale_inv.size(), 2u * 4u);  // [2 column blocks][3 rows padded to 4]
  EXPECT_EQ(cpu::summarize_block_copy(copy, cpu::Fp8Format::E4M3, false),
            summary(6, 1, 1.0f / 512, 1.0f));
}

// The column-wise copy's blocks run 128 down each column of x: 3 rows make one block per column;
// the 72 columns past 128 are zero but for two.
TEST(BlockSummary, ColumnwiseBlocksRunDownTheColumns) {
  const Matrix x = ragged();
  cpu::BlockQuantParams params;
  const cpu::BlockQuantizedCopy copy = cpu::block_quantize_columnwise(x.v, 3, 200, params);
  // Columns 0 (448: 1), 5 (3: 1/128), 10 (7: 1/64), the other 125 of the first 128 (1: 1/256),
  // 130 (0.5: 1/512), 199 (100: 1/4), 70 zero columns (1).
  EXPECT_EQ(cpu::summarize_block_copy(copy, cpu::Fp8Format::E4M3, false),
            summary(200, 70, 1.0f / 512, 1.0f));
}

TEST(BlockSummary, ScalesThatAreNotPowersOfTwoAreTheExactQuotients) {
  Matrix x(1, 256);
  x.at(0, 0) = 3.0f;
  x.at(0, 200) = 10.0f;
  cpu::BlockQuantParams params;
  params.power_of_2_scale = false;
  const cpu::BlockQuantizedCopy copy = cpu::block_quantize_rowwise(x.v, 1, 256, params);
  EXPECT_EQ(cpu::summarize_block_copy(copy, cpu::Fp8Format::E4M3, false),
            summary(2, 0, 1.0f / (448.0f / 3.0f), 1.0f / (448.0f / 10.0f)));
}

// 130 x 130 in 128 x 128 blocks: four, three of them ragged; both copies hold the same blocks.
TEST(BlockSummary, TwoDimensionalBlocksAreTheSameInBothCopies) {
  Matrix x(130, 130);
  x.at(0, 0) = 448.0f;    // block (0, 0): 1
  x.at(129, 129) = 0.5f;  // block (1, 1): 1/512; blocks (0, 1) and (1, 0) are zero
  cpu::BlockQuantParams params;
  params.two_d = true;
  const cpu::BlockQuantizedCopy rowwise = cpu::block_quantize_rowwise(x.v, 130, 130, params);
  const cpu::BlockQuantizedCopy columnwise = cpu::block_quantize_columnwise(x.v, 130, 130, params);
  EXPECT_EQ(cpu::summarize_block_copy(rowwise, cpu::Fp8Format::E4M3, true),
            summary(4, 2, 1.0f / 512, 1.0f));
  EXPECT_EQ(cpu::summarize_block_copy(columnwise, cpu::Fp8Format::E4M3, true),
            summary(4, 2, 1.0f / 512, 1.0f));
}

TEST(BlockSummary, ACopyWhoseGridDoesNotFitIsRefused) {
  const Matrix x = ragged();
  cpu::BlockQuantizedCopy copy = cpu::block_quantize_rowwise(x.v, 3, 200, {});
  copy.scale_inv.pop_back();
  EXPECT_THROW((void)cpu::summarize_block_copy(copy, cpu::Fp8Format::E4M3, false),
               std::invalid_argument);
}

// A Float8 zero block is told from the copy (header note): codes all zero. With amax_epsilon
// far above a block's values they all round to 0 and the block counts as zero though its amax is
// not (1e-6 under epsilon 1: scale 448 -> 256, 1e-6 * 256 is below E4M3's least subnormal / 2).
TEST(BlockSummary, FarBelowAnEpsilonABlockCountsAsZero) {
  Matrix x(1, 256);
  x.at(0, 3) = 1e-6f;
  x.at(0, 130) = 1.0f;
  cpu::BlockQuantParams params;
  params.epsilon = 1.0f;
  const cpu::BlockQuantizedCopy copy = cpu::block_quantize_rowwise(x.v, 1, 256, params);
  EXPECT_EQ(cpu::summarize_block_copy(copy, cpu::Fp8Format::E4M3, false),
            summary(2, 1, 1.0f / 256, 1.0f / 256));
}

// E8M0 scales 2^(e - 127), e rounded up from amax / 448: a zero block has e = 0 (2^-127, the
// least scale_inv), amax 1 gives 2^-8 (1 / 448 rounds up), 896 gives 2.
TEST(BlockSummary, Mxfp8BlocksOfBothCopies) {
  Matrix x(2, 64);
  x.at(0, 3) = 448.0f;   // block (0, 0): e = 127
  x.at(1, 40) = 1.0f;    // block (1, 1): e = 119
  x.at(1, 7) = -896.0f;  // block (1, 0): e = 128; block (0, 1) is zero
  const BlockSummary expected = summary(4, 1, std::ldexp(1.0f, -127), 2.0f);
  const cpu::Mxfp8Copy rowwise = cpu::mxfp8_quantize(x.v, 2, 64, cpu::Fp8Format::E4M3, false);
  EXPECT_EQ(cpu::summarize_mxfp8_copy(x.v, rowwise), expected);
  // The same blocks down the columns of the transposed tensor.
  const Matrix t = x.transposed();
  const cpu::Mxfp8Copy columnwise = cpu::mxfp8_quantize(t.v, 64, 2, cpu::Fp8Format::E4M3, true);
  EXPECT_EQ(cpu::summarize_mxfp8_copy(t.v, columnwise), expected);
  EXPECT_EQ(cpu::block_shape_name(32, 1), "32x1");
}

// NVFP4: the block scale s_b = e4m3(amax * (S_enc * fl(1/6))); with S_enc = 2688 / 6 = 448, an
// amax of 6 gives 448, 1.5 gives 112, and 1e-6 rounds to 0 although the block is not zero (the
// zero blocks count amax 0 only).
TEST(BlockSummary, Nvfp4BlockScalesAndATinyBlockThatIsNotZero) {
  Matrix x(1, 64);
  x.at(0, 0) = 6.0f;
  x.at(0, 20) = -1.5f;
  x.at(0, 40) = 1e-6f;  // block 3 (48..63) is zero
  const float tensor_scale = cpu::nvfp4_tensor_scale(6.0f);
  ASSERT_EQ(tensor_scale, 448.0f);
  const cpu::Nvfp4Copy copy = cpu::nvfp4_quantize(x.v, 1, 64, tensor_scale, {});
  EXPECT_EQ(cpu::summarize_nvfp4_copy(x.v, copy), summary(4, 1, 0.0f, 448.0f));
}

// 16 x 16 blocks: a 32 x 16 tensor has two, though their scale is stored on 16 rows each.
TEST(BlockSummary, Nvfp4TwoDimensionalBlocksCountOnce) {
  Matrix x(32, 16);
  x.at(3, 4) = 6.0f;  // block (0, 0); block (1, 0) is zero
  cpu::Nvfp4Params params;
  params.two_d = true;
  const cpu::Nvfp4Copy rowwise = cpu::nvfp4_quantize(x.v, 32, 16, 448.0f, params);
  EXPECT_EQ(cpu::summarize_nvfp4_copy(x.v, rowwise), summary(2, 1, 0.0f, 448.0f));
  params.columnwise = true;
  const cpu::Nvfp4Copy columnwise = cpu::nvfp4_quantize(x.v, 32, 16, 448.0f, params);
  EXPECT_EQ(cpu::summarize_nvfp4_copy(x.v, columnwise), summary(2, 1, 0.0f, 448.0f));
}

// The Hadamard-transformed copy's blocks are those of the transformed columns: a lone 4 spreads
// to 16 values of magnitude 1 (amax 1, not 4): with S_enc = 2688 / 4 = 672, s_b = e4m3(1 * 112)
// = 112 where the untransformed block would give 448.
TEST(BlockSummary, Nvfp4HadamardCopyUsesTheTransformedValues) {
  Matrix x(16, 2);  // column 0 zero, column 1 a lone 4
  x.at(0, 1) = 4.0f;
  ASSERT_EQ(cpu::rht_amax(x.v, 16, 2), 1.0f);
  cpu::Nvfp4Params params;
  params.columnwise = true;
  params.rht = true;
  const cpu::Nvfp4Copy copy =
      cpu::nvfp4_quantize(x.v, 16, 2, cpu::nvfp4_tensor_scale(4.0f), params);
  EXPECT_EQ(cpu::summarize_nvfp4_copy(x.v, copy), summary(2, 1, 0.0f, 112.0f));
}

// ---- `fusec run --device cpu` ------------------------------------------------------------------

constexpr const char* kOne = R"(
recipe blocks = float8_block_scaling()
recipe mx = mxfp8_block_scaling(format = hybrid)
recipe fp4 = nvfp4_block_scaling(seed = 3)
sequence one(x: bf16[tokens, 192]) -> (y: bf16[tokens, 160]) uses blocks {
  linear(192, 160, bias = false) as fc
}
)";

// The `  blocks` lines of a CPU run of kOne (tokens 96) under `recipe`, per step.
std::vector<std::vector<std::string>> block_lines(const std::string& recipe, int steps) {
  const std::string file = test::make_temp_dir("block-summary") + "/one.fuse";
  std::ofstream(file) << kOne;
  const test::CommandResult r =
      test::fusec("run " + test::shell_quoted(file) + " --device cpu --bind tokens=96 --steps " +
                  std::to_string(steps) + " --recipe " + recipe);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::vector<std::string>> out;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("step ")) out.emplace_back();
    if (line.starts_with("  blocks ") && !out.empty()) out.back().push_back(line);
  }
  return out;
}

// Every copy gets its line each step, in quantizer order; the input's row-wise line is exactly
// the summary of the input fusec drew (seeded_input, stored as bf16) cast with 1 x 128 blocks.
TEST(BlockSummaryRun, FusecRunPrintsEveryCopysLineEachStep) {
  const std::vector<std::vector<std::string>> steps = block_lines("blocks", 2);
  ASSERT_EQ(steps.size(), 2u);
  for (const std::vector<std::string>& lines : steps) {
    ASSERT_EQ(lines.size(), 6u);
    // Blocks: x [96, 192] row-wise 96 x 2, column-wise 192 columns of one ragged 128-block; the
    // weight [160, 192] 2 x 2 blocks of 128 x 128; dy [96, 160] 96 x 2 and 160.
    const char* expected[] = {"fc.input.rowwise ",       "fc.input.columnwise ",
                              "fc.weight.rowwise ",      "fc.weight.columnwise ",
                              "fc.grad_output.rowwise ", "fc.grad_output.columnwise "};
    const char* shapes[] = {"e4m3  1x128        192 blocks", "e4m3  128x1        192 blocks",
                            "e4m3  128x128        4 blocks", "e4m3  128x128        4 blocks",
                            "e4m3  1x128        192 blocks", "e4m3  128x1        160 blocks"};
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_TRUE(lines[i].starts_with(std::string("  blocks ") + expected[i])) << lines[i];
      EXPECT_NE(lines[i].find(shapes[i]), std::string::npos) << lines[i];
      EXPECT_NE(lines[i].find("zero blocks 0 (0.00%)"), std::string::npos) << lines[i];
    }
  }
  cpu::Tensor<float> x = cpu::seeded_input({96, 192}, 0, 0);
  cpu::round_to_bf16(x.data);
  cpu::BlockQuantParams params;
  params.value_for_inf = cpu::bf16_max_finite();
  cpu::BlockCopySummary want;
  want.quantizer = "fc.input";
  want.format_name = "e4m3";
  want.block_rows = 1;
  want.block_cols = 128;
  want.summary = cpu::summarize_block_copy(cpu::block_quantize_rowwise(x.data, 96, 192, params),
                                           cpu::Fp8Format::E4M3, false);
  EXPECT_EQ(steps[0][0] + "\n", cpu::format_block_summary(want));
}

// The reference executor keeps each copy's summary at its cast: x with 32 zero tokens and dy with
// its last 32 features zero give exactly these zero blocks, the scales are the oracle's.
TEST(BlockSummaryRun, TheReferenceExecutorSummarizesEachCastCopy) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::FrontEnd;
  const driver::CompileResult r = driver::compile_source("one.fuse", kOne, sources, diags, options);
  ASSERT_TRUE(r.ok()) << r.error;
  cpu::ReferenceExecutor<float> exec(r.program.sequences.at(0), {{"tokens", 96}});
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto bf16 = [&](float v) { return cpu::bf16_to_float(cpu::float_to_bf16(v)); };
  cpu::Tensor<float>& w = exec.param("fc.weight");
  for (float& v : w.data) v = bf16(0.05f * normal(rng));
  exec.params_changed();
  cpu::Tensor<float> x = cpu::Tensor<float>::zeros({96, 192});
  for (size_t i = 32 * 192; i < x.data.size(); ++i) x.data[i] = bf16(normal(rng));
  cpu::Tensor<float> dy = cpu::Tensor<float>::zeros({96, 160});
  for (int64_t t = 0; t < 96; ++t)
    for (int64_t f = 0; f < 128; ++f) dy.data[size_t(t * 160 + f)] = bf16(0.01f * normal(rng));
  (void)exec.forward({x});
  EXPECT_EQ(exec.block_summaries().size(), 4u);  // the forward's copies: x and the weight
  (void)exec.backward({dy});
  const std::vector<cpu::BlockCopySummary> got = exec.block_summaries();
  ASSERT_EQ(got.size(), 6u);
  struct Want {
    const char* quantizer;
    bool columnwise;
    int block_rows, block_cols;
    int64_t blocks, zero_blocks;
  };
  const Want want[] = {
      {"fc.input", false, 1, 128, 192, 64},       {"fc.input", true, 128, 1, 192, 0},
      {"fc.weight", false, 128, 128, 4, 0},       {"fc.weight", true, 128, 128, 4, 0},
      {"fc.grad_output", false, 1, 128, 192, 96}, {"fc.grad_output", true, 128, 1, 160, 32}};
  for (size_t i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].quantizer, want[i].quantizer);
    EXPECT_EQ(got[i].columnwise, want[i].columnwise);
    EXPECT_EQ(got[i].format_name, "e4m3");
    EXPECT_EQ(got[i].block_rows, want[i].block_rows);
    EXPECT_EQ(got[i].block_cols, want[i].block_cols);
    EXPECT_EQ(got[i].summary.blocks, want[i].blocks);
    EXPECT_EQ(got[i].summary.zero_blocks, want[i].zero_blocks);
    EXPECT_FALSE(got[i].has_tensor_scale);
  }
  cpu::BlockQuantParams params;
  params.value_for_inf = cpu::bf16_max_finite();
  EXPECT_EQ(got[0].summary,
            cpu::summarize_block_copy(cpu::block_quantize_rowwise(x.data, 96, 192, params),
                                      cpu::Fp8Format::E4M3, false));
  EXPECT_EQ(got[5].summary,
            cpu::summarize_block_copy(cpu::block_quantize_columnwise(dy.data, 96, 160, params),
                                      cpu::Fp8Format::E4M3, false));
}

// MXFP8 (E5M2 gradients) and NVFP4 (its Hadamard copies' quantizers, the tensor scale).
TEST(BlockSummaryRun, MicroRecipesPrintTheirBlocksAndNvfp4ItsTensorScale) {
  const std::vector<std::vector<std::string>> mx = block_lines("mx", 1);
  ASSERT_EQ(mx.size(), 1u);
  ASSERT_EQ(mx[0].size(), 6u);
  EXPECT_NE(mx[0][0].find("fc.input.rowwise                 e4m3  1x32         576 blocks"),
            std::string::npos)
      << mx[0][0];
  EXPECT_NE(mx[0][5].find("fc.grad_output.columnwise        e5m2  32x1         480 blocks"),
            std::string::npos)
      << mx[0][5];
  const std::vector<std::vector<std::string>> fp4 = block_lines("fp4", 1);
  ASSERT_EQ(fp4.size(), 1u);
  bool wgrad = false;
  for (const std::string& line : fp4[0]) {
    EXPECT_NE(line.find("e2m1"), std::string::npos) << line;
    EXPECT_NE(line.find("  tensor scale "), std::string::npos) << line;
    if (line.starts_with("  blocks fc.input.wgrad.columnwise ")) {
      wgrad = true;
      EXPECT_NE(line.find("16x1 "), std::string::npos) << line;
    }
  }
  EXPECT_TRUE(wgrad) << "no line of the Hadamard copy's quantizer";
}

// ---- which copies the GPU summarizes (runtime/gpu/summary_copies.h) --------------------------

constexpr const char* kMlp = R"(
recipe blocks = float8_block_scaling()
recipe fp4 = nvfp4_block_scaling()
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses blocks {
  linear(256, 384, bias = true) as fc1
  gelu()
  linear(384, 256, bias = false) as fc2
}
)";

plan::SequencePlan mlp_plan(const std::string& recipe) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.recipe = recipe;
  options.last_stage = driver::Stage::Plan;
  const driver::CompileResult r = driver::compile_source("mlp.fuse", kMlp, sources, diags, options);
  EXPECT_TRUE(r.ok()) << r.error;
  return r.plan.sequences.at(0);
}

// Every copy, whichever kernel makes it: fc2's input copies come out of the GELU kernel the
// block cast folded into (activation_block_cast), its output gradient's out of the GELU backward
// (dact_block_cast); the summary reads each Float8 copy itself, its source being in no buffer.
TEST(BlockSummaryCopies, Float8CopiesOfFusedCastsAreFoundByTheirBuffers) {
  const plan::SequencePlan plan = mlp_plan("blocks");
  const std::vector<gpu::SummaryCopy> copies = gpu::find_summary_copies(plan);
  ASSERT_EQ(copies.size(), 12u);  // 2 linears x input, weight, grad_output x 2 copies
  std::vector<std::string> patterns;
  for (size_t i = 0; i < copies.size(); ++i) {
    const gpu::SummaryCopy& c = copies[i];
    const plan::QuantizerPlan& q = plan.quantizers.at(size_t(c.quantizer));
    SCOPED_TRACE(q.name + (c.columnwise ? ".columnwise" : ".rowwise"));
    EXPECT_EQ(c.columnwise, i % 2 == 1);  // quantizer order, row-wise first
    EXPECT_EQ(c.source, c.copy);
    EXPECT_EQ(c.grid, plan.buffers.at(size_t(c.copy)).scale_inv.buffer);
    EXPECT_EQ(c.transposed, c.columnwise);
    const bool weight = q.name.ends_with(".weight");
    EXPECT_EQ(c.two_d, weight);
    EXPECT_EQ(c.expression, std::string("opfuse::float8_block_summary<__nv_fp8_e4m3, ") +
                                (weight ? "true" : "false") + ">");
    ASSERT_EQ(c.writers.size(), 1u);
    if (q.name == "fc2.input" || q.name == "fc1.grad_output")
      patterns.push_back(plan.steps.at(size_t(c.writers[0])).pattern);
  }
  EXPECT_EQ(patterns, (std::vector<std::string>{"dact_block_cast", "dact_block_cast",
                                                "activation_block_cast", "activation_block_cast"}));
}

// NVFP4's emulated copies: summarized from their quantizers' sources, the Hadamard ones with the
// transform; a tensor-parallel plan is refused.
TEST(BlockSummaryCopies, EmulatedCopiesReadTheirSourcesAndTensorParallelIsRefused) {
  plan::SequencePlan plan = mlp_plan("fp4");
  const std::vector<gpu::SummaryCopy> copies = gpu::find_summary_copies(plan);
  ASSERT_EQ(copies.size(), 12u);
  for (const gpu::SummaryCopy& c : copies) {
    const plan::QuantizerPlan& q = plan.quantizers.at(size_t(c.quantizer));
    SCOPED_TRACE(q.name);
    EXPECT_EQ(c.source, q.source_buffer);
    EXPECT_EQ(c.grid, -1);
    EXPECT_TRUE(c.nvfp4);
    EXPECT_EQ(plan.buffers.at(size_t(c.copy)).emulated_quantizer, c.quantizer);
    const bool rht = q.name.ends_with(".wgrad");
    EXPECT_EQ(c.columnwise, rht || (q.name.ends_with(".weight") && c.columnwise));
    EXPECT_TRUE(c.expression.ends_with(rht ? ", true>" : ", false>")) << c.expression;
    EXPECT_EQ(c.block_rows * c.block_cols, q.name.ends_with(".weight") ? 256 : 16);
  }
  plan.parallel.tp = 2;
  EXPECT_THROW((void)gpu::find_summary_copies(plan), UsageError);
}

// A quantized output's MXFP8 / NVFP4 codes (note "Quantized boundaries") carry one-byte scales:
// no Float8 summary reads them as FP32 grids, and, as the CPU reference, none summarizes them;
// the producer's linear's own emulated copies still are.
TEST(BlockSummaryCopies, QuantizedOutputCodesAreNotSummarized) {
  for (const std::string recipe : {"mxfp8_block_scaling()", "nvfp4_block_scaling()"}) {
    SCOPED_TRACE(recipe);
    const std::string h = recipe.starts_with("nvfp4") ? "e2m1" : "e4m3";
    SourceManager sources;
    DiagnosticEngine diags(sources);
    driver::CompileOptions options;
    options.last_stage = driver::Stage::Plan;
    const driver::CompileResult r = driver::compile_source(
        "producer.fuse",
        "recipe r = " + recipe + "\nsequence p(x: bf16[tokens, 256]) -> (h: " + h +
            "[tokens, 128] quantized(rowwise, columnwise)) uses r {\n  linear(256, 128, bias = "
            "false) as fc\n  quantize()\n}\n",
        sources, diags, options);
    ASSERT_TRUE(r.ok()) << r.error;
    const plan::SequencePlan& plan = r.plan.sequences.at(0);
    const std::vector<gpu::SummaryCopy> copies = gpu::find_summary_copies(plan);
    EXPECT_FALSE(copies.empty());
    for (const gpu::SummaryCopy& c : copies) {
      const plan::QuantizerPlan& q = plan.quantizers.at(size_t(c.quantizer));
      EXPECT_TRUE(q.name.starts_with("fc.")) << q.name;
      EXPECT_EQ(c.grid, -1) << q.name;
    }
  }
}

}  // namespace
}  // namespace opfuse
