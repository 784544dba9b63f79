// Plan variants of a debug config (compiler/debug_config/instrument.h, passes/debug_instrument.h):
// a config that routes nothing compiles to the plain plan byte for byte; statistics records sit at
// the right tensors and undo only the fusions that hid them; GEMMs leave quantization where the
// features say; the CPU reference fills the records with the statistics of the very tensors the
// API shows; records of micro-batches merge into TE's log lines.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <variant>

#include "cpu/numerics.h"
#include "debug/stats.h"
#include "debug_config/instrument.h"
#include "debug_routing_fixture.h"
#include "driver/compile.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "test_support.h"

namespace opfuse::debug {
namespace {

const std::string kMlp = R"(
recipe fp8 = delayed_scaling()
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {
  layernorm(64)
  linear(64, 256) as fc1
  swiglu()
  linear(128, 64) as fc2
}
)";

driver::CompileResult compile(const std::string& text, const Routing* routing,
                              const std::string& recipe = "") {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.recipe = recipe;
  options.last_stage = driver::Stage::Plan;
  options.debug_routing = routing;
  driver::CompileResult r = driver::compile_source("mlp.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all() << r.error;
  return r;
}

TEST(DebugVariants, ConfigRoutingNothingCompilesToThePlainPlan) {
  const auto plain = compile(kMlp, nullptr);
  // A section for a layer the program lacks, and a feature disabled for the ones it has.
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [proj]}\n  transformer_engine:\n"
      "    LogTensorStats: {tensors: [activation], stats: [max]}\n"
      "b:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    LogTensorStats: {enabled: false, tensors: [activation], stats: [max]}\n",
      {"fc1", "fc2"}, true);
  const auto routed = compile(kMlp, &r->routing);
  EXPECT_EQ(plan::plan_json_text(plain.plan), plan::plan_json_text(routed.plan));
  EXPECT_EQ(plain.kernels.size(), routed.kernels.size());
}

TEST(DebugVariants, UnconfiguredLayersKeepTheirStepsAndFusions) {
  const auto plain = compile(kMlp, nullptr);
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
      "    LogTensorStats: {tensors: [output], stats: [max]}\n",
      {"fc1", "fc2"}, true);
  const auto v = compile(kMlp, &r->routing);
  const plan::SequencePlan& p = plain.plan.sequences[0];
  const plan::SequencePlan& s = v.plan.sequences[0];
  ASSERT_EQ(s.stat_slots.size(), 1u);
  EXPECT_EQ(s.stat_slots[0], (plan::StatSlot{"fc2", "output", 0, 1}));
  // Two launches more (partials and merge); every other step as before, in order.
  ASSERT_EQ(s.steps.size(), p.steps.size() + 2);
  std::vector<std::string> plain_what, variant_what;
  for (const plan::Step& st : p.steps) plain_what.push_back(st.what);
  for (const plan::Step& st : s.steps)
    if (st.what.find("statistics") == std::string::npos &&
        st.what.find("merge the partial") == std::string::npos)
      variant_what.push_back(st.what);
  EXPECT_EQ(plain_what, variant_what);
}

// The fused groups of a plan, in step order, as "pattern first-op" (a group's launches once;
// "stats": a kernel that only gained statistics, not a fusion).
std::vector<std::string> fusions(const plan::SequencePlan& s) {
  std::vector<std::string> out;
  for (const plan::Step& st : s.steps) {
    if (st.pattern.empty() || st.pattern == "stats") continue;
    const std::string name = st.pattern + " " + st.ops.at(0).instance;
    if (out.empty() || out.back() != name) out.push_back(name);
  }
  return out;
}

// The first step holding the statistics op of `instance` (its group's kernel; merges follow).
const plan::Step* step_with_op(const plan::SequencePlan& s, const std::string& instance) {
  for (const plan::Step& st : s.steps)
    for (const plan::OpRef& op : st.ops)
      if (op.instance == instance) return &st;
  return nullptr;
}

std::string name_expression_of(const plan::Step& st) {
  const auto* launch = std::get_if<plan::LaunchStep>(&st.body);
  return launch ? launch->name_expression : "";
}

