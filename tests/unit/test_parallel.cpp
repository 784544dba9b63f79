// Tensor parallelism (docs/parallel.md): the language's parallel option, collectives and
// parallel linears, their located errors, the training graph they make, and the CPU reference's
// simulated ranks: a sharded run equals the unsharded one under each recipe.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/numerics.h"
#include "driver/compile.h"
#include "driver/frontend.h"
#include "ir/printer.h"
#include "plan/parallel.h"
#include "reference/collectives.h"
#include "reference/reference_executor.h"
#include "test_support.h"

namespace opfuse {
namespace {

struct Built {
  std::optional<ir::Program> program;
  std::string errors;
};

Built build(const std::string& text) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  Built b;
  b.program = load_program_from_source("tp.fuse", text, sources, diags);
  b.errors = diags.format_all();
  if (diags.has_errors()) b.program.reset();
  return b;
}

ir::Program compile(const std::string& text) {
  Built b = build(text);
  EXPECT_TRUE(b.program) << b.errors;
  if (!b.program) throw std::runtime_error("program did not compile");
  return *b.program;
}

const char* recipe_line(const std::string& recipe) {
  if (recipe == "delayed") return "recipe r = delayed_scaling(amax_history = 4)\n";
  if (recipe == "current") return "recipe r = current_scaling()\n";
  return "recipe r = bf16()\n";
}

// The seed MLP with biases, at test sizes; tp = 1 is the unsharded program.
std::string mlp(int tp, bool sp, const std::string& recipe) {
  return std::string(recipe_line(recipe)) + fmt::format(R"(const hidden = 64
const ffn = 256
sequence mlp(x: bf16[{0}, hidden]) -> (y: bf16[{0}, hidden]) uses r with parallel(tp = {1}, sp = {2}) {{
  layernorm(hidden)
  linear(hidden, ffn, parallel = column) as fc1
  swiglu()
  linear(ffn / 2, hidden, parallel = row) as fc2
}}
)",
                                                        sp ? "tokens / tp" : "tokens", tp, sp);
}

// The training graph as the reference runs it (build-backward, plan-quantization, no fusion).
std::string ir_text(ir::Program p) {
  driver::CompileOptions unfused;
  unfused.disabled_passes = {"eliminate-aliases", "fuse-forward", "fuse-backward"};
  unfused.last_stage = driver::Stage::Passes;
  driver::CompileResult lowered = driver::compile_ir(std::move(p), nullptr, nullptr, unfused);
  EXPECT_EQ(lowered.status, driver::CompileStatus::Ok) << lowered.error;
  return ir::print_program(lowered.program, nullptr);
}

// ---- the language: located errors ---------------------------------------------------------------

struct BadCase {
  const char* name;
  std::string source;
  std::string expected;  // in the diagnostics, with its location
};

