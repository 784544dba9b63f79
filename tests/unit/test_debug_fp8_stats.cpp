// LogFp8TensorStats end to end on the CPU (docs/debugging.md, "LogFp8TensorStats"): the slots a
// routing asks for, the reference's records of a plan variant against an independent computation
// of every cast (written here from the formulas, not with reference/quant_stats.h), the refusals
// TE's rules call for, the merge over micro-batches, and `fusec run --device cpu --debug-config`
// logging the statistics in TE's format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <span>

#include <nlohmann/json.hpp>

#include "cpu/block_quantization.h"
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

using cpu::Fp8Format;

// ---- the independent computation -------------------------------------------------------------

struct Expected {
  int64_t count = 0, underflows = 0, overflows = 0, blocks = 0, underflow_blocks = 0;
  double sq_err = 0;
  double inv_min = std::numeric_limits<double>::infinity();
  double inv_max = -std::numeric_limits<double>::infinity();
  std::vector<double> log2_invs;     // of the blocks holding a nonzero value
  std::map<int, int64_t> exponents;  // log2(scale_inv) -> blocks holding a nonzero value
};

float fp8_round(float v, Fp8Format f) { return cpu::fp8_to_float(cpu::float_to_fp8(v, f), f); }

// Casts the elements `at(i)` (i < n) with `scale` / `scale_inv` into `e`.
template <typename At>
bool cast_into(Expected& e, At at, int64_t n, float scale, float scale_inv, Fp8Format f,
               double overflow_above) {
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    const float v = at(i);
    const float q = fp8_round(v * scale, f);
    const double err = double(v) - double(q * scale_inv);
    ++e.count;
    e.sq_err += err * err;
    if (v != 0 && q == 0) {
      ++e.underflows;
      any = true;
    }
    if (std::fabs(double(v)) > overflow_above) ++e.overflows;
  }
  return any;
}

float amax_of(const std::vector<float>& x) {
  float a = 0;
  for (const float v : x) a = std::max(a, std::fabs(v));
  return a;
}

Expected per_tensor(const std::vector<float>& x, float scale, float scale_inv, Fp8Format f,
                    bool overflows) {
  Expected e;
  const double above =
      overflows ? double(cpu::fp8_max(f) * scale_inv) : std::numeric_limits<double>::infinity();
  cast_into(
      e, [&](int64_t i) { return x[size_t(i)]; }, int64_t(x.size()), scale, scale_inv, f, above);
  e.inv_min = e.inv_max = scale_inv;
  return e;
}

Expected current(const std::vector<float>& x, Fp8Format f) {
  const float scale = cpu::fp8_max(f) / amax_of(x);
  return per_tensor(x, scale, 1.0f / scale, f, false);
}

// Blocks of bh x bw; `mx`: E8M0 scale 2^ceil(log2(amax / fp8_max)), else the power of 2 at or
// below fp8_max / amax (frexp, not the reference's bit manipulation).
Expected blocks(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t bh, int64_t bw,
                bool mx, Fp8Format f) {
  Expected e;
  const float fmax = cpu::fp8_max(f);
  for (int64_t r0 = 0; r0 < rows; r0 += bh) {
    for (int64_t c0 = 0; c0 < cols; c0 += bw) {
      const int64_t h = std::min(bh, rows - r0), w = std::min(bw, cols - c0);
      auto at = [&](int64_t i) { return x[size_t((r0 + i / w) * cols + c0 + i % w)]; };
      float amax = 0;
      for (int64_t i = 0; i < h * w; ++i) amax = std::max(amax, std::fabs(at(i)));
      float scale = 1, inv = 1;
      int k = 0;
      if (mx) {
        const double m = std::frexp(double(amax / fmax), &k);  // amax / fmax = m * 2^k
        const int exponent = amax == 0 ? -127 : (m == 0.5 ? k - 1 : k);
        scale = float(std::ldexp(1.0, -exponent));
        inv = float(std::ldexp(1.0, exponent));
      } else if (amax > 0) {
        std::frexp(double(fmax / amax), &k);
        scale = float(std::ldexp(1.0, k - 1));
        inv = 1.0f / scale;
      }
      e.underflow_blocks +=
          cast_into(e, at, h * w, scale, inv, f, std::numeric_limits<double>::infinity());
      ++e.blocks;
      e.inv_min = std::min(e.inv_min, double(inv));
      e.inv_max = std::max(e.inv_max, double(inv));
      if (amax > 0) {
        e.log2_invs.push_back(std::log2(double(inv)));
        ++e.exponents[int(std::lround(std::log2(double(inv))))];
      }
    }
  }
  return e;
}

