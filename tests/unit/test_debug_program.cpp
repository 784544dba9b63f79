// A debug config given to the embedding API, the parts that need no GPU: the iteration loop
// (compiler/debug_config/debug_run.h) that the CPU run driver and opfuse::Session share, a
// Program compiled with a config (located errors, warnings, the plain plan unchanged), and the
// plan variants it compiles on demand (runtime/api/debug_program.h) through NVRTC.
#include <gtest/gtest.h>

#include <set>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "api/debug_program.h"
#include "debug_config/debug_run.h"
#include "debug_config/npy.h"
#include "debug_routing_fixture.h"
#include "opfuse/program.h"
#include "test_support.h"

namespace opfuse {
namespace {

const std::string kMlp = R"(recipe fp8 = delayed_scaling()
sequence mlp(x: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {
  layernorm(64)
  linear(64, 256) as fc1
  swiglu()
  linear(128, 64) as fc2
}
)";

const std::string kEveryOther = R"(stats:
  layers: {layer_types: [fc1]}
  transformer_engine:
    LogTensorStats: {tensors: [activation, gradient], stats: [max], freq: 2, start_step: 4}
)";

TEST(DebugRun, RecordsAreTakenFromTheRunThatWroteThem) {
  EXPECT_TRUE(debug::written_by("activation", debug::RunPhase::Forward));
  EXPECT_TRUE(debug::written_by("weight", debug::RunPhase::Forward));
  EXPECT_TRUE(debug::written_by("output", debug::RunPhase::Forward));
  EXPECT_FALSE(debug::written_by("gradient", debug::RunPhase::Forward));
  EXPECT_TRUE(debug::written_by("gradient", debug::RunPhase::Backward));
  EXPECT_TRUE(debug::written_by("wgrad", debug::RunPhase::Backward));
  EXPECT_FALSE(debug::written_by("activation", debug::RunPhase::Backward));
  EXPECT_TRUE(debug::written_by("dgrad", debug::RunPhase::Both));
}

// The routing is asked at the first iteration and again only where its answers said they may
// change; each iteration's records, from the runs that wrote them, are logged at end_step() to
// the callback with that iteration.
TEST(DebugRun, AsksTheRoutingOnlyWhenItMayChangeAndLogsEachIteration) {
  const auto r = test::routed(kEveryOther, {"fc1", "fc2"}, true);
  std::vector<debug::StatRecord> seen;
  debug::DebugRunSetup setup;
  setup.bindings = r->bindings;
  setup.start_iteration = 3;
  setup.on_stat = [&seen](const debug::StatRecord& s) { seen.push_back(s); };
  debug::DebugRun run(setup);
  std::vector<uint64_t> generations;
  std::vector<bool> active;
  // Slot order is not run order: the gradient's record comes first and is logged first.
  const std::vector<plan::StatSlot> slots = {{"fc1", "gradient", 0, 1},
                                             {"fc1", "activation", 0, 1}};
  for (int i = 0; i < 5; ++i) {  // iterations 3..7
    const debug::Routing& routing = run.routing();
    EXPECT_EQ(routing.iteration, 3 + i);
    generations.push_back(run.generation());
    active.push_back(!routing.variant_key().empty());
    if (active.back()) {
      // A forward whose gradient record is stale (-100), then a backward whose activation
      // record is: each run gives only the records it wrote.
      debug::TensorMoments forward, backward, stale;
      forward.count = backward.count = stale.count = 1;
      forward.max = forward.min = 10.0 + i;
      backward.max = backward.min = 20.0 + i;
      stale.max = stale.min = -100;
      const std::vector<debug::TensorMoments> after_forward = {stale, forward};
      const std::vector<debug::TensorMoments> after_backward = {backward, stale};
      run.add_run(slots, after_forward, debug::RunPhase::Forward);
      run.add_run(slots, after_backward, debug::RunPhase::Backward);
    }
    run.end_step();
  }
  EXPECT_EQ(run.iteration(), 8);
  EXPECT_EQ(active, (std::vector<bool>{false, true, false, true, false}));
  // Asked at 3 (off until 4), 4 (on until 5), 5, 6, 7: every iteration changes here.
  EXPECT_EQ(generations, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], (debug::StatRecord{"fc1", "gradient", "", "max", 4, 21.0}));
  EXPECT_EQ(seen[1], (debug::StatRecord{"fc1", "activation", "", "max", 4, 11.0}));
  EXPECT_EQ(seen[2], (debug::StatRecord{"fc1", "gradient", "", "max", 6, 23.0}));
  EXPECT_EQ(seen[3], (debug::StatRecord{"fc1", "activation", "", "max", 6, 13.0}));
}