TEST(DebugVariants, InspectingANormOutputUndoesOnlyItsCastFusion) {
  const auto plain = compile(kMlp, nullptr);
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogTensorStats: {tensors: [activation], stats: [max]}\n",
      {"fc1", "fc2"}, true);
  const auto v = compile(kMlp, &r->routing);
  const auto before = fusions(plain.plan.sequences[0]);
  const auto after = fusions(v.plan.sequences[0]);
  EXPECT_NE(std::find(before.begin(), before.end(), "norm_cast layernorm_0"), before.end());
  EXPECT_EQ(std::find(after.begin(), after.end(), "norm_cast layernorm_0"), after.end());
  EXPECT_EQ(before.size(), after.size() + 1);  // the activation cast of fc2 stays fused
  // The norm's output is in memory now; the cast reading it computes its statistics.
  const plan::Step* cast = step_with_op(v.plan.sequences[0], "fc1.activation_stats0");
  ASSERT_NE(cast, nullptr);
  EXPECT_EQ(cast->pattern, "stats");
  EXPECT_NE(name_expression_of(*cast).find("opfuse::cast_transpose<"), std::string::npos);
  EXPECT_NE(name_expression_of(*cast).find(", 1>"), std::string::npos)  // kStatsOfInput
      << name_expression_of(*cast);
}

// Statistics fused into kernels (docs/debugging.md): the statistics of a tensor a fused kernel
// keeps inside (the SwiGLU output its FP8 cast replaces, the SwiGLU gradient) are computed by that
// kernel, which stays fused; those of a tensor a kernel reads (the GEMM output SwiGLU reads, the
// gradient a cast reads) by the kernel reading it. Tensors no such kernel reads (a GEMM's output
// nobody reads in the step, wgrad) and the weights keep a statistics kernel of their own.
TEST(DebugVariants, StatisticsFoldIntoTheKernelsThatReadOrWriteTheTensor) {
  const auto plain = compile(kMlp, nullptr);
  const auto r = test::routed(
      "a:\n  layers: {layer_name_regex_pattern: .*}\n  transformer_engine:\n"
      "    LogTensorStats:\n      tensors: [activation, weight, output, gradient, dgrad, wgrad]\n"
      "      stats: [min, max, mean, std, l1_norm]\n",
      {"fc1", "fc2"}, true);
  const auto v = compile(kMlp, &r->routing);
  const plan::SequencePlan& s = v.plan.sequences[0];
  ASSERT_EQ(s.stat_slots.size(), 12u);
  // Every fusion of the plain plan but the norm's cast (the norm kernel computes no statistics).
  std::vector<std::string> expected = fusions(plain.plan.sequences[0]);
  expected.erase(std::find(expected.begin(), expected.end(), "norm_cast layernorm_0"));
  EXPECT_EQ(fusions(s), expected);
  std::map<std::string, std::string> kernel_of;  // statistics instance -> its step's kernel
  int own = 0, merges = 0;
  for (const plan::Step& st : s.steps) {
    const std::string name = name_expression_of(st);
    if (name.find("tensor_stats_partial") != std::string::npos) ++own;
    if (st.what.find("merge the kernel's partial records") != std::string::npos) ++merges;
    for (const plan::OpRef& op : st.ops)  // the group's first launch (its merges follow)
      if (op.op == "tensor_stats") kernel_of.emplace(op.instance, name);
  }
  auto kernel = [&](const std::string& instance) {
    const auto it = kernel_of.find(instance);
    return it == kernel_of.end() ? std::string("(none)") : it->second;
  };
  // fc2's activation (the SwiGLU output, never stored) and fc1's output (its input) in one
  // kernel; fc1's gradient (the SwiGLU gradient) and fc2's dgrad (its dy) in the backward's.
  EXPECT_EQ(kernel("fc2.activation_stats6"), kernel("fc1.output_stats3"));
  EXPECT_NE(kernel("fc2.activation_stats6").find("gated_activation_fwd<"), std::string::npos);
  EXPECT_NE(kernel("fc2.activation_stats6").find(", 3, __nv_bfloat16>"), std::string::npos)
      << kernel("fc2.activation_stats6");
  EXPECT_EQ(kernel("fc1.gradient_stats2"), kernel("fc2.dgrad_stats10"));
  EXPECT_NE(kernel("fc1.gradient_stats2").find("gated_activation_bwd<"), std::string::npos);
  for (const char* cast : {"fc2.gradient_stats8", "fc1.activation_stats0"})
    EXPECT_NE(kernel(cast).find("cast_transpose<"), std::string::npos) << cast;
  // Of their own: fc1's dgrad (the norm backward reads it), both wgrads, fc2's output, and the
  // weights (their casts are skipped while the copies are valid: note "Weight cache",
  // runtime/gpu/plan_executor.cpp).
  EXPECT_EQ(kernel("fc1.weight_stats1").find("cast_transpose<"), std::string::npos);
  EXPECT_EQ(kernel("fc2.weight_stats7").find("cast_transpose<"), std::string::npos);
  EXPECT_EQ(own, 6);
  EXPECT_EQ(merges, 6);
  // The kernels with statistics run one wave of the GPU's resident blocks, each an equal run of
  // the tiles (templates/common/elementwise_tile.cuh, flat schedule): at 16384 tokens on 132 SMs,
  // the SwiGLU forward's 128 x 64 tiles (128 row tiles x 2 column tiles of its 128-wide output)
  // take 256 blocks (fewer tiles than 132 x 2 resident blocks); at 64 tokens one block per tile.
  // The backward computes fc1's dbias too (its column sums keep a block on one column tile): row
  // blocks of strided row tiles, at most kStatsTileBlocksPerSm per SM's worth.
  int kernels = 0;
  for (const plan::Step& st : s.steps) {
    const auto* launch = std::get_if<plan::LaunchStep>(&st.body);
    if (launch == nullptr || launch->name_expression.find("activation_") == std::string::npos)
      continue;
    ++kernels;
    SCOPED_TRACE(launch->name_expression);
    const auto blocks = [&](int64_t tokens, int64_t sms) {
      return plan::evaluate(launch->grid.x.text(),
                            {{"tokens", tokens}, {plan::kNumSmsSymbol, sms}}) *
             plan::evaluate(launch->grid.y.text(),
                            {{"tokens", tokens}, {plan::kNumSmsSymbol, sms}});
    };
    if (launch->name_expression.find("gated_activation_fwd<") != std::string::npos) {
      EXPECT_EQ(launch->grid.rule, "tile_stats_flat");
      EXPECT_EQ(blocks(16384, 132), 256);
      EXPECT_EQ(blocks(16384, 100), 200);  // 2 resident blocks per SM
      EXPECT_EQ(blocks(64, 132), 2);
    } else {
      EXPECT_EQ(launch->grid.rule, "tile_stats");
      // 2 column tiles x min(128 row tiles, ceil(132 * 4 / 2)) row blocks; fewer SMs, fewer rows.
      EXPECT_EQ(blocks(16384, 132), 2 * 128);
      EXPECT_EQ(blocks(16384, 20), 2 * 40);
    }
  }
  EXPECT_EQ(kernels, 2);
}

