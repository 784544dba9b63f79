// Note "Block summaries" on the GPU (runtime/gpu/block_summaries.h, templates/block_summary.cuh)
// against the CPU reference's (ReferenceExecutor::block_summaries, runtime/cpu/block_summary.h),
// exactly: block count, zero blocks, the least and greatest block scale bit for bit, NVFP4's
// tensor scale, for every copy of a one-linear program whose casts read only what the test gave
// both sides (the input, the weight, the output gradient), under every block and micro recipe:
// Float8 1-D and 2-D blocks with power-of-2 and exact scales, MXFP8 with E5M2 gradients, NVFP4
// with and without its Hadamard copies, 2-D weights and stochastic rounding. The tensors have
// zero blocks and ragged 128-blocks; a cast folded into an activation is summarized from the copy
// it wrote; summaries stay off (refused) where they cannot be right.
// Also `fusec run --device gpu` prints the forward copies' lines of its first step as
// `--device cpu` does (later lines read values the GEMMs computed, which differ in the last bits).
// Label `gpu`: skips (visibly) where no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/block_summary.h"
#include "gpu/gemm.h"
#include "gpu/plan_executor.h"
#include "gpu_test_support.h"
#include "opfuse/error.h"
#include "opfuse/program.h"
#include "test_support.h"