// The GPU session's split of end_step(): iterations closed first (the next one's routing asked
// before the records land), their records added late and written later, in order, log exactly
// what end_step() with the records in time logs.
TEST(DebugRun, ClosedIterationsWrittenLateLogWhatEndStepLogs) {
  const auto r = test::routed(kEveryOther, {"fc1", "fc2"}, true);
  const std::vector<plan::StatSlot> slots = {{"fc1", "gradient", 0, 1},
                                             {"fc1", "activation", 0, 1}};
  const auto records = [](int i) {
    debug::TensorMoments a, g;
    a.count = g.count = 1;
    a.max = a.min = 10.0 + i;
    g.max = g.min = 20.0 + i;
    return std::vector<debug::TensorMoments>{g, a};
  };
  std::vector<debug::StatRecord> in_time, late;
  for (const bool split : {false, true}) {
    std::vector<debug::StatRecord>& seen = split ? late : in_time;
    debug::DebugRunSetup setup;
    setup.bindings = r->bindings;
    setup.start_iteration = 3;
    setup.on_stat = [&seen](const debug::StatRecord& s) { seen.push_back(s); };
    debug::DebugRun run(setup);
    std::vector<debug::IterationRecords> ended;
    for (int i = 0; i < 5; ++i) {  // iterations 3..7: 4 and 6 log
      const bool active = !run.routing().variant_key().empty();
      if (!split) {
        if (active) run.add_run(slots, records(i), debug::RunPhase::Both);
        run.end_step();
        continue;
      }
      ended.push_back(run.close_iteration());
      EXPECT_EQ(ended.back().iteration(), 3 + i);
      (void)run.routing();  // the next iteration starts before this one's records land
      if (active) ended.back().add_run(slots, records(i), debug::RunPhase::Both);
      if (i % 2 == 1) {  // written two at a time
        for (debug::IterationRecords& closed : ended) run.write(closed);
        ended.clear();
      }
    }
    for (debug::IterationRecords& closed : ended) run.write(closed);
    EXPECT_EQ(run.iteration(), 8);
  }
  ASSERT_EQ(in_time.size(), 4u);
  EXPECT_EQ(late, in_time);
}

TEST(DebugRun, AnAlwaysOnConfigIsRoutedOnce) {
  const auto r = test::routed(
      "s:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    DisableFP8GEMM: {gemms: [wgrad]}\n",
      {"fc1", "fc2"}, true);
  debug::DebugRunSetup setup;
  setup.bindings = r->bindings;
  debug::DebugRun run(setup);
  for (int i = 0; i < 10; ++i) {
    (void)run.routing();
    run.end_step();
  }
  EXPECT_EQ(run.generation(), 1u);
}

