// `fusec run --device cpu --nproc N` (docs/parallel.md, "Running it"): a tensor-parallel
// sequence's ranks simulated in one process train the model the unsharded program trains. Every
// rank starts from its shard of the unsharded initialization (plan::ParamInitializer::fill_shard,
// shared by the CPU ranks and Session::own_parameters) and its share of the unsharded inputs, and
// the report (whole tensors, rank 0) equals the tp = 1 program's up to the order of sums.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/numerics.h"
#include "driver/compile.h"
#include "gpu/device.h"
#include "plan/parallel.h"
#include "plan/param_init.h"
#include "reference/collectives.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "test_support.h"

namespace opfuse {
namespace {

using test::contains;

// ---- the shared helper: the rank's shard of the unsharded initialization -----------------------

TEST(ShardedInit, FillShardKeepsTheRanksShardOfTheUnshardedDraws) {
  const plan::ParamInit normal = plan::ParamInit::normal(0.02);
  // The unsharded program's draws: a gated column-parallel weight [8, 3], a row-parallel weight
  // [4, 6] and a replicated bias [5], in creation order.
  plan::ParamInitializer unsharded(11);
  std::vector<float> gated(24), row(24), bias(5);
  unsharded.fill(normal, gated);
  unsharded.fill(normal, row);
  unsharded.fill(normal, bias);
  const plan::ShardSpec blocks{0, 2}, columns{1, 1};
  std::vector<std::vector<float>> gated_shards, row_shards;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    plan::ParamInitializer initializer(11);
    std::vector<float> g(12), r(12), b(5);
    initializer.fill_shard(normal, g, {4, 3}, blocks, 2, rank);
    initializer.fill_shard(normal, r, {4, 3}, columns, 2, rank);
    initializer.fill_shard(normal, b, {5}, plan::ShardSpec{}, 2, rank);
    EXPECT_EQ(g, plan::take_shard<float>(gated, {8, 3}, blocks, 2, rank));
    EXPECT_EQ(r, plan::take_shard<float>(row, {4, 6}, columns, 2, rank));
    // The generator moved on by the whole parameters' draws: the next one is the unsharded one.
    EXPECT_EQ(b, bias);
    // Spelled out: rank r holds gate rows [2r, 2r + 2) and value rows [4 + 2r, 4 + 2r + 2), and
    // columns [3r, 3r + 3) of every row.
    for (int i = 0; i < 2; ++i)
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(g[size_t(i * 3 + c)], gated[size_t((2 * rank + i) * 3 + c)]);
        EXPECT_EQ(g[size_t((2 + i) * 3 + c)], gated[size_t((4 + 2 * rank + i) * 3 + c)]);
      }
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < 3; ++c)
        EXPECT_EQ(r[size_t(i * 3 + c)], row[size_t(i * 6 + 3 * rank + c)]);
    gated_shards.push_back(g);
    row_shards.push_back(r);
  }
  EXPECT_EQ(plan::join_shards<float>({gated_shards[0], gated_shards[1]}, {4, 3}, blocks), gated);
  EXPECT_EQ(plan::join_shards<float>({row_shards[0], row_shards[1]}, {4, 3}, columns), row);
}

TEST(ShardedInit, FillShardOfOneRankOrAConstantIsFill) {
  plan::ParamInitializer a(3), b(3);
  std::vector<float> x(12), y(12);
  a.fill(plan::ParamInit::normal(1.0), x);
  b.fill_shard(plan::ParamInit::normal(1.0), y, {4, 3}, plan::ShardSpec{0, 2}, 1, 0);
  EXPECT_EQ(x, y);
  std::vector<float> ones(6);
  b.fill_shard(plan::ParamInit::constant(1.0), ones, {6}, plan::ShardSpec{0, 1}, 2, 1);
  EXPECT_EQ(ones, std::vector<float>(6, 1.0f));
}

TEST(ShardedInit, FillShardRefusesAShapeThatDoesNotFit) {
  plan::ParamInitializer initializer(3);
  std::vector<float> values(12);
  const plan::ParamInit normal = plan::ParamInit::normal(1.0);
  EXPECT_THROW(initializer.fill_shard(normal, values, {4, 4}, plan::ShardSpec{0, 1}, 2, 0),
               std::invalid_argument);
  EXPECT_THROW(initializer.fill_shard(normal, values, {4, 3}, plan::ShardSpec{0, 1}, 2, 2),
               std::invalid_argument);
  EXPECT_THROW(initializer.fill_shard(normal, values, {4, 3}, plan::ShardSpec{2, 1}, 2, 0),
               std::invalid_argument);
}

// ---- the programs -------------------------------------------------------------------------------

