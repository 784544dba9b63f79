// Precision-debug configs (compiler/debug_config/): the cadence rules, reading TE's config.yaml
// schema into features and scopes, binding sections to a program's layers, the routing answers per
// iteration, C++ features registered by name, `fusec debug-plan`, and the must-fail configs of
// tests/errors/debug_config (each fails with its `# expect:` error, located, with line and caret).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "debug_config/routing.h"
#include "debug_config/stat_request.h"
#include "driver/compile.h"
#include "test_support.h"

namespace opfuse::debug {
namespace {

using test::shell_quoted;

namespace fs = std::filesystem;

// ---- cadence ---------------------------------------------------------------------------------

TEST(Cadence, FreqStartEnd) {
  Cadence c;
  c.freq = 3;
  c.start_step = 4;
  c.end_step = 13;
  std::vector<int64_t> runs;
  for (int64_t i = 0; i < 20; ++i)
    if (c.runs_at(i)) runs.push_back(i);
  EXPECT_EQ(runs, (std::vector<int64_t>{6, 9, 12}));
  EXPECT_EQ(c.next_after(0), 6);
  EXPECT_EQ(c.next_after(6), 9);
  EXPECT_EQ(c.next_after(12), kNever);
  EXPECT_EQ(c.route(5), (Route{false, 6}));
  EXPECT_EQ(c.route(6), (Route{true, 7}));  // enabled holds for one iteration when freq > 1
  EXPECT_EQ(c.route(13), (Route{false, kNever}));
}

TEST(Cadence, IntervalListReplacesStartEnd) {
  Cadence c;
  c.start_step = 100;  // ignored: the list is given
  c.start_end_list = {{0, 2}, {3, 4}, {10, 12}};
  EXPECT_TRUE(c.runs_at(0));
  EXPECT_TRUE(c.runs_at(4));
  EXPECT_FALSE(c.runs_at(5));
  EXPECT_FALSE(c.runs_at(100));
  // freq 1: [0, 2] and [3, 4] touch, so an answer at 1 holds through 4.
  EXPECT_EQ(c.route(1), (Route{true, 5}));
  EXPECT_EQ(c.route(5), (Route{false, 10}));
  EXPECT_EQ(c.route(12), (Route{true, 13}));
  EXPECT_EQ(c.route(13), (Route{false, kNever}));
}

TEST(Cadence, OpenEndedRunsForever) {
  Cadence c;  // freq 1 from 0, no end
  EXPECT_EQ(c.route(0), (Route{true, kNever}));
  c.freq = 2;
  EXPECT_EQ(c.route(1), (Route{false, 2}));
  EXPECT_EQ(c.route(2), (Route{true, 3}));
}

// ---- reading ---------------------------------------------------------------------------------

struct Loaded {
  SourceManager sources;
  std::unique_ptr<DiagnosticEngine> diags;
  std::optional<DebugConfig> config;
  std::string messages() const { return diags->format_all(); }
};

std::unique_ptr<Loaded> read(const std::string& text,
                             std::shared_ptr<const FeatureRegistry> registry = nullptr) {
  auto l = std::make_unique<Loaded>();
  l->diags = std::make_unique<DiagnosticEngine>(l->sources);
  if (!registry)
    registry = std::make_shared<const FeatureRegistry>(FeatureRegistry::with_builtins());
  const FileId f = l->sources.add_buffer("debug.yaml", text);
  l->config = read_debug_config(l->sources, f, registry, *l->diags);
  return l;
}

const FeatureConfig& feature(const DebugConfig& c, std::string_view section,
                             std::string_view name) {
  for (const ConfigSection& s : c.sections) {
    if (s.name != section) continue;
    for (const FeatureConfig& f : s.features)
      if (f.name == name) return f;
  }
  throw std::runtime_error("no such feature");
}

// TE's documented example shape: flat keys, gemms_struct with its own tensors and keys.
constexpr const char* kTeStyle = R"(
fc_stats:
  enabled: True
  layers:
    layer_name_regex_pattern: .*(fc1|fc2)
  transformer_engine:
    LogTensorStats:
      enabled: True
      stats: [max, min, mean, std, l1_norm]
      tensors_struct:
        - tensor: activation
          freq: 2
        - tensor: gradient
      freq: 5
      start_step: 0
      end_step: 80
    FakeQuant:
      enabled: True
      quant_format: FP8E4M3
      gemms_struct:
        - gemm: dgrad
          tensors: [weight, gradient]
          quant_format: FP8E5M2
        - gemm: fprop
          tensors: [activation]
other:
  enabled: False
  layers:
    exact_layer_names: [fc1]
  transformer_engine:
    DisableFP8Layer:
)";

TEST(DebugConfigRead, TeStyleConfigWithStructOverrides) {
  const auto l = read(kTeStyle);
  ASSERT_TRUE(l->config) << l->messages();
  ASSERT_EQ(l->config->sections.size(), 2u);
  const ConfigSection& s = l->config->sections[0];
  EXPECT_TRUE(s.enabled);
  EXPECT_FALSE(l->config->sections[1].enabled);
  EXPECT_TRUE(s.layers.matches("fc1"));
  EXPECT_TRUE(s.layers.matches("block3.fc2"));  // searched anywhere, as TE's re.search
  EXPECT_FALSE(s.layers.matches("proj"));

  const FeatureConfig& stats = feature(*l->config, "fc_stats", "LogTensorStats");
  ASSERT_EQ(stats.scopes.size(), 2u);
  const Settings* act = stats.find(std::nullopt, TensorKind::Activation);
  const Settings* grad = stats.find(std::nullopt, TensorKind::Gradient);
  ASSERT_TRUE(act && grad);
  EXPECT_EQ(act->cadence().freq, 2);  // the struct entry overrides the flat key
  EXPECT_EQ(grad->cadence().freq, 5);
  EXPECT_EQ(grad->cadence().end_step, 80);
  EXPECT_EQ(act->stats().size(), 5u);
  EXPECT_EQ(stats.find(std::nullopt, TensorKind::Weight), nullptr);

  const FeatureConfig& fq = feature(*l->config, "fc_stats", "FakeQuant");
  EXPECT_EQ(fq.find(GemmRole::Dgrad, TensorKind::Weight)->get_string("quant_format", ""),
            "FP8E5M2");
  EXPECT_EQ(fq.find(GemmRole::Fprop, TensorKind::Activation)->get_string("quant_format", ""),
            "FP8E4M3");
  EXPECT_EQ(fq.find(GemmRole::Fprop, TensorKind::Weight), nullptr);
  EXPECT_EQ(fq.find(GemmRole::Wgrad, TensorKind::Gradient), nullptr);
}

TEST(DebugConfigRead, Yaml11BooleansAsTeReadsThem) {
  const auto l = read(
      "s:\n  enabled: yes\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    DisableFP8Layer: {enabled: Off}\n");
  ASSERT_TRUE(l->config) << l->messages();
  EXPECT_TRUE(l->config->sections[0].enabled);
  EXPECT_FALSE(l->config->sections[0].features[0].enabled);
}

TEST(DebugConfigRead, EmptyFileHasNoSections) {
  const auto l = read("");
  ASSERT_TRUE(l->config) << l->messages();
  EXPECT_TRUE(l->config->sections.empty());
}

TEST(DebugConfigRead, SeveralMistakesReportedInOneRun) {
  const auto l = read(
      "s:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogTensorStats: {tensors: [activation], stats: [maxx], freq: -1}\n"
      "    DisableFP8GEMMs: {gemms: [fprop]}\n");
  EXPECT_FALSE(l->config);
  EXPECT_EQ(l->diags->error_count(), 3u) << l->messages();
  const std::string m = l->messages();
  EXPECT_NE(m.find("debug.yaml:4:53: error: unknown statistic 'maxx'"), std::string::npos) << m;
  EXPECT_NE(m.find("debug.yaml:4:66: error: 'freq' must be at least 1, not -1"), std::string::npos)
      << m;
  EXPECT_NE(m.find("hint: did you mean 'DisableFP8GEMM'?"), std::string::npos) << m;
}

TEST(DebugConfigRead, Fp8StatPrefixesAcceptedExactlyWhereTheyExecute) {
  std::string error, hint;
  ConfigNode n;
  n.kind = ConfigNode::Kind::Scalar;
  const std::pair<const char*, std::optional<plan::ScalingKind>> accepted[] = {
      {"mxfp8_underflow_blocks%_columnwise", plan::ScalingKind::MicroScaled},
      {"fp8_block_scaling_scale_inv_log2_std", plan::ScalingKind::Block1D},
      {"fp8_delayed_scaling_overflows%", plan::ScalingKind::Delayed},
      {"scale_inv_max_columnwise", std::nullopt}};
  for (const auto& entry : accepted) {
    n.scalar = entry.first;
    const auto r = parse_stat_request(n, StatFamily::Quantized, error, hint);
    ASSERT_TRUE(r) << entry.first << ": " << error;
    EXPECT_EQ(r->recipe, entry.second) << entry.first;
  }
  const std::pair<const char*, const char*> refused[] = {
      {"nvfp4_mse", "'nvfp4_mse' asks about the nvfp4 recipe, which opfuse cannot quantize with"},
      {"fp8_block_scaling_overflows%", "'fp8_block_scaling_overflows%' is always 0"},
      {"underflow_blocks%", "'underflow_blocks%' is a per-block statistic"},
      {"fp8_current_scaling_scale_inv_log2_min",
       "'fp8_current_scaling_scale_inv_log2_min' is a per-block statistic"}};
  for (const auto& entry : refused) {
    n.scalar = entry.first;
    error.clear();
    EXPECT_FALSE(parse_stat_request(n, StatFamily::Quantized, error, hint)) << entry.first;
    EXPECT_NE(error.find(entry.second), std::string::npos) << error;
  }
}

TEST(DebugConfigRead, StatRequestsParsed) {
  std::string error, hint;
  ConfigNode n;
  n.kind = ConfigNode::Kind::Scalar;
  n.scalar = "fp8_current_scaling_underflows%_columnwise";
  const auto r = parse_stat_request(n, StatFamily::Quantized, error, hint);
  ASSERT_TRUE(r) << error;
  EXPECT_EQ(r->kind, StatKind::Underflows);
  EXPECT_EQ(r->recipe, plan::ScalingKind::Current);
  EXPECT_TRUE(r->columnwise);
  EXPECT_EQ(r->name, n.scalar);

  n.scalar = "fp8_current_scaling_overflows%";
  EXPECT_FALSE(parse_stat_request(n, StatFamily::Quantized, error, hint));
  EXPECT_EQ(error, "'fp8_current_scaling_overflows%' is always 0");

  const auto l = read(
      "s:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    LogTensorStats:\n      tensors: [activation]\n      stats:\n"
      "        - max_blockwise_dynamic_range: {block_size: 32, dims: 2}\n");
  ASSERT_TRUE(l->config) << l->messages();
  const auto entries = l->config->sections[0].features[0].scopes[0].settings.stats();
  ASSERT_EQ(entries.size(), 1u);
  const auto b = parse_stat_request(*entries[0], StatFamily::Tensor, error, hint);
  ASSERT_TRUE(b) << error;
  EXPECT_EQ(b->block_size, 32);
  EXPECT_EQ(b->dims, 2);
  EXPECT_EQ(b->name, "max_blockwise_dynamic_range_block_size_32_dims_2");
}

// ---- binding and routing -----------------------------------------------------------------------

std::vector<LayerInfo> layers(std::initializer_list<const char*> names, bool quantized = true) {
  std::vector<LayerInfo> out;
  for (const char* n : names) out.push_back({n, {}, quantized});
  return out;
}

TEST(DebugRouting, SectionsBindToLayers) {
  const auto l = read(kTeStyle);
  ASSERT_TRUE(l->config);
  const auto b = bind_layers(*l->config, layers({"fc1", "fc2", "proj"}), *l->diags);
  EXPECT_EQ(l->diags->error_count() + l->diags->warning_count(), 0u) << l->messages();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].section, &l->config->sections[0]);
  EXPECT_EQ(b[1].section, &l->config->sections[0]);
  EXPECT_EQ(b[2].section, nullptr);  // exact names elsewhere never reject other layers (TE does)
}