namespace opfuse {
namespace {

constexpr const char* kOne = R"(
recipe blocks = float8_block_scaling()
recipe blocks_exact = float8_block_scaling(format = hybrid, x_block = 2, w_block = 1, power_of_2_scale = false)
recipe mx = mxfp8_block_scaling(format = hybrid)
recipe fp4 = nvfp4_block_scaling(seed = 3)
recipe fp4_plain = nvfp4_block_scaling(rht = false, stochastic_rounding = false, w_2d = false)
sequence one(x: bf16[tokens, 192]) -> (y: bf16[tokens, 160]) uses blocks {
  linear(192, 160, bias = false) as fc
}
)";
constexpr std::int64_t kTokens = 96;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string describe(const cpu::BlockCopySummary& s) {
  std::ostringstream out;
  out << s.quantizer << (s.columnwise ? ".columnwise" : ".rowwise") << " " << s.block_rows << "x"
      << s.block_cols << " blocks " << s.summary.blocks << " zero " << s.summary.zero_blocks
      << " scale_inv " << s.summary.scale_inv_min << " .. " << s.summary.scale_inv_max
      << " tensor scale " << s.tensor_scale;
  return out.str();
}

class BlockSummariesGpu : public test::GpuStreamTest,
                          public ::testing::WithParamInterface<std::string> {};

TEST_P(BlockSummariesGpu, EveryCopyMatchesTheReferenceExactly) {
  const std::string recipe = GetParam();
  const auto c = test::compile_program("one", kOne, recipe);
  ASSERT_NE(c, nullptr);
  const ir::Sequence& seq = c->program.sequences.at(0);
  const plan::SequencePlan& plan = c->plan.sequences.at(0);
  gpu::GemmRunner gemms(stream_);
  gpu::SequenceExecutor gpu(plan, *c->modules, gemms, stream_);
  EXPECT_THROW((void)gpu.block_summaries(stream_), UsageError);  // not asked for yet
  gpu.enable_block_summaries(stream_);
  gpu.bind({{"tokens", kTokens}});
  const auto arrays = allocate_tensors(gpu);
  cpu::ReferenceExecutor<float> ref(seq, {{"tokens", kTokens}});
  std::mt19937_64 rng(11);
  test::random_params(ref, arrays, rng);

  for (int step = 0; step < 2; ++step) {
    // x: its first 32 tokens zero (zero blocks of both copies), one outlier.
    cpu::Tensor<float> x = cpu::Tensor<float>::zeros({kTokens, 192});
    x.data = test::random_bf16(x.data.size(), 1.0, rng);
    std::fill(x.data.begin(), x.data.begin() + 32 * 192, 0.0f);
    x.data[40 * 192 + 7] = 96.0f;
    test::upload_bf16(*arrays.at("x"), x.data);
    (void)ref.forward({x});
    gpu.forward(stream_);
    // dy: features 128..159 zero (the ragged last 128-block of every row is zero).
    cpu::Tensor<float> dy = cpu::Tensor<float>::zeros({kTokens, 160});
    dy.data = test::random_bf16(dy.data.size(), 0.01, rng);
    for (std::int64_t t = 0; t < kTokens; ++t)
      std::fill(dy.data.begin() + t * 160 + 128, dy.data.begin() + (t + 1) * 160, 0.0f);
    std::string dy_name;
    for (const gpu::TensorInfo& info : gpu.tensors())
      if (info.role == plan::BufferRole::OutputGrad) dy_name = info.name;
    test::upload_bf16(*arrays.at(dy_name), dy.data);
    (void)ref.backward({dy});
    gpu.backward(stream_);

    const std::vector<cpu::BlockCopySummary> want = ref.block_summaries();
    const std::vector<gpu::CopySummary> got = gpu.block_summaries(stream_);
    // Every quantizer's copies: input, weight and grad_output (NVFP4: and the Hadamard ones).
    ASSERT_GE(want.size(), 5u) << recipe;
    ASSERT_EQ(got.size(), want.size()) << recipe << " step " << step;
    std::int64_t zero_blocks = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const cpu::BlockCopySummary& w = want[i];
      const gpu::CopySummary& g = got[i];
      SCOPED_TRACE(recipe + " step " + std::to_string(step) + ": " + describe(w));
      EXPECT_EQ(plan.quantizers.at(std::size_t(g.quantizer)).name, w.quantizer);
      EXPECT_EQ(g.columnwise, w.columnwise);
      EXPECT_EQ(g.block_rows, w.block_rows);
      EXPECT_EQ(g.block_cols, w.block_cols);
      EXPECT_EQ(g.blocks, w.summary.blocks);
      EXPECT_EQ(g.zero_blocks, w.summary.zero_blocks);
      EXPECT_TRUE(same_bits(g.scale_inv_min, w.summary.scale_inv_min)) << g.scale_inv_min;
      EXPECT_TRUE(same_bits(g.scale_inv_max, w.summary.scale_inv_max)) << g.scale_inv_max;
      EXPECT_EQ(g.has_tensor_scale, w.has_tensor_scale);
      EXPECT_TRUE(same_bits(g.tensor_scale, w.tensor_scale)) << g.tensor_scale;
      zero_blocks += w.summary.zero_blocks;
    }
    EXPECT_GT(zero_blocks, 0) << "the test's zero blocks went missing";
    gpu.end_step(stream_);
    ref.step();
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, BlockSummariesGpu,
                         ::testing::Values("blocks", "blocks_exact", "mx", "fp4", "fp4_plain"));

// A block cast folded into the GELU before it (activation_block_cast) writes fc2's input copies
// from registers: the summary of its column-wise copy (kept for wgrad) is that of the copy and
// grid the fused kernel wrote, as the CPU summarizes them.
class BlockSummariesFusedGpu : public test::GpuStreamTest {};

TEST_F(BlockSummariesFusedGpu, ACastFoldedIntoTheActivationIsSummarizedFromItsCopy) {
  constexpr const char* kMlp = R"(
recipe blocks = float8_block_scaling()
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses blocks {
  linear(256, 384, bias = true) as fc1
  gelu()
  linear(384, 256, bias = false) as fc2
}
)";
  const auto c = test::compile_program("mlp", kMlp);
  ASSERT_NE(c, nullptr);
  const plan::SequencePlan& plan = c->plan.sequences.at(0);
  gpu::GemmRunner gemms(stream_);
  gpu::SequenceExecutor gpu(plan, *c->modules, gemms, stream_);
  gpu.enable_block_summaries(stream_);
  gpu.bind({{"tokens", kTokens}});
  const auto arrays = allocate_tensors(gpu);
  std::mt19937_64 rng(3);
  for (const auto& [name, array] : arrays)
    test::upload_bf16(*array, test::random_bf16(array->bytes() / 2, 0.5, rng));
  gpu.forward(stream_);
  int quantizer = -1, copy = -1;
  for (const plan::QuantizerPlan& q : plan.quantizers)
    if (q.name == "fc2.input") quantizer = q.index;
  for (const plan::Buffer& b : plan.buffers)
    if (b.quantizer == quantizer && b.usage == plan::CopyUsage::Columnwise && copy < 0) copy = b.id;
  ASSERT_GE(copy, 0);
  bool fused = false;
  for (const plan::Step& step : plan.steps)
    if (std::find(step.writes.begin(), step.writes.end(), copy) != step.writes.end())
      fused = step.pattern == "activation_block_cast";
  EXPECT_TRUE(fused) << "the cast did not fold: this test checks nothing new";
  cpu::BlockQuantizedCopy stored;
  stored.rows = 384;  // the transposed copy [k, tokens]
  stored.cols = kTokens;
  stored.data = test::download_bytes(gpu.debug_buffer(copy), std::size_t(384 * kTokens));
  const std::size_t grid = std::size_t(cpu::scale_grid_shape(384, kTokens, false).size());
  const std::vector<std::uint8_t> grid_bytes = test::download_bytes(
      gpu.debug_buffer(plan.buffers.at(std::size_t(copy)).scale_inv.buffer), grid * 4);
  stored.scale_inv.resize(grid);
  std::memcpy(stored.scale_inv.data(), grid_bytes.data(), grid * 4);
  const cpu::BlockSummary want = cpu::summarize_block_copy(stored, cpu::Fp8Format::E4M3, false);
  bool found = false;
  for (const gpu::CopySummary& g : gpu.block_summaries(stream_)) {
    if (g.quantizer != quantizer || !g.columnwise) continue;
    found = true;
    EXPECT_EQ(g.blocks, want.blocks);
    EXPECT_EQ(g.zero_blocks, want.zero_blocks);
    EXPECT_TRUE(same_bits(g.scale_inv_min, want.scale_inv_min)) << g.scale_inv_min;
    EXPECT_TRUE(same_bits(g.scale_inv_max, want.scale_inv_max)) << g.scale_inv_max;
  }
  EXPECT_TRUE(found);
}