TEST(ParallelLanguage, BadGroupsAndShapesAreLocatedErrors) {
  const std::string head = "const hidden = 64\n";
  const BadCase cases[] = {
      {"tp out of range",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) with "
              "parallel(tp = 0) {\n  identity()\n}\n",
       "tp.fuse:2:85: error: tp = 0 is out of range"},
      {"unknown argument",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) with "
              "parallel(tp = 2, seq = true) {\n  identity()\n}\n",
       "parallel has no argument 'seq'"},
      {"no tp",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) with "
              "parallel(sp = true) {\n  identity()\n}\n",
       "parallel needs the group size tp"},
      {"out does not divide",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, 64]) with "
              "parallel(tp = 3) {\n  linear(hidden, 64, parallel = column)\n  linear(64, 64, "
              "parallel = row)\n}\n",
       "tp.fuse:3:18: error: out = 64 does not divide over tp = 3 ranks"},
      {"bad mode",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, 64]) with "
              "parallel(tp = 2) {\n  linear(hidden, 64, parallel = diagonal)\n}\n",
       "parallel = diagonal is not a tensor-parallel mode"},
      {"row reads a whole tensor",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, 64]) with "
              "parallel(tp = 2) {\n  linear(hidden, 64, parallel = row)\n}\n",
       "a row-parallel linear reads in / tp = 64 / 2 = 32 features on each rank"},
      {"norm of split features",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) with "
              "parallel(tp = 2) {\n  linear(hidden, 64, parallel = column)\n  layernorm(32)\n  "
              "linear(64, hidden, parallel = row)\n}\n",
       "tp.fuse:4:3: error: 'layernorm' cannot take a tensor split over the ranks on its features"},
      {"output split on features",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, 32]) with "
              "parallel(tp = 2) {\n  linear(hidden, 64, parallel = column)\n}\n",
       "output 'y' is split over the ranks on its features"},
      {"activation of partial sums",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) with "
              "parallel(tp = 2) {\n  linear(hidden, 64, parallel = column)\n  linear(64, hidden, "
              "parallel = row, bias = false)\n  gelu()\n}\n",
       ""},  // fine: the row linear reduces before gelu
      {"gather along features",
       head + "sequence s(x: bf16[tokens / tp, hidden]) -> (y: bf16[tokens, hidden]) with "
              "parallel(tp = 2, sp = true) {\n  all_gather(dim = 1)\n}\n",
       "all_gather along dim 1 is not supported"},
      {"gather a replicated tensor",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) with "
              "parallel(tp = 2) {\n  all_gather()\n}\n",
       "all_gather of bf16[tokens, 64]: dimension 0 is tokens, not a rank's share"},
      {"reduce a replicated tensor",
       head + "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) with "
              "parallel(tp = 2) {\n  all_reduce()\n}\n",
       "'all_reduce' cannot take a tensor replicated on every rank"},
      {"scatter rows that do not divide",
       head + "sequence s(x: bf16[6, hidden]) -> (y: bf16[3, hidden]) with parallel(tp = 4) {\n"
              "  linear(hidden, 64, parallel = column)\n  linear(64, hidden, parallel = row)\n  "
              "reduce_scatter()\n}\n",
       "tp.fuse:5:3: error: reduce_scatter of bf16[6, 64]: dimension 0 = 6 does not divide over "
       "tp = 4 ranks"},
      {"tp constant disagrees",
       "const tp = 4\n" + head +
           "sequence s(x: bf16[tokens, hidden]) -> (y: bf16[tokens, hidden]) with parallel(tp = "
           "2) {\n  identity()\n}\n",
       "parallel(tp = 2) disagrees with the constant tp = 4"},
      {"flag with arguments",
       head + "recipe f = delayed_scaling()\nsequence s(x: bf16[tokens, hidden]) -> (y: "
              "bf16[tokens, hidden]) uses f with fp8_weights(1) {\n  identity()\n}\n",
       "sequence option 'fp8_weights' takes no arguments"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Built b = build(c.source);
    if (c.expected.empty()) {
      EXPECT_TRUE(b.program) << b.errors;
      continue;
    }
    EXPECT_FALSE(b.program);
    EXPECT_TRUE(test::contains(b.errors, c.expected)) << b.errors;
    EXPECT_TRUE(test::contains(b.errors, "^")) << "no caret under the error:\n" << b.errors;
  }
}

TEST(ParallelLanguage, SymbolSharesAreTypedAndGatheredBack) {
  const ir::Program p = compile(mlp(4, true, "bf16"));
  const ir::Sequence& s = p.sequences.at(0);
  EXPECT_EQ(s.parallel, (plan::ParallelSpec{4, true}));
  EXPECT_EQ(ir::type_string(s.value(s.inputs[0]).type), "bf16[tokens / 4, 64]");
  const std::string text = ir_text(p);
  // fc1 gathers the tokens (its input is the ranks' shares), fc2 scatters its sums.
  EXPECT_TRUE(test::contains(text, "all_gather(%0) {dim = 0} as \"fc1.gather\" : bf16[tokens, 64]"))
      << text;
  EXPECT_TRUE(test::contains(text, "{in = 64, out = 64, bias = true, parallel = column}")) << text;
  EXPECT_TRUE(test::contains(text, "{in = 32, out = 64, bias = false, parallel = row}")) << text;
  EXPECT_TRUE(test::contains(text, "reduce_scatter(%")) << text;
  EXPECT_TRUE(test::contains(text, "param %fc1.weight: bf16[64, 64] shard(dim = 0, blocks = 2)"))
      << text;
  EXPECT_TRUE(test::contains(text, "param %fc1.bias: bf16[64] shard(dim = 0, blocks = 2)")) << text;
  EXPECT_TRUE(test::contains(text, "param %fc2.weight: bf16[64, 32] shard(dim = 1)")) << text;
  // The row-parallel bias comes after the reduction and keeps its name; it is not sharded.
  EXPECT_TRUE(test::contains(text, "param %fc2.bias: bf16[64]\n")) << text;
  EXPECT_TRUE(test::contains(text, "as \"fc2.bias\" : bf16[tokens / 4, 64]")) << text;
}