void expect_record(const QuantizedMoments& got, const Expected& want) {
  EXPECT_EQ(got.count, want.count);
  EXPECT_EQ(got.underflows, want.underflows);
  EXPECT_EQ(got.overflows, want.overflows);
  EXPECT_EQ(got.blocks, want.blocks);
  EXPECT_EQ(got.underflow_blocks, want.underflow_blocks);
  EXPECT_EQ(got.scale_inv_min, want.inv_min);
  EXPECT_EQ(got.scale_inv_max, want.inv_max);
  EXPECT_NEAR(got.sq_err, want.sq_err, 1e-9 * want.sq_err);
  EXPECT_EQ(got.scaled_blocks, int64_t(want.log2_invs.size()));
}

// ---- plan variants and reference records -----------------------------------------------------

const std::string kLinear = R"(
recipe fp8 = delayed_scaling()
sequence s(x: bf16[tokens, 160]) -> (y: bf16[tokens, 96]) uses fp8 {
  linear(160, 96, bias = false) as fc1
}
)";

driver::CompileResult compile(const std::string& text, const Routing* routing) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Plan;
  options.debug_routing = routing;
  driver::CompileResult r = driver::compile_source("s.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all() << r.error;
  return r;
}

// The program as the front end builds it (what a debug config's routing is applied to).
ir::Program compile_front(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::FrontEnd;
  driver::CompileResult r = driver::compile_source("s.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all() << r.error;
  return std::move(r.program);
}

const plan::StatSlot* find_slot(const ir::Sequence& seq, const std::string& tensor,
                                plan::QuantStatCast cast, bool columnwise, size_t* index) {
  for (size_t i = 0; i < seq.inspections.size(); ++i) {
    const plan::StatSlot& s = seq.inspections[i];
    if (s.tensor == tensor && s.record == plan::StatRecordKind::Quantized && s.cast == cast &&
        s.columnwise == columnwise) {
      *index = i;
      return &s;
    }
  }
  return nullptr;
}

// The reference run of a plan variant of kLinear: 200 tokens of x whose row r is scaled by
// 2^-(r % 24) (a spread of magnitudes, so that casts underflow; `zero_row` made all zeros), and
// a small dy when `backward`.
struct LinearRun {
  static constexpr int64_t kTokens = 200;
  cpu::ReferenceExecutor<float> exec;
  cpu::Tensor<float> x, dy;
};
LinearRun run_linear(const ir::Sequence& seq, bool backward, int64_t zero_row = -1) {
  LinearRun r{cpu::ReferenceExecutor<float>(seq, {{"tokens", LinearRun::kTokens}}), {}, {}};
  cpu::init_params_from_seed(r.exec, 7);
  r.x = cpu::seeded_normal({LinearRun::kTokens, 160}, 11, 1.0);
  for (int64_t i = 0; i < r.x.numel(); ++i)
    r.x.data[size_t(i)] *= std::ldexp(1.0f, -int(i / 160 % 24));
  if (zero_row >= 0) std::fill_n(r.x.data.begin() + zero_row * 160, 160, 0.0f);
  cpu::round_to_bf16(r.x.data);
  r.exec.forward({r.x});
  if (backward) {
    r.dy = cpu::seeded_normal({LinearRun::kTokens, 96}, 13, 1e-3);
    cpu::round_to_bf16(r.dy.data);
    r.exec.backward({r.dy});
  }
  return r;
}

// What one run's records log at iteration 1, by "tensor stat".
std::map<std::string, double> logged_of(std::span<const plan::StatSlot> slots,
                                        std::span<const TensorMoments> records,
                                        const Routing& routing) {
  IterationStats stats;
  stats.add_run(slots, records);
  std::map<std::string, double> logged;
  for (const StatRecord& rec : stats.records(routing, 1))
    logged[rec.tensor + " " + rec.stat] = rec.value;
  return logged;
}

TEST(Fp8Stats, RoutingAddsOneSlotPerDistinctCast) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats:\n      tensors: [activation, weight]\n"
      "      stats: [underflows%, mse_columnwise, fp8_delayed_scaling_mse, overflows%,\n"
      "              fp8_current_scaling_mse, fp8_block_scaling_mse, "
      "fp8_block_scaling_mse_columnwise,\n"
      "              mxfp8_scale_inv_min_columnwise]\n",
      {"fc1"}, true);
  const auto v = compile(kLinear, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  // Per tensor: moments, own quantizer (bare, _columnwise and fp8_delayed_scaling_ share it),
  // current, block rowwise and (activation only) block columnwise, MXFP8 columnwise.
  ASSERT_EQ(seq.inspections.size(), 6u + 5u);
  size_t i = 0;
  const plan::StatSlot* w = find_slot(seq, "weight", plan::QuantStatCast::Float8Block, false, &i);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dims, 2);  // 128 x 128 for a weight: its columnwise copy is the same blocks
  EXPECT_EQ(find_slot(seq, "weight", plan::QuantStatCast::Float8Block, true, &i), nullptr);
  const plan::StatSlot* a =
      find_slot(seq, "activation", plan::QuantStatCast::Float8Block, true, &i);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->block_size, 128);
  EXPECT_EQ(a->dims, 1);
  const plan::StatSlot* mx = find_slot(seq, "activation", plan::QuantStatCast::Mxfp8, true, &i);
  ASSERT_NE(mx, nullptr);
  EXPECT_EQ(mx->block_size, 32);
  // plan.json round-trips the slots.
  const plan::Plan back = plan::plan_from_json(plan::plan_to_json(v.plan));
  ASSERT_EQ(back.sequences.size(), 1u);
  EXPECT_EQ(back.sequences[0].stat_slots, v.plan.sequences[0].stat_slots);
  EXPECT_EQ(v.plan.sequences[0].stat_slots.size(), seq.inspections.size());
}