TEST(DebugRouting, PatternMatchingNoLayerWarnsWithNames) {
  const auto l = read(
      "s:\n  layers: {exact_layer_names: [fc_1]}\n  transformer_engine:\n"
      "    DisableFP8Layer: {}\n");
  ASSERT_TRUE(l->config);
  bind_layers(*l->config, layers({"fc1", "fc2"}), *l->diags);
  EXPECT_EQ(l->diags->warning_count(), 1u);
  const std::string m = l->messages();
  EXPECT_NE(m.find("debug.yaml:2:3: warning: section 's' matches no layer of the program"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("did you mean 'fc1' for 'fc_1'?"), std::string::npos) << m;
}

TEST(DebugRouting, RoutingPerIteration) {
  const auto l = read(kTeStyle);
  ASSERT_TRUE(l->config);
  const auto b = bind_layers(*l->config, layers({"fc1", "proj"}), *l->diags);
  const Routing r0 = route(b, 0);
  ASSERT_EQ(r0.layers.size(), 2u);
  const LayerRouting& fc1 = r0.layers[0];
  EXPECT_TRUE(fc1.active());
  EXPECT_FALSE(r0.layers[1].active());
  // FakeQuant: dgrad's operands modified and the GEMM out of quantization; fprop's activation too.
  const GemmRouting& dgrad = fc1.gemms[size_t(GemmRole::Dgrad)];
  EXPECT_FALSE(dgrad.quantized);
  EXPECT_EQ(dgrad.operands[0], OperandAction::Modify);  // gradient
  EXPECT_EQ(dgrad.operands[1], OperandAction::Modify);  // weight
  const GemmRouting& fprop = fc1.gemms[size_t(GemmRole::Fprop)];
  EXPECT_FALSE(fprop.quantized);
  EXPECT_EQ(fprop.operands[0], OperandAction::Modify);         // activation
  EXPECT_EQ(fprop.operands[1], OperandAction::HighPrecision);  // weight: its GEMM left FP8
  const GemmRouting& wgrad = fc1.gemms[size_t(GemmRole::Wgrad)];
  EXPECT_TRUE(wgrad.quantized);
  EXPECT_EQ(wgrad.operands[0], OperandAction::Quantize);
  // Iteration 0: activation (freq 2) and gradient (freq 5) inspected.
  EXPECT_EQ(fc1.inspectors[size_t(TensorKind::Activation)].size(), 1u);
  EXPECT_EQ(fc1.inspectors[size_t(TensorKind::Gradient)].size(), 1u);
  EXPECT_EQ(r0.next_change, 1);
  const Routing r1 = route(b, 1);
  EXPECT_TRUE(r1.layers[0].inspectors[size_t(TensorKind::Activation)].empty());
  EXPECT_EQ(r1.next_change, 2);
  const Routing r3 = route(b, 3);
  EXPECT_EQ(r3.next_change, 4);
  EXPECT_EQ(r1.variant_key(), r3.variant_key());  // same decisions, one variant
  EXPECT_NE(r0.variant_key(), r1.variant_key());
  const Routing r81 = route(b, 81);  // past end_step: only FakeQuant, for ever
  EXPECT_EQ(r81.next_change, kNever);
}

TEST(DebugRouting, Bf16LayerIsNeverQuantizedAndInactiveWithoutInspection) {
  const auto l = read(
      "s:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    DisableFP8GEMM: {gemms: [fprop]}\n");
  ASSERT_TRUE(l->config);
  const auto b = bind_layers(*l->config, layers({"fc1"}, /*quantized=*/false), *l->diags);
  const Routing r = route(b, 0);
  EXPECT_FALSE(r.layers[0].active());
  EXPECT_EQ(r.variant_key(), "");
  for (const GemmRouting& g : r.layers[0].gemms) {
    EXPECT_FALSE(g.quantized);
    EXPECT_EQ(g.operands[0], OperandAction::HighPrecision);
  }
}

// ---- C++ features -------------------------------------------------------------------------------

// A feature an application defines: inspects the listed tensors on even iterations.
class EvenIterations final : public Feature {
 public:
  EvenIterations() {
    spec_.name = "EvenIterations";
    spec_.doc = "inspects on even iterations";
    spec_.selects_tensors = true;
    spec_.keys.push_back({"threshold", KeyType::PositiveInt, {}, "a number", true});
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route inspect_tensor_enabled(const CallContext& c, TensorKind, int64_t it) const override {
    EXPECT_EQ(c.settings.get_int("threshold", 0), 7);
    return {it % 2 == 0, it + 1};
  }

 private:
  FeatureSpec spec_;
};

TEST(DebugFeatures, ApplicationFeatureRegisteredByName) {
  auto registry = std::make_shared<FeatureRegistry>(FeatureRegistry::with_builtins());
  registry->add(std::make_shared<EvenIterations>());
  EXPECT_THROW(registry->add(std::make_shared<EvenIterations>()), std::invalid_argument);
  const auto l = read(
      "s:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    EvenIterations: {tensors: [output], threshold: 7}\n",
      registry);
  ASSERT_TRUE(l->config) << l->messages();
  const auto b = bind_layers(*l->config, layers({"fc1"}), *l->diags);
  EXPECT_EQ(route(b, 4).layers[0].inspectors[size_t(TensorKind::Output)].size(), 1u);
  EXPECT_TRUE(route(b, 5).layers[0].inspectors[size_t(TensorKind::Output)].empty());
  // Its keys are checked like a built-in feature's.
  const auto bad = read(
      "s:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
      "    EvenIterations: {tensors: [output], threshold: 0}\n",
      registry);
  EXPECT_FALSE(bad->config);
  EXPECT_NE(bad->messages().find("'threshold' must be at least 1, not 0"), std::string::npos);
}

TEST(DebugFeatures, BuiltinsAreRegistered) {
  const FeatureRegistry r = FeatureRegistry::with_builtins();
  for (const char* name : {"LogTensorStats", "LogFp8TensorStats", "DisableFP8GEMM",
                           "DisableQuantizationGEMM", "DisableFP8Layer", "DisableQuantizationLayer",
                           "FakeQuant", "PerTensorScaling", "DumpTensors"}) {
    EXPECT_NE(r.find(name), nullptr) << name;
  }
  EXPECT_EQ(r.names().size(), 9u);
}

// ---- fusec debug-plan and the must-fail configs -------------------------------------------------

std::string corpus_dir() { return test::source_path("tests/errors/debug_config"); }

std::vector<std::string> corpus() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(corpus_dir()))
    if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

class MustFailConfig : public ::testing::TestWithParam<std::string> {};

TEST_P(MustFailConfig, FailsWithTheExpectedLocatedError) {
  const std::string path = corpus_dir() + "/" + GetParam() + ".yaml";
  const std::string text = test::read_text(path);
  std::smatch m;
  static const std::regex kExpect(R"(\n# expect: ([^:]+\.yaml):(\d+):(\d+): (error: [^\n]+))");
  ASSERT_TRUE(std::regex_search(text, m, kExpect)) << "line 2 must be '# expect: ...'";
  const std::string file = m[1];
  const size_t line = std::stoul(m[2]);
  const size_t col = std::stoul(m[3]);
  const std::string message = m[4];
  EXPECT_EQ(file, GetParam() + ".yaml");
  const auto result = test::run_command(test::fusec_path() + " debug-plan " +
                                        shell_quoted(corpus_dir() + "/program.fuse") +
                                        " --debug-config " + shell_quoted(path));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  const std::string located = fmt::format("{}:{}:{}: {}", path, line, col, message);
  const size_t at = result.output.find(located);
  ASSERT_NE(at, std::string::npos) << "want: " << located << "\ngot:\n" << result.output;
  // One mistake per file: one error.
  size_t errors = 0;
  for (size_t p = result.output.find(": error: "); p != std::string::npos;
       p = result.output.find(": error: ", p + 1)) {
    ++errors;
  }
  EXPECT_EQ(errors, 1u) << result.output;
  // The source line and a caret under the column follow.
  std::vector<std::string> source;
  std::istringstream in(text);
  for (std::string s; std::getline(in, s);) source.push_back(s);
  ASSERT_LE(line, source.size());
  const std::string shown = "\n  " + source[line - 1] + "\n  " + std::string(col - 1, ' ') + "^";
  EXPECT_NE(result.output.find(shown, at), std::string::npos) << result.output;
}

INSTANTIATE_TEST_SUITE_P(DebugConfig, MustFailConfig, ::testing::ValuesIn(corpus()),
                         [](const auto& info) { return info.param; });

TEST(FusecDebugPlan, RoutingAndVariantSchedule) {
  const std::string dir = test::make_temp_dir("debug_plan");
  const std::string config = dir + "/debug.yaml";
  {
    std::ofstream out(config);
    out << "stats:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
           "    LogTensorStats: {tensors: [activation], stats: [max], freq: 4, end_step: 9}\n"
           "high:\n  layers: {layer_name_regex_pattern: 'fc2$'}\n  transformer_engine:\n"
           "    DisableFP8GEMM: {gemms: [wgrad]}\n";
  }
  const auto r = test::run_command(test::fusec_path() + " debug-plan " +
                                   shell_quoted(corpus_dir() + "/program.fuse") +
                                   " --debug-config " + shell_quoted(config) + " --iterations 12");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* want : {
           "iteration 0 (holds until iteration 0)\n",
           "  activation: inspected by LogTensorStats\n",
           "  wgrad: high precision; gradient: high precision, activation: high precision\n",
           "plan variants over iterations 0-11: 2\n",
           "  fc1: activation inspected; fc2: wgrad high precision: iterations 0, 4, 8\n",
           "  fc2: wgrad high precision: iterations 1-3, 5-7, 9-11\n",
       }) {
    EXPECT_NE(r.output.find(want), std::string::npos) << "missing: " << want << "\n" << r.output;
  }
}