// TE's backward rules: gather <-> scatter; a column-parallel linear whose input every rank holds
// sums its dgrad; under sequence parallelism the replicated parameters' gradients are summed.
TEST(ParallelLanguage, BackwardSumsWhereTransformerEngineDoes) {
  const std::string sp_text = ir_text(compile(mlp(2, true, "bf16")));
  const size_t backward = sp_text.find("backward:");
  ASSERT_NE(backward, std::string::npos);
  const std::string sp_bwd = sp_text.substr(backward);
  EXPECT_TRUE(test::contains(sp_bwd, "all_gather(%dy)")) << sp_bwd;
  EXPECT_EQ(test::count(sp_bwd, "reduce_scatter("), 1u) << sp_bwd;
  // layernorm weight and bias, fc2.bias: summed over the ranks.
  EXPECT_EQ(test::count(sp_bwd, "= all_reduce("), 3u) << sp_bwd;

  const std::string tp_text = ir_text(compile(mlp(2, false, "bf16")));
  const std::string tp_bwd = tp_text.substr(tp_text.find("backward:"));
  EXPECT_FALSE(test::contains(tp_bwd, "all_gather(")) << tp_bwd;
  EXPECT_FALSE(test::contains(tp_bwd, "reduce_scatter(")) << tp_bwd;
  // fc1's dgrad only: every other gradient is already whole on every rank.
  EXPECT_EQ(test::count(tp_bwd, "= all_reduce("), 1u) << tp_bwd;
  EXPECT_TRUE(test::contains(tp_text.substr(0, tp_text.find("backward:")), "all_reduce(%"))
      << "the forward sums fc2's partial products";
}

// Each backward collective follows the op that makes its operand (build_backward's
// hoist_collectives), so the runtime overlaps it with the ops that do not need it: fc1's summed
// dgrad goes on the wire before fc1's wgrad GEMM, with and without sequence parallelism.
TEST(ParallelLanguage, BackwardCollectivesFollowTheirProducers) {
  for (const bool sp : {true, false}) {
    SCOPED_TRACE(sp ? "sp" : "no sp");
    const std::string text = ir_text(compile(mlp(2, sp, "bf16")));
    const std::string bwd = text.substr(text.find("backward:"));
    const size_t dgrad = bwd.find("linear_dgrad(", bwd.find("as \"fc2\""));
    const size_t sum = bwd.find(sp ? "reduce_scatter(" : "= all_reduce(", dgrad);
    const size_t wgrad = bwd.find("linear_wgrad(", dgrad);
    ASSERT_NE(dgrad, std::string::npos) << bwd;
    ASSERT_NE(sum, std::string::npos) << bwd;
    ASSERT_NE(wgrad, std::string::npos) << bwd;
    // fc1's dgrad, its sum, then fc1's wgrad (the rules emit dgrad and wgrad together).
    EXPECT_LT(sum, wgrad) << bwd;
    EXPECT_EQ(dgrad, bwd.rfind("linear_dgrad(")) << "fc1's is the last dgrad:\n" << bwd;
  }
}

TEST(ParallelLanguage, OneRankIsThePlainProgram) {
  const std::string one = ir_text(compile(mlp(1, false, "delayed")));
  EXPECT_FALSE(test::contains(one, "all_")) << one;
  EXPECT_FALSE(test::contains(one, "shard(")) << one;
  EXPECT_FALSE(test::contains(one, "parallel(")) << one;
}

// ---- shards
// ---------------------------------------------------------------------------------------