// A micro-batch's forward and backward captures are one run: one dump per tensor, no _mb suffix;
// a second forward starts a second micro-batch.
TEST(DebugRun, ForwardAndBackwardCapturesAreOneMicroBatch) {
  const auto r = test::routed(
      "d:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation, gradient]}\n",
      {"fc1"}, false);
  const std::string dir = test::make_temp_dir("debug_run_captures");
  debug::DebugRunSetup setup;
  setup.bindings = r->bindings;
  setup.log_dir = dir;
  debug::DebugRun run(setup);
  (void)run.routing();
  const std::vector<plan::CaptureSlot> slots = {{"fc1", "activation", {}}, {"fc1", "gradient", {}}};
  const debug::CapturedTensor a{{1, 2}, {1, 2}, {}}, g{{1, 2}, {5, 6}, {}},
      stale{{1, 2}, {0, 0}, {}};
  run.add_captures(slots, std::vector<debug::CapturedTensor>{a, stale}, debug::RunPhase::Forward);
  run.add_captures(slots, std::vector<debug::CapturedTensor>{stale, g}, debug::RunPhase::Backward);
  run.end_step();
  const std::filesystem::path it0 = debug::dump_dir(dir, 0, 0);
  EXPECT_EQ(debug::read_npy((it0 / "fc1_activation.npy").string()).f32, a.values);
  EXPECT_EQ(debug::read_npy((it0 / "fc1_gradient.npy").string()).f32, g.values);
  (void)run.routing();
  run.add_captures(slots, std::vector<debug::CapturedTensor>{a, stale}, debug::RunPhase::Forward);
  run.add_captures(slots, std::vector<debug::CapturedTensor>{stale, g}, debug::RunPhase::Backward);
  run.add_captures(slots, std::vector<debug::CapturedTensor>{g, stale}, debug::RunPhase::Forward);
  run.add_captures(slots, std::vector<debug::CapturedTensor>{stale, a}, debug::RunPhase::Backward);
  run.end_step();
  const std::filesystem::path it1 = debug::dump_dir(dir, 0, 1);
  EXPECT_EQ(debug::read_npy((it1 / "fc1_activation_mb1.npy").string()).f32, g.values);
  EXPECT_EQ(debug::read_npy((it1 / "fc1_gradient_mb1.npy").string()).f32, a.values);
  EXPECT_FALSE(std::filesystem::exists(it1 / "fc1_activation.npy"));
}

TEST(DebugRun, DumpTensorsWithoutAWritableDirectoryIsRefusedFirst) {
  const auto r = test::routed(
      "d:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    DumpTensors: {tensors: [activation]}\n",
      {"fc1"}, false);
  debug::DebugRunSetup setup;
  setup.bindings = r->bindings;
  EXPECT_THROW(debug::DebugRun{setup}, debug::DebugLogError);
  setup.log_dir = "/proc/opfuse_no_dumps_here";
  EXPECT_THROW(debug::DebugRun{setup}, debug::DebugLogError);
}

CompileOptions with_config(const std::string& text) {
  CompileOptions options;
  options.debug_config = DebugConfigSource{"", text, "debug.yaml"};
  options.cache_dir = test::make_temp_dir("debug_program_cache");
  return options;
}

TEST(DebugProgram, ConfigErrorsAreCompileErrorsLocatedInTheConfig) {
  try {
    (void)Program::compile(
        kMlp, "mlp.fuse",
        with_config("s:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
                    "    LogTensorStats: {tensors: [activaton], stats: [max]}\n"));
    ADD_FAILURE() << "a misspelled tensor was accepted";
  } catch (const CompileError& e) {
    EXPECT_TRUE(test::contains(e.what(), "debug.yaml:4:")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "activaton")) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "^")) << e.what();
  }
  CompileOptions neither;
  neither.debug_config = DebugConfigSource{};
  EXPECT_THROW((void)Program::compile(kMlp, "mlp.fuse", neither), UsageError);
}

// The plain plan of a program with a config is the program's plan without one; a section that
// matches no layer is a warning the program keeps.
TEST(DebugProgram, PlainPlanUnchangedAndWarningsKept) {
  CompileOptions plain_options;
  plain_options.cache_dir = test::make_temp_dir("debug_program_cache_plain");
  const Program plain = Program::compile(kMlp, "mlp.fuse", plain_options);
  const Program configured = Program::compile(
      kMlp, "mlp.fuse",
      with_config(kEveryOther + "other:\n  layers: {exact_layer_names: [fc3]}\n"
                                "  transformer_engine:\n    DisableFP8Layer: {}\n"));
  EXPECT_FALSE(plain.has_debug_config());
  EXPECT_TRUE(configured.has_debug_config());
  EXPECT_EQ(plain.plan_json(), configured.plan_json());
  EXPECT_TRUE(plain.warnings().empty()) << plain.warnings();
  EXPECT_TRUE(test::contains(configured.warnings(), "debug.yaml:6:3: warning"))
      << configured.warnings();
  EXPECT_TRUE(test::contains(configured.warnings(), "matches no layer")) << configured.warnings();
}