struct Variant {
  std::string recipe;  // bf16, delayed, current
  bool sp = true;
  std::string dtype = "bf16";
};

const char* recipe_line(const std::string& recipe) {
  if (recipe == "delayed") return "recipe r = delayed_scaling(amax_history = 4)\n";
  if (recipe == "current") return "recipe r = current_scaling()\n";
  return "recipe r = bf16()\n";
}

// mlp_tp.fuse at test sizes, with biases (a gated shard of fc1's, fc2's replicated one).
std::string tp_program(const Variant& v) {
  const std::string rows = v.sp ? "tokens / tp" : "tokens";
  return std::string(recipe_line(v.recipe)) + fmt::format(R"(const hidden = 64
const ffn = 256
sequence mlp(x: {0}[{1}, hidden]) -> (y: {0}[{1}, hidden])
    uses r with parallel(tp = 2, sp = {2}) {{
  layernorm(hidden, eps = 1e-5)
  linear(hidden, ffn, parallel = column) as fc1
  swiglu()
  linear(ffn / 2, hidden, parallel = row) as fc2
}}
)",
                                                          v.dtype, rows, v.sp);
}

// The same program on one GPU: `with parallel(...)` and the linears' `parallel = ...` removed,
// `tokens / tp` -> `tokens`.
std::string unsharded(const std::string& text) {
  std::string out = std::regex_replace(text, std::regex(R"( with parallel\([^)]*\))"), "");
  out = std::regex_replace(out, std::regex(R"(, parallel = (column|row))"), "");
  return std::regex_replace(out, std::regex("tokens / tp"), "tokens");
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = test::make_temp_dir("parallel_run") + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return test::shell_quoted(path);
}

// ---- the CPU ranks start where the unsharded program starts -------------------------------------

driver::CompileResult compile_to_plan(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = driver::Stage::Plan;
  driver::CompileResult r = driver::compile_source("tp.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all() << r.error;
  return r;
}

// Every rank's parameters (init_params_from_seed) join into the unsharded program's, and the
// plan's parameter buffers with their cuts (what Session::own_parameters fills) give each rank
// the same values as the CPU reference.
TEST(ShardedInit, TheRanksParametersJoinIntoTheUnshardedOnes) {
  const Variant v{"delayed", true};
  const driver::CompileResult split = compile_to_plan(tp_program(v));
  const driver::CompileResult whole = compile_to_plan(unsharded(tp_program(v)));
  ASSERT_TRUE(split.ok() && whole.ok());
  const cpu::Bindings bindings{{"tokens", 32}};
  cpu::ReferenceExecutor<float> one(whole.program.sequences.at(0), bindings);
  cpu::init_params_from_seed(one, 9);
  cpu::SimulatedGroup group(2);
  std::vector<cpu::ReferenceExecutor<float>> ranks;
  for (int r = 0; r < 2; ++r) {
    cpu::ReferenceOptions o;
    o.group = &group.rank(r);
    ranks.emplace_back(split.program.sequences.at(0), bindings, o);
    cpu::init_params_from_seed(ranks.back(), 9, r);
  }
  const ir::Sequence& s = ranks[0].sequence();
  ASSERT_EQ(ranks[0].param_names(), one.param_names());
  int sharded = 0;
  for (ir::ValueId p : s.params) {
    const ir::Value& param = s.value(p);
    SCOPED_TRACE(param.name);
    const std::vector<float>& want = one.param(param.name).data;
    if (!param.shard.sharded()) {
      for (auto& rank : ranks) EXPECT_EQ(rank.param(param.name).data, want);
      continue;
    }
    ++sharded;
    std::vector<std::span<const float>> shards;
    shards.reserve(ranks.size());
    for (auto& rank : ranks) shards.emplace_back(rank.param(param.name).data);
    EXPECT_EQ(plan::join_shards<float>(shards, ranks[0].param(param.name).shape, param.shard),
              want);
  }
  EXPECT_EQ(sharded, 3) << "fc1's weight and bias (gated), fc2's weight";

  // The plan's route, as Session::own_parameters takes it: buffers in plan order.
  const plan::SequencePlan& plan = split.plan.sequences.at(0);
  ASSERT_EQ(plan.parallel.tp, 2);
  for (int r = 0; r < 2; ++r) {
    plan::ParamInitializer initializer(9);
    int params = 0;
    for (const plan::Buffer& b : plan.buffers) {
      if (b.role != plan::BufferRole::Param || b.alias_of >= 0) continue;
      ++params;
      std::vector<int64_t> shape;
      for (const plan::SymExpr& d : b.shape) shape.push_back(*d.value());
      std::vector<float> values(size_t(*b.bytes.value() / plan::dtype_bytes(b.dtype)));
      initializer.fill_shard(b.init, values, shape, b.shard, plan.parallel.tp, r);
      cpu::round_to_bf16(values);
      EXPECT_EQ(values, ranks[size_t(r)].param(b.name.substr(1)).data) << b.name << " rank " << r;
    }
    EXPECT_EQ(params, 6);
  }
}

// ---- fusec run --device cpu --nproc 2 equals the unsharded run ----------------------------------

// Every number of a `fusec run` report by what it is: "0 loss", "0 |y|", "1 grad fc1.weight",
// "2 quant fc2.input amax", "2 quant fc2.input scale".
std::map<std::string, double> report_numbers(const std::string& report) {
  std::map<std::string, double> out;
  std::istringstream lines(report);
  std::string line, step;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::string first, name, a, b, c, d;
    words >> first;
    if (first == "step") {
      double loss = 0, magnitude = 0;
      words >> step >> a >> loss >> b >> magnitude;
      out[step + " loss"] = loss;
      out[step + " |y|"] = magnitude;
    } else if (first == "grad") {
      double norm = 0;
      words >> name >> a >> norm;
      out[fmt::format("{} grad {}", step, name)] = norm;
    } else if (first == "quant") {
      double amax = 0, scale = 0;
      words >> name >> a >> b >> amax >> c >> scale;
      out[fmt::format("{} quant {} amax", step, name)] = amax;
      out[fmt::format("{} quant {} scale", step, name)] = scale;
    }
  }
  return out;
}