TEST(ParallelShards, TakeAndJoinAreInverseAndPairGatedBlocks) {
  std::vector<float> full(24);  // [8, 3]
  for (size_t i = 0; i < full.size(); ++i) full[i] = float(i);
  const plan::ShardSpec gated{0, 2};
  const auto r0 = plan::take_shard<float>(full, {8, 3}, gated, 2, 0);
  const auto r1 = plan::take_shard<float>(full, {8, 3}, gated, 2, 1);
  // Rows 0-3 are the gate, 4-7 the value: rank 0 holds gate rows 0-1 and value rows 4-5.
  EXPECT_EQ(r0, (std::vector<float>{0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(r1, (std::vector<float>{6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23}));
  EXPECT_EQ(plan::join_shards<float>({r0, r1}, {4, 3}, gated), full);
  const plan::ShardSpec cols{1, 1};
  const auto c1 = plan::take_shard<float>(full, {8, 3}, plan::ShardSpec{1, 1}, 3, 1);
  EXPECT_EQ(c1, (std::vector<float>{1, 4, 7, 10, 13, 16, 19, 22}));
  std::vector<std::vector<float>> parts;
  parts.reserve(3);
  for (int r = 0; r < 3; ++r) parts.push_back(plan::take_shard<float>(full, {8, 3}, cols, 3, r));
  EXPECT_EQ(plan::join_shards<float>({parts[0], parts[1], parts[2]}, {8, 1}, cols), full);
  EXPECT_THROW((void)plan::take_shard<float>(full, {8, 3}, cols, 2, 0), std::invalid_argument);
}

// ---- the reference: sharded equals unsharded ----------------------------------------------------

using Tensor = cpu::Tensor<float>;

struct Run {
  std::vector<float> y, dx, y2;
  std::map<std::string, std::vector<float>> grads;
};

struct Data {
  std::vector<float> x, dy;
  std::map<std::string, std::vector<float>> params;  // unsharded
  std::map<std::string, std::vector<int64_t>> shapes;
};

constexpr int64_t kTokens = 32;

Run run_rank(cpu::ReferenceExecutor<float>& e, const Data& d, int tp, int rank, bool sp) {
  const ir::Sequence& s = e.sequence();
  for (const std::string& name : e.param_names()) {
    const ir::Value* v = nullptr;
    for (const ir::Value& value : s.values)
      if (value.kind == ir::ValueKind::Param && value.name == name) v = &value;
    const std::vector<float>& full = d.params.at(name);
    e.param(name).data = v->shard.sharded()
                             ? plan::take_shard<float>(full, d.shapes.at(name), v->shard, tp, rank)
                             : full;
  }
  e.params_changed();
  const int64_t rows = sp ? kTokens / tp : kTokens;
  const int64_t first = sp ? rank * rows : 0;
  auto slice = [&](const std::vector<float>& all) {
    Tensor t = Tensor::zeros({rows, 64});
    std::copy(all.begin() + first * 64, all.begin() + (first + rows) * 64, t.data.begin());
    return t;
  };
  Run r;
  r.y = e.forward({slice(d.x)}).at(0).data;
  const cpu::Gradients<float> g = e.backward({slice(d.dy)});
  r.dx = g.inputs.at(0).data;
  for (size_t i = 0; i < e.param_names().size(); ++i)
    r.grads[e.param_names()[i]] = g.params[i].data;
  e.step();
  r.y2 = e.forward({slice(d.x)}).at(0).data;
  return r;
}

Data make_data(const ir::Program& unsharded) {
  cpu::ReferenceExecutor<float> e(unsharded.sequences.at(0), {{"tokens", kTokens}});
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Data d;
  for (const std::string& name : e.param_names()) {
    Tensor& p = e.param(name);
    d.shapes[name] = p.shape;
    std::vector<float> v(p.data.size());
    const bool gamma = name.find("layernorm") != std::string::npos && name.ends_with("weight");
    for (float& x : v) x = gamma ? 1.0f + 0.1f * n(rng) : 0.1f * n(rng);
    d.params[name] = v;
  }
  d.x.resize(kTokens * 64);
  d.dy.resize(kTokens * 64);
  for (float& x : d.x) x = n(rng);
  for (float& x : d.dy) x = 0.1f * n(rng);
  // bf16 values, as the sequence's bf16 inputs hold them on a device.
  cpu::round_to_bf16(d.x);
  cpu::round_to_bf16(d.dy);
  for (auto& [name, v] : d.params) cpu::round_to_bf16(v);
  return d;
}

// BF16: the largest difference over the largest value. FP8: the root-mean-square difference over
// the root-mean-square value, since a sum taken in another order moves a value across an FP8
// rounding boundary now and then (E5M2 steps are 25% apart), while a wrong shard or a missing
// reduction is off everywhere.
bool fp8_metric = false;
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 1e-6, sq_diff = 0, sq = 1e-12;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = double(got[i]) - want[i];
    diff = std::max(diff, std::fabs(d));
    scale = std::max(scale, std::fabs(double(want[i])));
    sq_diff += d * d;
    sq += double(want[i]) * want[i];
  }
  return fp8_metric ? std::sqrt(sq_diff / sq) : diff / scale;
}

std::vector<float> concat(const std::vector<Run>& runs, std::vector<float> Run::*field) {
  std::vector<float> out;
  for (const Run& r : runs) out.insert(out.end(), (r.*field).begin(), (r.*field).end());
  return out;
}

// Every rank of `split` run on its own thread over one simulated group; `executors` keeps them
// (their quantizers) for the caller.
std::vector<Run> run_sharded(const ir::Sequence& split, const Data& d, int tp, bool sp,
                             std::vector<cpu::ReferenceExecutor<float>>& executors) {
  cpu::SimulatedGroup group(tp);
  std::vector<Run> runs(static_cast<size_t>(tp));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(tp));
  executors.clear();
  for (int r = 0; r < tp; ++r) {
    cpu::ReferenceOptions o;
    o.group = &group.rank(r);
    executors.emplace_back(split, cpu::Bindings{{"tokens", kTokens}}, o);
  }
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        runs[size_t(r)] = run_rank(executors[size_t(r)], d, tp, r, sp);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return runs;
}