TEST(Fp8Stats, TeRulesRefuseWhatCannotBeComputed) {
  // Current-scaling recipe: a bare overflows% and fp8_delayed_scaling_ need a delayed quantizer.
  std::string current = kLinear;
  current.replace(current.find("delayed_scaling()"), 17, "current_scaling()");
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats: {tensors: [activation], stats: [overflows%, "
      "fp8_delayed_scaling_mse]}\n",
      {"fc1"}, true);
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.debug_routing = &r->routing;
  const auto result = driver::compile_source("s.fuse", current, sources, diags, options);
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.error.find("LogFp8TensorStats (layer 'fc1', activation): 'overflows%': its "
                              "quantizer uses current scaling"),
            std::string::npos)
      << result.error;
  EXPECT_NE(result.error.find("'fp8_delayed_scaling_mse'"), std::string::npos) << result.error;

  // A GEMM out of quantization: the tensor's own statistics have no cast to measure, what-ifs do.
  const auto off = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    DisableFP8Layer: {}\n"
      "    LogFp8TensorStats: {tensors: [weight], stats: [mse, mxfp8_mse]}\n",
      {"fc1"}, true);
  options.debug_routing = &off->routing;
  const auto r2 = driver::compile_source("s.fuse", kLinear, sources, diags, options);
  EXPECT_FALSE(r2.ok());
  EXPECT_NE(r2.error.find("'mse': the tensor is not quantized"), std::string::npos) << r2.error;
  EXPECT_EQ(r2.error.find("mxfp8_mse"), std::string::npos) << r2.error;
}