// fusec's stdout (the report) with its exit code; stderr dropped.
test::CommandResult run_report(const std::string& args) {
  return test::run_command("{ " + test::fusec_path() + " run " + args + " 2>/dev/null; }");
}

double relative(double got, double want) {
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-30);
}

// Relative tolerances: the loss; the gradient norms, |y| and the amaxes; the scales of the
// forward quantizers (input, weight: their amaxes are of the same values on both sides); the
// scales of the gradients' quantizers, whose amaxes are of bf16 values that round differently.
struct Tolerance {
  double loss, others, scale, gradient_scale;
};

void expect_ranks_equal_unsharded(const Variant& v, const Tolerance& tol) {
  SCOPED_TRACE(fmt::format("{} recipe, sp = {}, {} tensors", v.recipe, v.sp, v.dtype));
  const std::string text = tp_program(v);
  // A large learning rate, so that the steps after the first train from changed parameters.
  const std::string args = " --bind tokens=64 --steps 3 --seed 4 --lr 100";
  const auto ranks = run_report("--device cpu --nproc 2 " + temp_file("tp.fuse", text) + args);
  const auto one = run_report("--device cpu " + temp_file("one.fuse", unsharded(text)) + args);
  ASSERT_EQ(ranks.exit_code, 0) << ranks.output;
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(contains(ranks.output, "ranks: tp = 2")) << ranks.output;
  const auto got = report_numbers(ranks.output), want = report_numbers(one.output);
  ASSERT_EQ(got.size(), want.size()) << ranks.output << one.output;
  // 3 steps x (loss, |y|, 6 gradients) and 6 quantizers' amax and scale.
  ASSERT_EQ(want.size(), v.recipe == "bf16" ? 24u : 60u) << one.output;
  EXPECT_NE(want.at("0 loss"), want.at("2 loss")) << "the steps do not train: " << one.output;
  if (v.recipe != "bf16") {
    EXPECT_NE(want.at("1 quant fc1.weight scale"), 1.0) << "no scale to compare: " << one.output;
  }
  for (const auto& [key, value] : want) {
    ASSERT_TRUE(got.count(key)) << key << " missing from\n" << ranks.output;
    double limit = tol.others;
    if (key.ends_with(" loss")) limit = tol.loss;
    if (key.ends_with(" scale"))
      limit = contains(key, ".grad_output") ? tol.gradient_scale : tol.scale;
    EXPECT_LE(relative(got.at(key), value), limit)
        << key << ": " << got.at(key) << " (2 ranks) vs " << value << " (unsharded)";
  }
}

// FP32 tensors: only the order of the sums differs.
TEST(ParallelRun, RanksEqualUnshardedFp32) {
  for (const bool sp : {true, false})
    expect_ranks_equal_unsharded({"bf16", sp, "fp32"}, {1e-5, 1e-5, 1e-5, 1e-5});
}

// BF16 tensors: fc2's partial products are rounded to bf16 before the ranks sum them, so an
// output now and then rounds to the neighbouring bf16 value (2^-8 apart): the loss moves by about
// 2e-4 and the norms of gradients that nearly cancel (the biases') by up to about 7e-3 (measured
// over seeds); a wrong shard or a missing reduction moves them by far more.
TEST(ParallelRun, RanksEqualUnshardedBf16) {
  for (const bool sp : {true, false})
    expect_ranks_equal_unsharded({"bf16", sp, "bf16"}, {5e-4, 5e-3, 0, 0});
}