// Variants compile on first use (passes, plan, NVRTC) and are shared by key after.
// The MLP's plan variants under `config` (text), compiled for sm_90a through NVRTC on demand;
// null (after a test failure naming the diagnostics) when the front end or the config fails.
std::shared_ptr<api::DebugProgram> debug_program(const std::string& config) {
  auto sources = std::make_shared<SourceManager>();
  DiagnosticEngine diags(*sources);
  driver::CompileOptions front_end;
  front_end.last_stage = driver::Stage::FrontEnd;
  driver::CompileResult ir = driver::compile_source("mlp.fuse", kMlp, *sources, diags, front_end);
  EXPECT_TRUE(ir.ok()) << diags.format_all();
  if (!ir.ok()) return nullptr;
  driver::CompileOptions compile;
  compile.arch = "sm_90a";
  auto program = api::DebugProgram::create(DebugConfigSource{"", config, "debug.yaml"}, ir.program,
                                           sources, diags, compile, with_config(config));
  EXPECT_TRUE(program) << diags.format_all();
  return program;
}

TEST(DebugProgram, VariantsCompileOnceByKey) {
  const std::shared_ptr<api::DebugProgram> program = debug_program(kEveryOther);
  ASSERT_TRUE(program);
  const debug::Routing at4 = debug::route(program->bindings(), 4);
  const debug::Routing at6 = debug::route(program->bindings(), 6);
  const auto a = program->variant(at4);
  const auto b = program->variant(at6);
  EXPECT_EQ(a.get(), b.get());
  ASSERT_EQ(a->plan.sequences.size(), 1u);
  const plan::SequencePlan& plan = a->plan.sequences[0];
  ASSERT_EQ(plan.stat_slots.size(), 2u);
  EXPECT_EQ(plan.stat_slots[0].layer, "fc1");
  EXPECT_EQ(a->kernels.size(), a->plan.kernels.size());
  for (const auto& k : a->kernels) EXPECT_FALSE(k.binary.empty()) << k.kernel_name;
}

// Statistics fused into kernels (docs/debugging.md): the tiled kernels built with kStats compile
// through NVRTC (no GPU needed) for every shape the fusion passes make of the MLP: SwiGLU forward
// and backward with statistics of their input and output, casts with statistics of their input.
TEST(DebugProgram, KernelsWithStatisticsCompileThroughNvrtc) {
  const std::string every =
      "all:\n  layers: {layer_name_regex_pattern: .*}\n"
      "  transformer_engine:\n    LogTensorStats:\n"
      "      tensors: [activation, weight, output, gradient, dgrad, wgrad]\n"
      "      stats: [min, max, std]\n";
  const std::shared_ptr<api::DebugProgram> program = debug_program(every);
  ASSERT_TRUE(program);
  const auto v = program->variant(debug::route(program->bindings(), 0));
  ASSERT_EQ(v->kernels.size(), v->plan.kernels.size());
  std::set<std::string> with_stats;
  for (const plan::Kernel& k : v->plan.kernels) {
    // kStats is the template argument after the flags: ", 1>" (input), ", 3, __nv_bfloat16>".
    if (k.name_expression.find(", 1>") != std::string::npos ||
        k.name_expression.find(", 2, ") != std::string::npos ||
        k.name_expression.find(", 3, ") != std::string::npos)
      with_stats.insert(k.template_name);
  }
  EXPECT_EQ(with_stats, (std::set<std::string>{"cast_transpose", "gated_activation_fwd",
                                               "gated_activation_bwd"}));
  for (const auto& k : v->kernels) EXPECT_FALSE(k.binary.empty()) << k.kernel_name;
}