TEST(FusecRunDebug, LogsStatisticsAndTheReportDrawsThem) {
  const std::string dir = test::make_temp_dir("run_debug");
  const std::string config = dir + "/debug.yaml";
  {
    std::ofstream out(config);
    out << "stats:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
           "    LogTensorStats: {tensors: [activation, wgrad], stats: [max, l2_norm]}\n";
  }
  const std::string program = shell_quoted(corpus_dir() + "/program.fuse");
  const auto r = test::run_command(test::fusec_path() + " run " + program +
                                   " --device cpu --bind tokens=16 --steps 3 --debug-config " +
                                   shell_quoted(config) + " --debug-log-dir " +
                                   shell_quoted(dir + "/logs") + " --debug-precision 6");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text =
      test::read_text(dir + "/logs/nvdlfw_inspect_statistics_logs/nvdlfw_inspect_globalrank-0.log");
  // 3 iterations x 2 layers x 2 tensors x 2 statistics, six decimals.
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 24u) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(fc2_wgrad_l2_norm \t\t\t\t iteration=000002 )"
                                                 R"(\t\t\t\t value=\d+\.\d{6}\n)")))
      << text;
  const auto report =
      test::run_command(test::fusec_path() + " debug-report " + shell_quoted(dir + "/logs") +
                        " -o " + shell_quoted(dir + "/r.html"));
  ASSERT_EQ(report.exit_code, 0) << report.output;
  EXPECT_NE(test::read_text(dir + "/r.html").find("fc2"), std::string::npos);
}