// Records a kernel cannot compute (blockwise ranges, LogFp8TensorStats' casts) or that another
// statistics op reads keep kernels of their own and undo the fusion that hid their tensor.
TEST(DebugVariants, BlockwiseStatisticsKeepAKernelOfTheirOwn) {
  const auto plain = compile(kMlp, nullptr);
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
      "    LogTensorStats:\n      tensors: [activation]\n      stats:\n"
      "        - max\n        - max_blockwise_dynamic_range: {block_size: 32, dims: 1}\n",
      {"fc1", "fc2"}, true);
  const auto v = compile(kMlp, &r->routing);
  const auto after = fusions(v.plan.sequences[0]);
  EXPECT_EQ(std::find(after.begin(), after.end(), "activation_cast swiglu_0"), after.end());
  EXPECT_EQ(after.size() + 1, fusions(plain.plan.sequences[0]).size());
  // LogFp8TensorStats reads the moments record of its tensor (the amax of its current-scaling
  // what-ifs): that record is complete before it, by a kernel of its own.
  const auto q = test::routed(
      "a:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
      "    LogTensorStats: {tensors: [activation], stats: [max]}\n"
      "    LogFp8TensorStats: {tensors: [activation], stats: [fp8_current_scaling_mse]}\n",
      {"fc1", "fc2"}, true);
  const auto w = compile(kMlp, &q->routing);
  const auto with_fp8 = fusions(w.plan.sequences[0]);
  EXPECT_EQ(std::find(with_fp8.begin(), with_fp8.end(), "activation_cast swiglu_0"),
            with_fp8.end());
  int own = 0;
  for (const plan::Step& st : w.plan.sequences[0].steps)
    own += name_expression_of(st).find("tensor_stats_partial") != std::string::npos;
  EXPECT_EQ(own, 1);
}