// FP8: the forward quantizers' scales equal (their amaxes are reduced over the ranks), the loss
// within 1e-3; gradients, their amaxes and the scales derived from them move where a bf16 or FP8
// value rounds the other way (up to about 2e-2 over seeds).
TEST(ParallelRun, RanksEqualUnshardedFp8Delayed) {
  for (const bool sp : {true, false})
    expect_ranks_equal_unsharded({"delayed", sp, "bf16"}, {1e-3, 3e-2, 1e-6, 3e-2});
}

TEST(ParallelRun, RanksEqualUnshardedFp8Current) {
  for (const bool sp : {true, false})
    expect_ranks_equal_unsharded({"current", sp, "bf16"}, {1e-3, 3e-2, 1e-6, 3e-2});
}

// ---- errors and the auto device ----------------------------------------------------------------

// stderr alone; stdout dropped.
test::CommandResult run_errors(const std::string& args) {
  return test::run_command("{ " + test::fusec_path() + " run " + args + " 2>&1 >/dev/null; }");
}

void expect_one_error_line(const test::CommandResult& r, const std::string& message) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.output, "fusec: error: " + message + "\n");
}

TEST(ParallelRun, ANprocThatIsNotTheSequencesTpIsRefused) {
  const std::string tp = temp_file("tp.fuse", tp_program({"bf16", true}));
  const std::string one = temp_file("one.fuse", unsharded(tp_program({"bf16", true})));
  expect_one_error_line(
      run_errors("--device cpu --nproc 3 " + tp + " --bind tokens=64"),
      "sequence 'mlp' is tensor-parallel over tp = 2 ranks: run it with --nproc 2, not --nproc 3");
  expect_one_error_line(run_errors("--device cpu " + tp + " --bind tokens=64"),
                        "sequence 'mlp' is tensor-parallel over tp = 2 ranks: run it with "
                        "--nproc 2");
  expect_one_error_line(run_errors("--device cpu --nproc 2 " + one + " --bind tokens=64"),
                        "--nproc 2 runs the ranks of a sequence `with parallel(tp = 2)`, but "
                        "sequence 'mlp' is not tensor-parallel; run it without --nproc");
}

TEST(ParallelRun, TokensThatDoNotSplitAndDebugConfigsAreRefused) {
  const std::string tp = temp_file("tp.fuse", tp_program({"bf16", true}));
  const auto odd = run_errors("--device cpu --nproc 2 " + tp + " --bind tokens=63");
  EXPECT_EQ(odd.exit_code, 1) << odd.output;
  EXPECT_EQ(odd.output.rfind("fusec: error: dimension 'tokens' of sequence 'mlp' is bound to 63, "
                             "which does not divide into 2",
                             0),
            0u)
      << odd.output;
  EXPECT_EQ(std::count(odd.output.begin(), odd.output.end(), '\n'), 1) << odd.output;
  const std::string config = temp_file("config.yaml", "x:\n  enabled: true\n");
  const std::string logs = test::make_temp_dir("parallel_run_logs");
  expect_one_error_line(
      run_errors("--device cpu --nproc 2 " + tp + " --bind tokens=64 --debug-config " + config +
                 " --debug-log-dir " + test::shell_quoted(logs)),
      "--debug-config: sequence 'mlp' is tensor-parallel and the precision-debug variants do not "
      "run over several ranks yet; run the config on the one-rank program");
}

// Without a GPU, --device auto runs the ranks on the CPU reference and says so.
TEST(ParallelRun, AutoWithoutAGpuRunsTheSimulatedRanks) {
  if (gpu::gpu_available()) GTEST_SKIP() << "a GPU is present: --device auto launches processes";
  const std::string tp = temp_file("tp.fuse", tp_program({"bf16", true}));
  const std::string args = tp + " --nproc 2 --bind tokens=32";
  const auto note = run_errors("--device auto " + args);
  EXPECT_EQ(note.exit_code, 0) << note.output;
  EXPECT_TRUE(contains(note.output,
                       "running on the CPU reference (2 simulated ranks in one "
                       "process)"))
      << note.output;
  const auto cpu = run_report("--device cpu " + args);
  const auto automatic = run_report("--device auto " + args);
  EXPECT_EQ(cpu.exit_code, 0) << cpu.output;
  EXPECT_TRUE(contains(cpu.output, "step    0  loss")) << cpu.output;
  EXPECT_EQ(automatic.output, cpu.output);
}

}  // namespace
}  // namespace opfuse