void expect_sharded_equals_unsharded(int tp, bool sp, const std::string& recipe, double tol) {
  SCOPED_TRACE(fmt::format("tp = {}, sp = {}, {}", tp, sp, recipe));
  fp8_metric = recipe != "bf16";
  const ir::Program whole = compile(mlp(1, false, recipe));
  const ir::Program split = compile(mlp(tp, sp, recipe));
  const Data d = make_data(whole);
  cpu::ReferenceExecutor<float> one(whole.sequences.at(0), {{"tokens", kTokens}});
  const Run want = run_rank(one, d, 1, 0, false);
  std::vector<cpu::ReferenceExecutor<float>> executors;
  const std::vector<Run> runs = run_sharded(split.sequences.at(0), d, tp, sp, executors);

  if (sp) {
    EXPECT_LE(relative_error(concat(runs, &Run::y), want.y), tol) << "y";
    EXPECT_LE(relative_error(concat(runs, &Run::dx), want.dx), tol) << "dx";
    EXPECT_LE(relative_error(concat(runs, &Run::y2), want.y2), tol) << "y after step";
  } else {
    for (const Run& r : runs) {
      EXPECT_LE(relative_error(r.y, want.y), tol) << "y";
      EXPECT_LE(relative_error(r.dx, want.dx), tol) << "dx";
      EXPECT_LE(relative_error(r.y2, want.y2), tol) << "y after step";
    }
  }
  const ir::Sequence& s = executors[0].sequence();
  for (const auto& [name, g] : want.grads) {
    SCOPED_TRACE(name);
    const ir::Value* v = nullptr;
    for (const ir::Value& value : s.values)
      if (value.kind == ir::ValueKind::Param && value.name == name) v = &value;
    ASSERT_NE(v, nullptr);
    if (v->shard.sharded()) {
      std::vector<std::span<const float>> shards;
      shards.reserve(runs.size());
      for (const Run& r : runs) shards.emplace_back(r.grads.at(name));
      const std::vector<int64_t> shape = plan::shard_shape(d.shapes.at(name), v->shard, tp);
      EXPECT_LE(relative_error(plan::join_shards<float>(shards, shape, v->shard), g), tol);
    } else {
      for (const Run& r : runs) EXPECT_LE(relative_error(r.grads.at(name), g), tol);
    }
  }
  // The ranks' quantizers agree with the unsharded run's (amaxes reduced over the group).
  const auto q_want = one.quantizers();
  for (const auto& e : executors) {
    const auto q = e.quantizers();
    ASSERT_EQ(q.size(), q_want.size());
    for (size_t i = 0; i < q.size(); ++i) {
      SCOPED_TRACE(q[i].name);
      EXPECT_NEAR(q[i].scale, q_want[i].scale, 1e-2 * q_want[i].scale);
    }
  }
}

TEST(ParallelReference, ShardedEqualsUnshardedBf16) {
  expect_sharded_equals_unsharded(2, false, "bf16", 1e-2);
  expect_sharded_equals_unsharded(2, true, "bf16", 1e-2);
  expect_sharded_equals_unsharded(4, true, "bf16", 1e-2);
}

TEST(ParallelReference, ShardedEqualsUnshardedFp8Delayed) {
  expect_sharded_equals_unsharded(2, false, "delayed", 3e-2);
  expect_sharded_equals_unsharded(2, true, "delayed", 3e-2);
  expect_sharded_equals_unsharded(4, true, "delayed", 3e-2);
}