TEST(Fp8Stats, ReferenceRecordsMatchAnIndependentComputation) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats:\n      tensors: [activation, weight, gradient]\n"
      "      stats: [underflows%, overflows%, fp8_current_scaling_mse, fp8_block_scaling_mse,\n"
      "              fp8_block_scaling_mse_columnwise, mxfp8_mse, mxfp8_mse_columnwise]\n",
      {"fc1"}, true);
  const auto v = compile(kLinear, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  // 200 tokens: two row blocks of 128 (one partial) for the column blocks.
  const int64_t tokens = LinearRun::kTokens;
  LinearRun run = run_linear(seq, true);
  cpu::ReferenceExecutor<float>& exec = run.exec;
  const cpu::Tensor<float>& x = run.x;
  const cpu::Tensor<float>& dy = run.dy;
  const auto& records = exec.stat_records();
  ASSERT_EQ(records.size(), seq.inspections.size());

  struct Case {
    const char* tensor;
    const std::vector<float>* data;
    int64_t rows, cols;
    Fp8Format format;
  };
  const Case cases[] = {{"activation", &x.data, tokens, 160, Fp8Format::E4M3},
                        {"weight", &exec.param("fc1.weight").data, 96, 160, Fp8Format::E4M3},
                        {"gradient", &dy.data, tokens, 96, Fp8Format::E5M2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    const std::vector<float>& d = *c.data;
    size_t i = 0;
    // Step 0 of delayed scaling: the quantizer's scale is still 1.
    ASSERT_TRUE(find_slot(seq, c.tensor, plan::QuantStatCast::Quantizer, false, &i));
    expect_record(as_quantized(records[i]), per_tensor(d, 1.0f, 1.0f, c.format, true));
    ASSERT_TRUE(find_slot(seq, c.tensor, plan::QuantStatCast::Current, false, &i));
    expect_record(as_quantized(records[i]), current(d, c.format));
    const bool weight = std::string(c.tensor) == "weight";
    ASSERT_TRUE(find_slot(seq, c.tensor, plan::QuantStatCast::Float8Block, false, &i));
    expect_record(as_quantized(records[i]),
                  blocks(d, c.rows, c.cols, weight ? 128 : 1, 128, false, c.format));
    if (!weight) {
      ASSERT_TRUE(find_slot(seq, c.tensor, plan::QuantStatCast::Float8Block, true, &i));
      expect_record(as_quantized(records[i]), blocks(d, c.rows, c.cols, 128, 1, false, c.format));
    }
    ASSERT_TRUE(find_slot(seq, c.tensor, plan::QuantStatCast::Mxfp8, false, &i));
    const QuantizedMoments mx = as_quantized(records[i]);
    expect_record(mx, blocks(d, c.rows, c.cols, 1, 32, true, c.format));
    ASSERT_TRUE(find_slot(seq, c.tensor, plan::QuantStatCast::Mxfp8, true, &i));
    expect_record(as_quantized(records[i]), blocks(d, c.rows, c.cols, 32, 1, true, c.format));
  }
  // The spread of magnitudes made underflows: the test can tell a wrong count.
  size_t i = 0;
  ASSERT_TRUE(find_slot(seq, "activation", plan::QuantStatCast::Quantizer, false, &i));
  EXPECT_GT(as_quantized(records[i]).underflows, 0);
}

// scale_exponent_histogram: the Quantized record of its cast carries the histogram's parts right
// after it (one plan slot each, no op of their own), the reference fills them, and each bin that
// holds a block is logged as `{stat}_e{k}` with the number of blocks whose scale_inv is 2^k.
TEST(Fp8Stats, ScaleExponentHistogramsCountTheBlocksOfEachScale) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats:\n      tensors: [activation, gradient]\n"
      "      stats: [mxfp8_underflows%, mxfp8_scale_exponent_histogram,\n"
      "              fp8_block_scaling_scale_exponent_histogram_columnwise]\n",
      {"fc1"}, true);
  const auto v = compile(kLinear, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  // Per tensor: moments, MXFP8 (its histogram's parts after it), block columnwise (likewise).
  ASSERT_EQ(seq.inspections.size(), 2 * (3u + 2u * size_t(kExponentHistogramRecords)));
  for (const char* tensor : {"activation", "gradient"}) {
    for (const auto& [cast, columnwise] : {std::pair{plan::QuantStatCast::Mxfp8, false},
                                           std::pair{plan::QuantStatCast::Float8Block, true}}) {
      size_t i = 0;
      const plan::StatSlot* q = find_slot(seq, tensor, cast, columnwise, &i);
      ASSERT_NE(q, nullptr) << tensor;
      EXPECT_TRUE(q->exponent_histogram);
      for (int k = 0; k < kExponentHistogramRecords; ++k) {
        const plan::StatSlot& part = seq.inspections.at(i + 1 + size_t(k));
        EXPECT_EQ(part.record, plan::StatRecordKind::ExponentHistogram);
        EXPECT_EQ(part.part, k);
        EXPECT_EQ(part.cast, cast);
        EXPECT_EQ(part.columnwise, columnwise);
        EXPECT_EQ(part.tensor, tensor);
      }
    }
  }
  const plan::Plan back = plan::plan_from_json(plan::plan_to_json(v.plan));
  EXPECT_EQ(back.sequences.at(0).stat_slots, v.plan.sequences[0].stat_slots);
  // Only the Quantized records have ops: two statistics ops per tensor and the moments'.
  const auto stats_ops = std::count_if(seq.ops.begin(), seq.ops.end(), [](const ir::Operation& op) {
    return op.kind == ir::OpKind::TensorStats;
  });
  EXPECT_EQ(stats_ops, 6);

  const int64_t tokens = LinearRun::kTokens;
  const LinearRun run = run_linear(seq, true, 5);  // row 5 all zeros: blocks without a scale
  const cpu::ReferenceExecutor<float>& exec = run.exec;
  const cpu::Tensor<float>& x = run.x;
  const cpu::Tensor<float>& dy = run.dy;
  std::map<std::string, double> logged =
      logged_of(seq.inspections, exec.stat_records(), r->routing);

  struct Case {
    const char* tensor;
    const std::vector<float>* data;
    int64_t cols;
    Fp8Format format;
  };
  for (const Case& c : {Case{"activation", &x.data, 160, Fp8Format::E4M3},
                        Case{"gradient", &dy.data, 96, Fp8Format::E5M2}}) {
    SCOPED_TRACE(c.tensor);
    const Expected mx = blocks(*c.data, tokens, c.cols, 1, 32, true, c.format);
    const Expected col = blocks(*c.data, tokens, c.cols, 128, 1, false, c.format);
    if (c.tensor == std::string("activation")) {
      EXPECT_GT(mx.exponents.size(), 20u) << "a spread of scales";
      EXPECT_LT(int64_t(mx.log2_invs.size()), mx.blocks) << "blocks of zeros are not counted";
    }
    std::map<std::string, double> want;
    const std::string t = c.tensor;
    for (const auto& [e, n] : mx.exponents)
      want[t + " mxfp8_scale_exponent_histogram_e" + std::to_string(e)] = double(n);
    for (const auto& [e, n] : col.exponents)
      want[t + " fp8_block_scaling_scale_exponent_histogram_columnwise_e" + std::to_string(e)] =
          double(n);
    want[t + " mxfp8_underflows%"] = logged[t + " mxfp8_underflows%"];
    std::map<std::string, double> got;
    for (const auto& [name, value] : logged)
      if (name.starts_with(t + " ")) got[name] = value;
    EXPECT_EQ(got, want);
  }
}