TEST(DebugVariants, GemmsLeaveQuantizationWhereTheFeaturesSay) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    DisableFP8GEMM: {gemms: [wgrad]}\n"
      "b:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
      "    PerTensorScaling: {gemms: [fprop], tensors: [activation]}\n",
      {"fc1", "fc2"}, true);
  const auto v = compile(kMlp, &r->routing);
  const plan::SequencePlan& s = v.plan.sequences[0];
  int fp8 = 0, high = 0;
  for (const plan::Step& st : s.steps) {
    const auto* g = std::get_if<plan::GemmStep>(&st.body);
    if (!g) continue;
    const bool quantized = g->a.dtype == plan::DType::E4M3 || g->a.dtype == plan::DType::E5M2;
    const bool fc1_wgrad = g->role == plan::GemmRole::Wgrad && st.ops[0].instance == "fc1";
    EXPECT_EQ(quantized, !fc1_wgrad) << st.what;
    (quantized ? fp8 : high)++;
  }
  EXPECT_EQ(high, 1);
  EXPECT_EQ(fp8, 5);
  // fc2's fprop reads its input through a quantizer of its own that scales per tensor from its
  // own amax (current scaling); wgrad's copy keeps the recipe's delayed scaling.
  int found = 0;
  for (const plan::QuantizerPlan& q : s.quantizers) {
    if (q.name == "fc2.input.fprop") {
      ++found;
      EXPECT_EQ(q.spec.scaling, plan::ScalingKind::Current);
      EXPECT_TRUE(q.usages.rowwise && !q.usages.columnwise);
    }
    if (q.name == "fc2.input") {
      ++found;
      EXPECT_EQ(q.spec.scaling, plan::ScalingKind::Delayed);
      EXPECT_TRUE(!q.usages.rowwise && q.usages.columnwise);
    }
  }
  EXPECT_EQ(found, 2);
}

TEST(DebugVariants, KeptFp8WeightsAreDumpedAsTheirGemmReadsThem) {
  // Under `with fp8_weights` the weight's GEMM reads the scale_inv kept from its last cast: the
  // capture binds that one (gemm_scale_inv), not the quantizer's moving scale.
  std::string fp8_weights = kMlp;
  fp8_weights.replace(fp8_weights.find("uses fp8"), 8, "uses fp8 with fp8_weights");
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation, weight], quantized_tensor: true}\n",
      {"fc1", "fc2"}, true);
  const auto v = compile(fp8_weights, &r->routing);
  const plan::SequencePlan& p = v.plan.sequences.at(0);
  int quantized = 0, gemm_scale_inv = 0;
  for (const plan::CaptureSlot& c : p.capture_slots) quantized += c.quantized;
  for (const plan::Step& s : p.steps) {
    const auto* l = std::get_if<plan::LaunchStep>(&s.body);
    if (!l || l->kernel.rfind("tensor_capture", 0) != 0) continue;
    for (const plan::ParamBinding& b : l->params) {
      gemm_scale_inv += b.kind == plan::ParamKind::Quantizer &&
                        b.quantizer_value == plan::QuantizerValue::GemmScaleInv;
    }
  }
  EXPECT_EQ(quantized, 2);
  EXPECT_EQ(gemm_scale_inv, 2);
}

// One linear layer: its six tensors are the API's x, W, y, dy, dx and dW.
const std::string kLinear = R"(
sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 96]) {
  linear(64, 96, bias = false) as fc1
}
)";