TEST(ParallelReference, ShardedEqualsUnshardedFp8Current) {
  expect_sharded_equals_unsharded(2, false, "current", 3e-2);
  expect_sharded_equals_unsharded(2, true, "current", 3e-2);
}

// ---- the data-parallel group's amax reduction (ReferenceOptions::amax_group) --------------------

// Two replicas of the one-rank MLP train on different data (the second's inputs with a spike in
// every row, which the LayerNorm keeps, and smaller output gradients);
// with an amax group their step() max-reduces every delayed amax, so both derive the scales of
// the larger amax, the scales a lone replica derives from its own data when its amax is the larger.
TEST(ParallelReference, DataParallelReplicasShareTheirDelayedScales) {
  const ir::Program whole = compile(mlp(1, false, "delayed"));
  Data d0 = make_data(whole);
  Data d1 = d0;
  for (size_t row = 0; row < d1.x.size() / 64; ++row) d1.x[row * 64 + row % 64] = 40.0f;
  for (float& v : d1.dy) v *= 0.25f;
  const Data* data[] = {&d0, &d1};
  auto train = [&](bool grouped) {
    cpu::SimulatedGroup group(2);
    std::vector<cpu::ReferenceExecutor<float>> replicas;
    replicas.reserve(2);
    for (int r = 0; r < 2; ++r) {
      cpu::ReferenceOptions o;
      if (grouped) o.amax_group = &group.rank(r);
      replicas.emplace_back(whole.sequences.at(0), cpu::Bindings{{"tokens", kTokens}}, o);
    }
    std::vector<std::thread> threads;
    threads.reserve(2);
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] { run_rank(replicas[size_t(r)], *data[r], 1, 0, false); });
    for (std::thread& t : threads) t.join();
    std::vector<std::vector<cpu::QuantizerInfo>> q;
    q.reserve(replicas.size());
    for (const auto& e : replicas) q.push_back(e.quantizers());
    return q;
  };
  const auto alone = train(false), grouped = train(true);
  size_t differed = 0;
  for (size_t i = 0; i < alone[0].size(); ++i) {
    SCOPED_TRACE(alone[0][i].name);
    differed += alone[0][i].scale != alone[1][i].scale;
    const float larger_amax_scale = std::min(alone[0][i].scale, alone[1][i].scale);
    EXPECT_EQ(grouped[0][i].scale, larger_amax_scale);
    EXPECT_EQ(grouped[1][i].scale, larger_amax_scale);
    // The reduced history agrees; slot 0 is the amax of the forward after step(), each
    // replica's own until the next step() reduces it.
    const std::vector<float>& h0 = grouped[0][i].amax_history;
    const std::vector<float>& h1 = grouped[1][i].amax_history;
    EXPECT_EQ(std::vector<float>(h0.begin() + 1, h0.end()),
              std::vector<float>(h1.begin() + 1, h1.end()));
  }
  // fc1's and fc2's inputs and both output gradients: the test means something.
  EXPECT_GE(differed, 4u) << "the replicas' data must give different amaxes";
}

// ---- the FP8 all-gather (passes/gather_fp8.h)
// ----------------------------------------------------

// The training graph of `text` as the reference runs it, with gather-fp8 or without.
ir::Sequence lowered(const std::string& text, bool gather_fp8) {
  driver::CompileOptions unfused;
  unfused.disabled_passes = {"eliminate-aliases", "fuse-forward", "fuse-backward"};
  if (!gather_fp8) unfused.disabled_passes.insert("gather-fp8");
  unfused.last_stage = driver::Stage::Passes;
  driver::CompileResult r = driver::compile_ir(compile(text), nullptr, nullptr, unfused);
  EXPECT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  return std::move(r.program.sequences.at(0));
}

// The dtypes every all_gather of `s` moves, in op order.
std::vector<ir::DType> gathered_dtypes(const ir::Sequence& s) {
  std::vector<ir::DType> out;
  for (const ir::Operation& op : s.ops)
    if (op.kind == ir::OpKind::AllGather) out.push_back(s.value(op.operands.at(0)).type.dtype);
  return out;
}

size_t count_ops(const ir::Sequence& s, ir::OpKind kind) {
  return size_t(std::ranges::count_if(s.ops, [&](const ir::Operation& op) {
    return op.kind == kind || std::ranges::any_of(op.parts, [&](const ir::Operation& part) {
             return part.kind == kind;
           });
  }));
}