// A session asks for summaries or gets none; a tensor-parallel or debug session cannot ask.
TEST(BlockSummariesSession, OffByDefaultAndRefusedWhereTheyCannotBeRight) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "skipping GPU block summary tests: " << why;
  const Program program = Program::compile(kOne, "one.fuse");
  Session plain(program);
  EXPECT_THROW((void)plain.block_summaries(nullptr), UsageError);
  SessionOptions options;
  options.block_summaries = true;
  Session asked(program, {}, nullptr, options);
  asked.bind({{"tokens", kTokens}});
  EXPECT_TRUE(asked.block_summaries(nullptr).empty());  // nothing cast yet
  CompileOptions with_config;
  with_config.debug_config = DebugConfigSource{"", R"(log_fc:
  layers:
    layer_name_regex_pattern: fc
  transformer_engine:
    LogTensorStats:
      enabled: True
      tensors: [activation]
      stats: [max]
)",
                                               "debug.yaml"};
  const Program debug = Program::compile(kOne, "one.fuse", with_config);
  try {
    Session refused(debug, {}, nullptr, options);
    ADD_FAILURE() << "a debug session with block summaries was not refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("SessionOptions::block_summaries"), std::string::npos)
        << e.what();
  }
}

// `fusec run` prints the same block lines on both devices where both cast the same values: the
// first step's forward copies (input and weight) under each recipe.
// `fusec run --steps 1` of `file` under `recipe` on `device`: its block summary lines of fc's
// input and weight copies.
std::vector<std::string> summary_lines(const std::string& file, const std::string& recipe,
                                       const std::string& device) {
  const test::CommandResult r =
      test::fusec("run " + test::shell_quoted(file) + " --bind tokens=96 --steps 1 --recipe " +
                  recipe + " --device " + device);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> found;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("  blocks fc.input.") || line.starts_with("  blocks fc.weight."))
      found.push_back(line);
  return found;
}

std::string write_program(const std::string& name, const char* text) {
  const std::string file = test::make_temp_dir("block-summaries") + "/" + name + ".fuse";
  std::ofstream(file) << text;
  return file;
}

TEST(BlockSummariesFusec, TheFirstStepsForwardLinesMatchTheCpuRun) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "skipping GPU block summary tests: " << why;
  const std::string file = write_program("one", kOne);
  for (const std::string recipe : {"blocks", "blocks_exact", "mx", "fp4", "fp4_plain"}) {
    const std::vector<std::string> cpu = summary_lines(file, recipe, "cpu");
    EXPECT_GE(cpu.size(), 2u) << recipe;
    EXPECT_EQ(summary_lines(file, recipe, "gpu"), cpu) << recipe;
  }
}

// Under MXFP8 the norm writes fc's decoded row-wise input copy (pattern norm_micro_cast): the copy
// is summarized from the norm's output, which the fused kernel writes too, as the CPU does.
TEST(BlockSummariesFusec, ANormWritingTheMxfp8CopyMatchesTheCpuRun) {
  std::string why;
  if (!gpu_available(&why)) GTEST_SKIP() << "skipping GPU block summary tests: " << why;
  const std::string file = write_program("normed", R"(
recipe mx = mxfp8_block_scaling(format = hybrid)
sequence normed(x: bf16[tokens, 192]) -> (y: bf16[tokens, 160]) uses mx {
  layernorm(192)
  linear(192, 160, bias = false) as fc
}
)");
  const std::vector<std::string> cpu = summary_lines(file, "mx", "cpu");
  EXPECT_EQ(cpu.size(), 4u) << "fc.input and fc.weight, row-wise and column-wise";
  EXPECT_EQ(summary_lines(file, "mx", "gpu"), cpu);
}

}  // namespace
}  // namespace opfuse