TEST(DebugVariants, ReferenceRecordsAreTheStatisticsOfTheApiTensors) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogTensorStats:\n"
      "      tensors: [activation, weight, output, gradient, dgrad, wgrad]\n"
      "      stats: [min, max, std, {max_blockwise_dynamic_range: {block_size: 16, dims: 2}}]\n",
      {"fc1"}, false);
  const auto v = compile(kLinear, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  ASSERT_EQ(seq.inspections.size(), 12u);
  cpu::ReferenceExecutor<float> exec(seq, {{"tokens", 48}});
  cpu::init_params_from_seed(exec, 7);
  cpu::Tensor<float> x = cpu::seeded_normal({48, 64}, 11, 1.0);
  cpu::round_to_bf16(x.data);
  const auto y = exec.forward({x});
  cpu::Tensor<float> dy = cpu::seeded_normal({48, 96}, 13, 0.1);
  cpu::round_to_bf16(dy.data);
  const auto grads = exec.backward({dy});
  const auto& records = exec.stat_records();
  ASSERT_EQ(records.size(), 12u);
  const std::vector<float>* tensors[] = {
      &x.data,  &exec.param("fc1.weight").data, &y[0].data,
      &dy.data, &grads.inputs[0].data,          &grads.params[0].data};
  const int64_t cols[] = {64, 64, 96, 96, 64, 64};
  const char* names[] = {"activation", "weight", "output", "gradient", "dgrad", "wgrad"};
  for (size_t t = 0; t < 6; ++t) {
    SCOPED_TRACE(names[t]);
    size_t base = 0, block = 0;
    for (size_t i = 0; i < seq.inspections.size(); ++i) {
      if (seq.inspections[i].tensor != names[t]) continue;
      (seq.inspections[i].block_size == 0 ? base : block) = i;
    }
    const TensorMoments want = moments_of(*tensors[t]);
    EXPECT_EQ(records[base].count, want.count);
    EXPECT_EQ(records[base].min, want.min);
    EXPECT_EQ(records[base].max, want.max);
    EXPECT_DOUBLE_EQ(value(records[base], StatKind::Std), value(want, StatKind::Std));
    const int64_t rows = int64_t(tensors[t]->size()) / cols[t];
    EXPECT_EQ(records[block].max_blockwise_dynamic_range,
              max_blockwise_dynamic_range(*tensors[t], rows, cols[t], 16, 2));
    EXPECT_GT(records[block].max_blockwise_dynamic_range, 0);
  }
}

TEST(DebugVariants, MicroBatchesMergeAndWeightsCountOnce) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogTensorStats: {tensors: [activation, weight], stats: [mean, max]}\n",
      {"fc1"}, false);
  const std::vector<plan::StatSlot> slots = {{"fc1", "activation", 0, 1}, {"fc1", "weight", 0, 1}};
  const std::vector<float> a1 = {1, 2, 3}, a2 = {10, 20}, w = {-1, 1};
  IterationStats stats;
  stats.add_run(slots, std::vector<TensorMoments>{moments_of(a1), moments_of(w)});
  stats.add_run(slots, std::vector<TensorMoments>{moments_of(a2), moments_of(w)});
  const std::string dir = test::make_temp_dir("variants_log");
  {
    StatLog log = StatLog::open(dir, 0, 4, [] { return std::string("T"); });
    stats.log(r->routing, 5, log);
    log.end_step();
  }
  const std::string text =
      test::read_text(dir + "/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-0.log");
  EXPECT_NE(text.find("fc1_activation_mean \t\t\t\t iteration=000005 \t\t\t\t value=7.2000"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("fc1_activation_max \t\t\t\t iteration=000005 \t\t\t\t value=20.0000"),
            std::string::npos);
  EXPECT_NE(text.find("fc1_weight_mean \t\t\t\t iteration=000005 \t\t\t\t value=0.0000"),
            std::string::npos);
}

}  // namespace
}  // namespace opfuse::debug

namespace opfuse::debug {
namespace {

const std::string kBf16Mlp = R"(
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) {
  layernorm(64)
  linear(64, 256) as fc1
  swiglu()
  linear(128, 64) as fc2
}
)";