TEST(ParallelGatherFp8, SequenceParallelGathersCastOnceBeforeTheGather) {
  using ir::DType;
  const ir::Sequence s = lowered(mlp(2, true, "delayed"), true);
  // fc1's input in forward, fc2's output gradient in backward: E4M3 and E5M2 codes on the wire.
  EXPECT_EQ(gathered_dtypes(s), (std::vector<DType>{DType::E4M3, DType::E5M2}));
  EXPECT_EQ(count_ops(s, ir::OpKind::Fp8Transpose), 2u);
  for (const ir::Operation& op : s.ops) {
    if (op.kind != ir::OpKind::AllGather) continue;
    // The cast reads the rank's share and makes only the row-wise copy; the gathered codes keep
    // the cast's quantizer (GEMMs read its scale_inv) and the transpose the column-wise copy.
    const ir::Value& share = s.value(op.operands.at(0));
    ASSERT_GE(share.producer, 0);
    const ir::Operation& cast = s.ops.at(size_t(share.producer));
    EXPECT_EQ(cast.kind, ir::OpKind::CastFp8);
    EXPECT_TRUE(ir::attr_bool(cast.attrs, "rowwise"));
    EXPECT_FALSE(ir::attr_bool(cast.attrs, "columnwise"));
    EXPECT_EQ(share.type.shape.at(0).divisor, 2);
    const ir::Value& gathered = s.value(op.results.at(0));
    EXPECT_EQ(gathered.quantizer, cast.quantizer);
    EXPECT_EQ(s.quantizers.at(size_t(cast.quantizer)).source, cast.operands.at(0));
  }
  // Without the pass the gathers move bf16 and the casts follow them.
  EXPECT_EQ(gathered_dtypes(lowered(mlp(2, true, "delayed"), false)),
            (std::vector<DType>{DType::BF16, DType::BF16}));
  EXPECT_EQ(count_ops(lowered(mlp(2, true, "delayed"), false), ir::OpKind::Fp8Transpose), 0u);
}

TEST(ParallelGatherFp8, LeavesGathersItCannotCastFirst) {
  using ir::DType;
  // bf16: nothing to cast; no sequence parallelism: no gather.
  EXPECT_EQ(gathered_dtypes(lowered(mlp(2, true, "bf16"), true)),
            (std::vector<DType>{DType::BF16, DType::BF16}));
  EXPECT_TRUE(gathered_dtypes(lowered(mlp(2, false, "delayed"), true)).empty());
  // Block scaling: the column-wise 128 x 1 blocks come from high-precision values.
  std::string block = mlp(2, true, "bf16");
  block.replace(0, block.find('\n'), "recipe r = float8_block_scaling()");
  EXPECT_EQ(gathered_dtypes(lowered(block, true)), (std::vector<DType>{DType::BF16, DType::BF16}));
  // A gathered tensor that is also an output (read as bf16) stays bf16, in the reference's
  // graph (make_extra_output reads it) and in the fused one (the alias is eliminated and the
  // gathered value is the output itself).
  const std::string both = std::string(recipe_line("delayed")) + R"(const hidden = 64
sequence s(x: bf16[tokens / tp, hidden]) -> (y: bf16[tokens / tp, hidden], g: bf16[tokens, hidden])
    uses r with parallel(tp = 2, sp = true) {
  all_gather()
  make_extra_output(g)
  linear(hidden, 128, parallel = column)
  linear(128, hidden, parallel = row)
}
)";
  EXPECT_EQ(gathered_dtypes(lowered(both, true)).at(0), DType::BF16);
  driver::CompileOptions fused;
  fused.last_stage = driver::Stage::Passes;
  driver::CompileResult r = driver::compile_ir(compile(both), nullptr, nullptr, fused);
  ASSERT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  EXPECT_EQ(gathered_dtypes(r.program.sequences.at(0)).at(0), DType::BF16);
}