TEST(FusecRunDebug, UnwritableLogDirectoryIsReportedBeforeTheFirstStep) {
  const std::string dir = test::make_temp_dir("run_debug_bad");
  const std::string config = dir + "/debug.yaml";
  {
    std::ofstream out(config);
    out << "s:\n  layers: {layer_types: [fc]}\n  transformer_engine:\n"
           "    LogTensorStats: {tensors: [weight], stats: [max]}\n";
    std::ofstream file(dir + "/a_file");
    file << "x";
  }
  const auto r = test::run_command(
      test::fusec_path() + " run " + shell_quoted(corpus_dir() + "/program.fuse") +
      " --device cpu --bind tokens=16 --debug-config " + shell_quoted(config) +
      " --debug-log-dir " + shell_quoted(dir + "/a_file/logs"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot write debug logs to"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step    0"), std::string::npos) << r.output;  // nothing ran
}

TEST(FusecRunDebug, ConfigErrorsStopTheRunWithTheirLocation) {
  const auto r = test::run_command(
      test::fusec_path() + " run " + shell_quoted(corpus_dir() + "/program.fuse") +
      " --device cpu --bind tokens=16 --debug-config " +
      shell_quoted(corpus_dir() + "/unknown_feature.yaml") + " --debug-log-dir " +
      shell_quoted(test::make_temp_dir("run_debug_err")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("unknown_feature.yaml:6:5: error: unknown feature 'LogTensorStat'"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step    0"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace opfuse::debug