ir::Sequence front_end(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::FrontEnd;
  driver::CompileResult r = driver::compile_source("mlp.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all();
  return r.program.sequences.at(0);
}

TEST(DebugRun, StatisticsAloneLeaveTheTrainingUnchanged) {
  const ir::Sequence seq = front_end(kBf16Mlp);
  cpu::RunOptions plain;
  plain.bindings = {{"tokens", 16}};
  plain.steps = 3;
  plain.seed = 5;
  const std::string want = cpu::run_reference_training(seq, plain);

  const auto r = test::routed(
      "a:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    LogTensorStats:\n      tensors: [activation, weight, output, gradient, dgrad, wgrad]\n"
      "      stats: [max, std]\n      freq: 2\n",
      {"fc1", "fc2"}, false);
  const std::string dir = test::make_temp_dir("debug_run");
  StatLog log = StatLog::open(dir, 0, 6, [] { return std::string("T"); });
  cpu::RunOptions debugged = plain;
  cpu::DebugRunOptions d;
  d.bindings = bind_layers(*r->config, {{"fc1", {}, false}, {"fc2", {}, false}}, *r->diags);
  d.log = &log;
  d.sources = &r->sources;
  debugged.debug = d;
  EXPECT_EQ(cpu::run_reference_training(seq, debugged), want);
  const auto records = read_stat_jsonl(dir + "/opfuse_statistics/globalrank-0.jsonl");
  // freq 2 over 3 steps: iterations 0 and 2, 2 layers x 6 tensors x 2 stats each.
  ASSERT_EQ(records.size(), 2u * 2 * 6 * 2);
  EXPECT_EQ(records.front().iteration, 0);
  EXPECT_EQ(records.back().iteration, 2);
  for (const StatRecord& rec : records) EXPECT_TRUE(std::isfinite(rec.value)) << metric_name(rec);
  const std::string debug_log =
      test::read_text(dir + "/nvdlfw_inspect_logs/nvdlfw_inspect_globalrank-0.log");
  EXPECT_NE(debug_log.find("T - INFO -   activation: inspected by LogTensorStats"),
            std::string::npos)
      << debug_log;
}

std::string run_with(const ir::Sequence& seq, const cpu::RunOptions& plain, const std::string& yaml,
                     const std::string& dir) {
  const auto r = test::routed(yaml, {"fc1", "fc2"}, true);
  StatLog log = StatLog::open(dir, 0, 4, [] { return std::string("T"); });
  cpu::RunOptions debugged = plain;
  cpu::DebugRunOptions d;
  d.bindings = bind_layers(*r->config, {{"fc1", {}, true}, {"fc2", {}, true}}, *r->diags);
  d.log = &log;
  debugged.debug = d;
  return cpu::run_reference_training(seq, debugged);
}

TEST(DebugRun, VariantSwitchesCarryParametersAndQuantizerState) {
  std::string fp8 = "recipe fp8 = delayed_scaling()\n" + kBf16Mlp;
  fp8.replace(fp8.find(") {"), 3, ") uses fp8 {");
  const ir::Sequence seq = front_end(fp8);
  cpu::RunOptions plain;
  plain.bindings = {{"tokens", 16}};
  plain.steps = 5;
  plain.seed = 9;
  const std::string want = cpu::run_reference_training(seq, plain);
  // Weight statistics at iterations 1 and 2 only: the run switches to a variant at 1 and back
  // at 3, each switch a new executor; a weight's statistics change no fusion, so every step must
  // come out as in the plain run, delayed-scaling histories included.
  const std::string dir = test::make_temp_dir("debug_run_fp8");
  EXPECT_EQ(run_with(seq, plain,
                     "a:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
                     "    LogTensorStats: {tensors: [weight], stats: [max], "
                     "start_end_list: [[1, 2]]}\n",
                     dir),
            want);
  const auto records = read_stat_jsonl(dir + "/opfuse_statistics/globalrank-0.jsonl");
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].iteration, 1);
  EXPECT_EQ(records[1].iteration, 2);
  // DisableFP8GEMM takes fc2's wgrad out of FP8 at every iteration: the run differs, and fc2's
  // gradient quantizer still serves dgrad.
  const std::string high =
      run_with(seq, plain,
               "a:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
               "    DisableFP8GEMM: {gemms: [wgrad]}\n",
               test::make_temp_dir("debug_run_high"));
  EXPECT_NE(high, want);
  EXPECT_NE(high.find("quant  fc2.grad_output"), std::string::npos);
}

}  // namespace
}  // namespace opfuse::debug