// Casting each rank's share with the scale of the whole tensor makes the very codes the cast of
// the gathered tensor made: outputs, gradients and quantizer state equal bit for bit.
void expect_gather_fp8_changes_nothing(int tp, const std::string& recipe) {
  SCOPED_TRACE(fmt::format("tp = {}, {}", tp, recipe));
  const Data d = make_data(compile(mlp(1, false, recipe)));
  std::vector<cpu::ReferenceExecutor<float>> with_executors, without_executors;
  const std::vector<Run> with =
      run_sharded(lowered(mlp(tp, true, recipe), true), d, tp, true, with_executors);
  const std::vector<Run> without =
      run_sharded(lowered(mlp(tp, true, recipe), false), d, tp, true, without_executors);
  for (size_t r = 0; r < with.size(); ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    EXPECT_EQ(with[r].y, without[r].y);
    EXPECT_EQ(with[r].dx, without[r].dx);
    EXPECT_EQ(with[r].y2, without[r].y2);
    EXPECT_EQ(with[r].grads, without[r].grads);
    const auto q = with_executors[r].quantizers(), q_without = without_executors[r].quantizers();
    ASSERT_EQ(q.size(), q_without.size());
    for (size_t i = 0; i < q.size(); ++i) {
      SCOPED_TRACE(q[i].name);
      EXPECT_EQ(q[i].scale, q_without[i].scale);
      // Slot 0 holds the amax of the step in progress (the forward after step()): each rank's
      // part's until the next step() reduces it, so the max over the ranks must agree.
      ASSERT_FALSE(q[i].amax_history.empty());
      EXPECT_EQ(std::vector<float>(q[i].amax_history.begin() + 1, q[i].amax_history.end()),
                std::vector<float>(q_without[i].amax_history.begin() + 1,
                                   q_without[i].amax_history.end()));
      auto slot0 = [&](const std::vector<cpu::ReferenceExecutor<float>>& ranks) {
        float m = 0.0f;
        for (const auto& e : ranks) m = std::max(m, e.quantizers()[i].amax_history[0]);
        return m;
      };
      EXPECT_EQ(slot0(with_executors), slot0(without_executors));
    }
  }
}

TEST(ParallelGatherFp8, CastBeforeTheGatherEqualsCastAfterItBitForBit) {
  expect_gather_fp8_changes_nothing(2, "delayed");
  expect_gather_fp8_changes_nothing(4, "delayed");
  expect_gather_fp8_changes_nothing(2, "current");
}

TEST(ParallelReference, CollectivesAreExactAndOrdered) {
  cpu::SimulatedGroup group(3);
  std::vector<std::vector<double>> sums(3), maxes(3), gathered(3);
  std::vector<std::thread> threads;
  threads.reserve(3);
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      cpu::Collectives& c = group.rank(r);
      sums[size_t(r)] = {double(r), 1.0};
      c.all_reduce(sums[size_t(r)], cpu::ReduceKind::Sum);
      maxes[size_t(r)] = {double(-r), double(r)};
      c.all_reduce(maxes[size_t(r)], cpu::ReduceKind::Max);
      const std::vector<double> mine{double(r * 10), double(r * 10 + 1)};
      gathered[size_t(r)] = c.all_gather(mine);
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(sums[size_t(r)], (std::vector<double>{3.0, 3.0}));
    EXPECT_EQ(maxes[size_t(r)], (std::vector<double>{0.0, 2.0}));
    EXPECT_EQ(gathered[size_t(r)], (std::vector<double>{0, 1, 10, 11, 20, 21}));
  }
}

TEST(ParallelReference, MisuseIsReportedBeforeRunning) {
  const ir::Program split = compile(mlp(2, true, "bf16"));
  // No group, or a group of another size.
  EXPECT_THROW(cpu::ReferenceExecutor<float>(split.sequences.at(0), {{"tokens", kTokens}}),
               cpu::ReferenceError);
  cpu::SimulatedGroup three(3);
  cpu::ReferenceOptions o;
  o.group = &three.rank(0);
  try {
    cpu::ReferenceExecutor<float> e(split.sequences.at(0), {{"tokens", kTokens}}, o);
    FAIL() << "a group of 3 ran a tp = 2 sequence";
  } catch (const cpu::ReferenceError& e) {
    EXPECT_TRUE(test::contains(e.what(), "tp = 2 ranks")) << e.what();
  }
  // A token count that does not split.
  cpu::SimulatedGroup two(2);
  o.group = &two.rank(0);
  try {
    cpu::ReferenceExecutor<float> e(split.sequences.at(0), {{"tokens", 33}}, o);
    FAIL() << "33 tokens split over 2 ranks";
  } catch (const cpu::ReferenceError& e) {
    EXPECT_TRUE(test::contains(e.what(), "bound to 33, which does not divide into 2")) << e.what();
  }
}

}  // namespace
}  // namespace opfuse