TEST(Fp8Stats, MicroBatchesMergeAndWeightsCountOnce) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats: {tensors: [activation, weight], stats: [mxfp8_underflows%, "
      "mxfp8_underflow_blocks%]}\n",
      {"fc1"}, true);
  plan::StatSlot act{
      "fc1", "activation", 32, 1, plan::StatRecordKind::Quantized, plan::QuantStatCast::Mxfp8};
  plan::StatSlot wgt = act;
  wgt.tensor = "weight";
  const std::vector<plan::StatSlot> slots = {
      {"fc1", "activation", 0, 1}, act, {"fc1", "weight", 0, 1}, wgt};
  QuantizedMoments a1, a2, w;
  a1.count = 64;
  a1.underflows = 16;
  a1.blocks = 2;
  a1.underflow_blocks = 1;
  a2.count = 64;
  a2.underflows = 0;
  a2.blocks = 2;
  w.count = 10;
  w.underflows = 5;
  w.blocks = 1;
  w.underflow_blocks = 1;
  IterationStats stats;
  stats.add_run(slots, std::vector<TensorMoments>{{}, as_record(a1), {}, as_record(w)});
  stats.add_run(slots, std::vector<TensorMoments>{{}, as_record(a2), {}, as_record(a1)});
  const std::string dir = test::make_temp_dir("fp8_stats_log");
  {
    StatLog log = StatLog::open(dir, 0, 4, [] { return std::string("T"); });
    stats.log(r->routing, 3, log);
    log.end_step();
  }
  const std::string text =
      test::read_text(dir + "/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-0.log");
  for (const char* line :
       {"fc1_activation_mxfp8_underflows% \t\t\t\t iteration=000003 \t\t\t\t value=12.5000",
        "fc1_activation_mxfp8_underflow_blocks% \t\t\t\t iteration=000003 \t\t\t\t value=25.0000",
        "fc1_weight_mxfp8_underflows% \t\t\t\t iteration=000003 \t\t\t\t value=50.0000",
        "fc1_weight_mxfp8_underflow_blocks% \t\t\t\t iteration=000003 \t\t\t\t value=100.0000"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

// Under float8_block_scaling with TE's defaults the layer's own cast is the fp8_block_scaling_
// what-if: a bare statistic reads that record (one slot for both spellings) and logs the same
// value.
TEST(Fp8Stats, BlockScaledLayersMeasureTheirOwnBlockCast) {
  std::string blocks = kLinear;
  blocks.replace(blocks.find("delayed_scaling()"), 17, "float8_block_scaling()");
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats: {tensors: [activation, weight], stats: [mse, "
      "fp8_block_scaling_mse, underflows%]}\n",
      {"fc1"}, true);
  const auto v = compile(blocks, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  size_t i = 0;
  for (const plan::StatSlot& s : seq.inspections) {
    if (s.record == plan::StatRecordKind::Quantized) {
      EXPECT_NE(s.cast, plan::QuantStatCast::Quantizer) << s.tensor << ": no per-tensor cast";
    }
  }
  const plan::StatSlot* w = find_slot(seq, "weight", plan::QuantStatCast::Float8Block, false, &i);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dims, 2);
  ASSERT_NE(find_slot(seq, "activation", plan::QuantStatCast::Float8Block, false, &i), nullptr);
  EXPECT_EQ(seq.inspections.size(), 4u) << "moments and one block record per tensor";

  // The records a run would give: both spellings log the block record's value.
  QuantizedMoments q;
  q.count = 100;
  q.underflows = 25;
  q.sq_err = 2.0;
  std::vector<TensorMoments> records;
  for (const plan::StatSlot& s : seq.inspections)
    records.push_back(s.record == plan::StatRecordKind::Quantized ? as_record(q) : TensorMoments{});
  std::map<std::string, double> logged = logged_of(seq.inspections, records, r->routing);
  EXPECT_EQ(logged.count("activation mse"), 1u);
  EXPECT_EQ(logged["activation mse"], logged["activation fp8_block_scaling_mse"]);
  EXPECT_EQ(logged["weight underflows%"], 25.0);
}

// A float8_block_scaling recipe whose settings differ from the fp8_block_scaling_ what-if's
// (FP32 scales, an epsilon, 1x128 weight blocks) measures its own cast in a record of its own:
// the reference's statistics are those of the block cast its GEMMs read (runtime/cpu/
// block_quantization.h: its scale grid's extremes, its underflows, its error), and the what-if
// still logs TE's defaults.
TEST(Fp8Stats, BlockRecipesWithOtherSettingsMeasureTheirOwnCast) {
  std::string text = kLinear;
  text.replace(text.find("delayed_scaling()"), 17,
               "float8_block_scaling(power_of_2_scale = false, amax_epsilon = 0.001, w_block = 1)");
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats: {tensors: [activation, weight], stats: [underflows%, "
      "scale_inv_min, scale_inv_max, mse, mse_columnwise, fp8_block_scaling_scale_inv_max]}\n",
      {"fc1"}, true);
  const auto v = compile(text, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  size_t i = 0;
  const plan::StatSlot* w = find_slot(seq, "weight", plan::QuantStatCast::Quantizer, false, &i);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->block_size, 128);
  EXPECT_EQ(w->dims, 1) << "w_block = 1: the weight's own blocks are 1x128";
  ASSERT_NE(find_slot(seq, "activation", plan::QuantStatCast::Quantizer, true, &i), nullptr);
  ASSERT_NE(find_slot(seq, "weight", plan::QuantStatCast::Float8Block, false, &i), nullptr);

  const int64_t tokens = LinearRun::kTokens;
  LinearRun run = run_linear(seq, false);
  cpu::ReferenceExecutor<float>& exec = run.exec;
  const cpu::Tensor<float>& x = run.x;
  std::map<std::string, double> logged =
      logged_of(seq.inspections, exec.stat_records(), r->routing);

  struct Case {
    const char* tensor;
    const std::vector<float>* data;
    int64_t rows, cols;
  };
  const Case cases[] = {{"activation", &x.data, tokens, 160},
                        {"weight", &exec.param("fc1.weight").data, 96, 160}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    cpu::BlockQuantParams params;
    params.power_of_2_scale = false;
    params.epsilon = 0.001f;
    params.value_for_inf = cpu::bf16_max_finite();
    for (const bool columnwise : {false, true}) {
      const cpu::BlockQuantizedCopy copy =
          columnwise ? cpu::block_quantize_columnwise(*c.data, c.rows, c.cols, params)
                     : cpu::block_quantize_rowwise(*c.data, c.rows, c.cols, params);
      const std::vector<float> dq = cpu::block_dequantize(copy, params.format, false);
      double sq_err = 0, inv_min = INFINITY, inv_max = 0;
      int64_t underflows = 0;
      for (int64_t row = 0; row < copy.rows; ++row) {
        for (int64_t col = 0; col < copy.cols; ++col) {
          // The stored copy is transposed when column-wise.
          const float v = columnwise ? (*c.data)[size_t(col * c.cols + row)]
                                     : (*c.data)[size_t(row * c.cols + col)];
          const float got = dq[size_t(row * copy.cols + col)];
          sq_err += (double(v) - double(got)) * (double(v) - double(got));
          underflows += v != 0.0f && got == 0.0f;
          const double inv = copy.scale_inv_at(row, col, false);
          inv_min = std::min(inv_min, inv);
          inv_max = std::max(inv_max, inv);
        }
      }
      const double n = double(c.rows * c.cols);
      if (columnwise) {
        EXPECT_NEAR(logged[std::string(c.tensor) + " mse_columnwise"], sq_err / n,
                    1e-12 * sq_err / n);
        continue;
      }
      EXPECT_NEAR(logged[std::string(c.tensor) + " mse"], sq_err / n, 1e-12 * sq_err / n);
      EXPECT_EQ(logged[std::string(c.tensor) + " scale_inv_min"], inv_min);
      EXPECT_EQ(logged[std::string(c.tensor) + " scale_inv_max"], inv_max);
      EXPECT_DOUBLE_EQ(logged[std::string(c.tensor) + " underflows%"],
                       100.0 * double(underflows) / n);
      // FP32 scales are not powers of 2: the what-if (power-of-2 scales) logs other extremes.
      EXPECT_NE(logged[std::string(c.tensor) + " fp8_block_scaling_scale_inv_max"], inv_max);
    }
  }
  EXPECT_GT(logged["activation underflows%"], 0.0) << "the spread of magnitudes underflows";
}

// ---- fusec run --device cpu --debug-config ------------------------------------------------------

TEST(Fp8Stats, FusecRunLogsTheStatisticsOfTheWeight) {
  const std::string dir = test::make_temp_dir("fp8_stats_run");
  const std::string program = dir + "/s.fuse";
  std::ofstream(program) << kLinear;
  const std::string config = dir + "/debug.yaml";
  std::ofstream(config) << "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
                           "    LogFp8TensorStats:\n      tensors: [activation, weight, gradient]\n"
                           "      stats: [underflows%, mse, fp8_current_scaling_mse,\n"
                           "              fp8_block_scaling_scale_inv_max, mxfp8_mse_columnwise,\n"
                           "              mxfp8_scale_inv_log2_std]\n"
                           "      freq: 2\n";
  const auto run = test::fusec("run " + test::shell_quoted(program) +
                               " --device cpu --bind tokens=40 --steps 3 --seed 5"
                               " --debug-config " +
                               test::shell_quoted(config) + " --debug-log-dir " +
                               test::shell_quoted(dir + "/logs"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto records = read_stat_jsonl(dir + "/logs/opfuse_statistics/globalrank-0.jsonl");
  // Iterations 0 and 2, 3 tensors x 6 statistics.
  ASSERT_EQ(records.size(), 2u * 3 * 6);
  const std::string text =
      test::read_text(dir + "/logs/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-0.log");
  EXPECT_NE(text.find("fc1_weight_mxfp8_mse_columnwise \t\t\t\t iteration=000002"),
            std::string::npos)
      << text;

  // The weight at iteration 0 is the seeded initial one: recompute its statistics here.
  const auto v = compile(kLinear, nullptr);
  cpu::ReferenceExecutor<float> exec(v.program.sequences[0], {{"tokens", 40}});
  cpu::init_params_from_seed(exec, 5);
  const std::vector<float>& w = exec.param("fc1.weight").data;
  const Expected own = per_tensor(w, 1.0f, 1.0f, Fp8Format::E4M3, true);
  const Expected cur = current(w, Fp8Format::E4M3);
  const Expected blk = blocks(w, 96, 160, 128, 128, false, Fp8Format::E4M3);
  const Expected mx = blocks(w, 96, 160, 32, 1, true, Fp8Format::E4M3);
  const Expected mx_rows = blocks(w, 96, 160, 1, 32, true, Fp8Format::E4M3);
  const std::vector<double>& logs = mx_rows.log2_invs;
  double mean = 0, sq = 0;
  for (const double l : logs) mean += l / double(logs.size());
  for (const double l : logs) sq += (l - mean) * (l - mean) / double(logs.size());
  const std::pair<const char*, double> want[] = {
      {"underflows%", 100.0 * double(own.underflows) / double(own.count)},
      {"mse", own.sq_err / double(own.count)},
      {"fp8_current_scaling_mse", cur.sq_err / double(cur.count)},
      {"fp8_block_scaling_scale_inv_max", blk.inv_max},
      {"mxfp8_mse_columnwise", mx.sq_err / double(mx.count)},
      {"mxfp8_scale_inv_log2_std", std::sqrt(sq)}};
  for (const auto& entry : want) {
    const std::string stat = entry.first;
    SCOPED_TRACE(stat);
    const auto it = std::find_if(records.begin(), records.end(), [&](const StatRecord& r) {
      return r.iteration == 0 && r.tensor == "weight" && r.stat == stat;
    });
    ASSERT_NE(it, records.end());
    EXPECT_NEAR(it->value, entry.second, 1e-9 * std::fabs(entry.second) + 1e-12);
  }
}

// Emulated recipes (docs/language.md): an MXFP8 layer's own cast is the mxfp8_ what-if's (1 x 32
// blocks along the rows, E8M0 scales rounded up), one record for both spellings; an NVFP4 layer's
// is no FP8 cast, so LogFp8TensorStats of it is refused by name.
TEST(Fp8Stats, EmulatedRecipesMeasureMxfp8AndRefuseNvfp4) {
  const auto r = test::routed(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogFp8TensorStats: {tensors: [activation], stats: [mse, mxfp8_mse]}\n",
      {"fc1"}, true);
  std::string mx = kLinear;
  mx.replace(mx.find("delayed_scaling()"), 17, "mxfp8_block_scaling()");
  const auto v = compile(mx, &r->routing);
  const ir::Sequence& seq = v.program.sequences[0];
  size_t quantized = 0;
  for (const plan::StatSlot& s : seq.inspections) {
    if (s.record != plan::StatRecordKind::Quantized) continue;
    ++quantized;
    EXPECT_EQ(s.cast, plan::QuantStatCast::Mxfp8);
    EXPECT_EQ(s.block_size, 32);
  }
  EXPECT_EQ(quantized, 1u) << "the layer's own cast is the what-if's";

  std::string fp4 = kLinear;
  fp4.replace(fp4.find("delayed_scaling()"), 17, "nvfp4_block_scaling()");
  ir::Program program = compile_front(fp4);
  const std::vector<std::string> refused = apply_routing(program, r->routing);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("its quantizer is NVFP4"), std::string::npos) << refused[0];
}

// PerTensorScaling of one operand under a block or emulated recipe would pair a per-tensor FP8
// operand with a block-scaled or decoded one in one GEMM: refused, unless both are rescaled.
TEST(Fp8Stats, PerTensorScalingOfOneOperandNeedsAPerTensorPartner) {
  for (const char* recipe : {"float8_block_scaling()", "mxfp8_block_scaling()"}) {
    std::string text = kLinear;
    text.replace(text.find("delayed_scaling()"), 17, recipe);
    const auto one = test::routed(
        "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
        "    PerTensorScaling: {gemms: [fprop], tensors: [activation]}\n",
        {"fc1"}, true);
    ir::Program program = compile_front(text);
    const std::vector<std::string> refused = apply_routing(program, one->routing);
    ASSERT_EQ(refused.size(), 1u) << recipe;
    EXPECT_NE(refused[0].find("the GEMM's other operand (weight) is quantized as"),
              std::string::npos)
        << refused[0];
    const auto both = test::routed(
        "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
        "    PerTensorScaling: {gemms: [fprop], tensors: [activation, weight]}\n",
        {"fc1"}, true);
    ir::Program again = compile_front(text);
    EXPECT_TRUE(apply_routing(again, both->routing).empty()) << recipe;
  }
}

}  // namespace
}  // namespace opfuse::debug