// An application feature through the embedding API (opfuse/debug_feature.h): clip the operands
// its config selects to [-c, c].
class PublicClip final : public DebugFeature {
 public:
  std::string name() const override { return "PublicClip"; }
  bool selects_gemms() const override { return true; }
  bool selects_tensors() const override { return true; }
  bool modifies() const override { return true; }
  std::vector<DebugKey> keys() const override {
    return {{"c", DebugKey::Type::Number, {}, "the bound", true}};
  }
  DebugRoute modify_tensor_enabled(std::string_view, const DebugSettings&, DebugGemm, DebugTensor,
                                   std::int64_t) const override {
    return {true, kDebugNever};
  }
  std::optional<DebugModification> modify_tensor(std::string_view, const DebugSettings& s,
                                                 DebugGemm, DebugTensor,
                                                 std::int64_t) const override {
    const double c = s.get_number("c", 1.0);
    DebugModification m;
    m.expr = min(max(DebugExpr::x(), DebugExpr(-c)), DebugExpr(c));
    m.description = "clip";
    return m;
  }
};

const std::string kClipConfig = R"(clip:
  layers: {exact_layer_names: [fc2]}
  transformer_engine:
    PublicClip:
      gemms_struct:
        - gemm: fprop
          tensors: [activation]
          c: 0.25
)";

TEST(DebugProgram, ApplicationFeaturesAreUsableByNameAndChecked) {
  CompileOptions options = with_config(kClipConfig);
  options.debug_features.push_back(std::make_shared<PublicClip>());
  const Program program = Program::compile(kMlp, "mlp.fuse", options);
  EXPECT_TRUE(program.has_debug_config());
  // Its key is checked like a built-in's: a string where a number belongs.
  CompileOptions bad = with_config(
      "clip:\n  layers: {exact_layer_names: [fc2]}\n  transformer_engine:\n"
      "    PublicClip: {gemms: [fprop], tensors: [activation], c: wide}\n");
  bad.debug_features.push_back(std::make_shared<PublicClip>());
  try {
    (void)Program::compile(kMlp, "mlp.fuse", bad);
    ADD_FAILURE() << "c: wide was accepted";
  } catch (const CompileError& e) {
    EXPECT_TRUE(test::contains(e.what(), "debug.yaml:4:")) << e.what();
  }
  // Without the feature registered the name is unknown.
  EXPECT_THROW((void)Program::compile(kMlp, "mlp.fuse", with_config(kClipConfig)), CompileError);
  // A second feature of the same name, and features without a config, are misuse.
  CompileOptions twice = with_config(kClipConfig);
  twice.debug_features = {std::make_shared<PublicClip>(), std::make_shared<PublicClip>()};
  EXPECT_THROW((void)Program::compile(kMlp, "mlp.fuse", twice), UsageError);
  CompileOptions no_config;
  no_config.debug_features.push_back(std::make_shared<PublicClip>());
  EXPECT_THROW((void)Program::compile(kMlp, "mlp.fuse", no_config), UsageError);
}

// The feature's modification compiles into the variant: a modify_tensor op in front of fc2's
// fprop computing min(max(x, -0.25), 0.25).
TEST(DebugProgram, ApplicationModificationCompilesIntoTheVariant) {
  auto sources = std::make_shared<SourceManager>();
  DiagnosticEngine diags(*sources);
  driver::CompileOptions front_end;
  front_end.last_stage = driver::Stage::FrontEnd;
  driver::CompileResult ir = driver::compile_source("mlp.fuse", kMlp, *sources, diags, front_end);
  ASSERT_TRUE(ir.ok()) << diags.format_all();
  CompileOptions options = with_config(kClipConfig);
  options.debug_features.push_back(std::make_shared<PublicClip>());
  driver::CompileOptions compile;
  compile.arch = "sm_90a";
  const std::shared_ptr<api::DebugProgram> program = api::DebugProgram::create(
      *options.debug_config, ir.program, sources, diags, compile, options);
  ASSERT_TRUE(program) << diags.format_all();
  const debug::Routing at0 = debug::route(program->bindings(), 0);
  ASSERT_FALSE(at0.variant_key().empty());
  const auto variant = program->variant(at0);
  const std::string json = plan::plan_json_text(variant->plan);
  EXPECT_TRUE(test::contains(json, "PublicClip")) << json.substr(0, 2000);
  bool modifies = false;
  for (const auto& k : variant->plan.kernels)
    modifies |= test::contains(k.name_expression, "pointwise_expr");
  EXPECT_TRUE(modifies);
}

}  // namespace
}  // namespace opfuse
