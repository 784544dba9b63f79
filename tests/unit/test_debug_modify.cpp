// Modifying GEMM operands (TE's modify_tensor; compiler/passes/debug_modify.h): the pass puts the
// modification in front of exactly one GEMM; FakeQuant is a current-scaling quantize-dequantize
// (hand-computed E4M3 and E5M2 values, amax 0, NaN; equal to the language's quantize op under a
// current-scaling recipe) and leaves the other GEMMs reading the tensor unchanged;
// PerTensorScaling changes only the selected GEMM's cast; a C++ feature's pointwise modification
// (clip to [-c, c]) runs in the CPU reference and compiles to a kernel NVRTC accepts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>

#include "../../runtime/jit/nvrtc_compiler.h"
#include "codegen/kernel_source.h"
#include "codegen/kernel_templates.h"
#include "cpu/numerics.h"
#include "debug_clip_feature.h"
#include "debug_config/instrument.h"
#include "debug_config/routing.h"
#include "driver/compile.h"
#include "ir/pointwise_ops.h"
#include "ir/scalar_code.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "test_support.h"

namespace opfuse::debug {
namespace {

struct Routed {
  SourceManager sources;
  std::unique_ptr<DiagnosticEngine> diags;
  std::optional<DebugConfig> config;
  Routing routing;
};

std::unique_ptr<Routed> route_yaml(const std::string& yaml, const std::vector<std::string>& layers,
                                   bool quantized) {
  auto r = std::make_unique<Routed>();
  r->diags = std::make_unique<DiagnosticEngine>(r->sources);
  auto registry = std::make_shared<FeatureRegistry>(FeatureRegistry::with_builtins());
  registry->add(std::make_shared<test::Clip>());
  const FileId f = r->sources.add_buffer("debug.yaml", yaml);
  r->config = read_debug_config(r->sources, f, registry, *r->diags);
  EXPECT_TRUE(r->config) << r->diags->format_all();
  if (!r->config) return r;
  std::vector<LayerInfo> infos;
  infos.reserve(layers.size());
  for (const std::string& l : layers) infos.push_back({l, {}, quantized});
  r->routing = route(bind_layers(*r->config, infos, *r->diags), 0);
  return r;
}

driver::CompileResult compile(const std::string& text, const Routing* routing,
                              driver::Stage stage = driver::Stage::Passes) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = stage;
  options.debug_routing = routing;
  driver::CompileResult r = driver::compile_source("m.fuse", text, sources, diags, options);
  EXPECT_TRUE(r.ok()) << diags.format_all() << r.error;
  return r;
}

const ir::Operation* find(const ir::Sequence& s, ir::OpKind kind, const std::string& instance) {
  for (const ir::Operation& op : s.ops)
    if (op.kind == kind && op.instance == instance) return &op;
  return nullptr;
}

int index_of(const ir::Sequence& s, const ir::Operation* op) { return int(op - s.ops.data()); }

const ir::QuantizerDecl* quantizer(const ir::Sequence& s, const std::string& name) {
  for (const ir::QuantizerDecl& q : s.quantizers)
    if (q.name == name) return &q;
  return nullptr;
}

// The quantizer of the FP8 value a GEMM reads as operand k (nullptr: high precision).
const ir::QuantizerDecl* operand_quantizer(const ir::Sequence& s, const ir::Operation& gemm,
                                           size_t k) {
  const int q = s.value(gemm.operands.at(k)).quantizer;
  return q < 0 ? nullptr : &s.quantizers.at(size_t(q));
}

const std::string kFp8Linear = R"(
recipe fp8 = delayed_scaling()
sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 96]) uses fp8 {
  linear(64, 96, bias = false) as fc1
}
)";

TEST(DebugModify, FakeQuantGoesInFrontOfItsGemmOnly) {
  const auto r = route_yaml(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    FakeQuant: {gemms: [fprop], tensors: [activation], quant_format: FP8E5M2}\n",
      {"fc1"}, true);
  const auto c = compile(kFp8Linear, &r->routing);
  const ir::Sequence& s = c.program.sequences[0];
  const ir::Operation* mod = find(s, ir::OpKind::ModifyTensor, "fc1.fprop.input");
  const ir::Operation* fprop = find(s, ir::OpKind::Linear, "fc1");
  const ir::Operation* wgrad = find(s, ir::OpKind::LinearWgrad, "fc1");
  const ir::Operation* dgrad = find(s, ir::OpKind::LinearDgrad, "fc1");
  ASSERT_TRUE(mod && fprop && wgrad && dgrad);
  const ir::ValueId x = s.inputs[0];
  EXPECT_EQ(mod->operands, std::vector<ir::ValueId>{x});
  EXPECT_LT(index_of(s, mod), index_of(s, fprop));
  // fprop reads the fake-quantized x in high precision (its weight too: one kind per GEMM).
  EXPECT_EQ(fprop->operands[0], mod->results[0]);
  EXPECT_EQ(operand_quantizer(s, *fprop, 1), nullptr);
  EXPECT_EQ(s.value(fprop->operands[1]).kind, ir::ValueKind::Param);
  // Its quantizer: current scaling to E5M2, no epsilon.
  ASSERT_GE(mod->quantizer, 0);
  const ir::QuantizerDecl& q = s.quantizers.at(size_t(mod->quantizer));
  EXPECT_EQ(q.name, "fc1.input.fake_quant_fprop");
  EXPECT_EQ(q.spec.scaling, plan::ScalingKind::Current);
  EXPECT_EQ(q.spec.format, plan::DType::E5M2);
  EXPECT_EQ(q.spec.epsilon, 0.0);
  // wgrad reads the FP8 copy of the unmodified x under the recipe; dgrad is untouched.
  const ir::QuantizerDecl* xq = operand_quantizer(s, *wgrad, 1);
  ASSERT_NE(xq, nullptr);
  EXPECT_EQ(xq->name, "fc1.input");
  EXPECT_EQ(xq->source, x);
  EXPECT_EQ(xq->spec.scaling, plan::ScalingKind::Delayed);
  EXPECT_FALSE(xq->usages.rowwise);
  ASSERT_NE(operand_quantizer(s, *dgrad, 0), nullptr);
  EXPECT_EQ(operand_quantizer(s, *dgrad, 1)->name, "fc1.weight");
  int mods = 0;
  for (const ir::Operation& op : s.ops) mods += op.kind == ir::OpKind::ModifyTensor;
  EXPECT_EQ(mods, 1);
}

TEST(DebugModify, GradientModifiedForDgradLeavesWgradReadingTheOriginal) {
  const auto r = route_yaml(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    Clip: {gemms: [dgrad], tensors: [gradient], c: 0.25}\n",
      {"fc1"}, false);
  const auto c = compile(
      "sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 96]) {\n"
      "  linear(64, 96, bias = false) as fc1\n}\n",
      &r->routing);
  const ir::Sequence& s = c.program.sequences[0];
  const ir::Operation* mod = find(s, ir::OpKind::ModifyTensor, "fc1.dgrad.grad_output");
  const ir::Operation* dgrad = find(s, ir::OpKind::LinearDgrad, "fc1");
  const ir::Operation* wgrad = find(s, ir::OpKind::LinearWgrad, "fc1");
  ASSERT_TRUE(mod && dgrad && wgrad);
  EXPECT_EQ(mod->phase, ir::Phase::Backward);
  EXPECT_EQ(mod->quantizer, -1);
  EXPECT_EQ(index_of(s, mod) + 1, index_of(s, dgrad));
  EXPECT_EQ(dgrad->operands[0], mod->results[0]);
  EXPECT_EQ(wgrad->operands[0], mod->operands[0]);  // the gradient as the layer received it
  EXPECT_TRUE(s.quantizers.empty());
  const auto f = ir::scalar::decode(ir::attr_name(mod->attrs, "expression"));
  ASSERT_TRUE(f);
  EXPECT_EQ(ir::scalar::describe(f->graph, f->value),
            "((x >= -0.25 ? x : -0.25) <= 0.25 ? "
            "(x >= -0.25 ? x : -0.25) : 0.25)");
}

// One fp32 layer whose weight is the identity: y = the fprop's activation operand exactly.
const std::string kIdentity = R"(
sequence s(x: fp32[tokens, 4]) -> (y: fp32[tokens, 4]) {
  linear(4, 4, bias = false) as fc1
}
)";

std::vector<float> fprop_operand(const std::string& yaml, const std::vector<float>& x) {
  const auto r = route_yaml(yaml, {"fc1"}, false);
  const auto c = compile(kIdentity, &r->routing);
  const int64_t rows = int64_t(x.size()) / 4;
  cpu::ReferenceExecutor<float> exec(c.program.sequences[0], {{"tokens", rows}});
  exec.param("fc1.weight").data = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  exec.params_changed();
  cpu::Tensor<float> in = cpu::Tensor<float>::zeros({rows, 4});
  in.data = x;
  return exec.forward({in})[0].data;
}

std::string fake_quant(const std::string& format) {
  return "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
         "    FakeQuant: {gemms: [fprop], tensors: [activation], quant_format: " +
         format + "}\n";
}

TEST(DebugModify, FakeQuantMatchesHandComputedValues) {
  // amax 2. E4M3: scale 448 / 2 = 224; 0.45 * 224 = 100.8 -> 104 (steps of 8 in [64, 128)).
  // E5M2: scale 57344 / 2 = 28672; 0.45 * 28672 = 12902.4 -> 12288 (steps of 2048).
  const std::vector<float> x = {2, -1, 0.45f, 0};
  const std::vector<float> e4m3 = fprop_operand(fake_quant("FP8E4M3"), x);
  EXPECT_EQ(e4m3, (std::vector<float>{2, -1, 104 * (1.0f / 224), 0}));
  const std::vector<float> e5m2 = fprop_operand(fake_quant("FP8E5M2"), x);
  EXPECT_EQ(e5m2, (std::vector<float>{2, -1, 12288 * (1.0f / 28672), 0}));
  // amax 0: scale 1, zeros stay zeros (no NaN from 0 / 0).
  EXPECT_EQ(fprop_operand(fake_quant("FP8E4M3"), {0, 0, 0, 0}), (std::vector<float>{0, 0, 0, 0}));
  // Values below the format's range at scale 1 flush to 0 only when amax is that small: here
  // amax = 1e-3 gives scale 448000, so 1e-3 survives exactly as 448 / 448000.
  const std::vector<float> small = fprop_operand(fake_quant("FP8E4M3"), {1e-3f, 0, 0, 0});
  EXPECT_EQ(small[0], 448.0f * (1.0f / (448.0f / 1e-3f)));
}

TEST(DebugModify, FakeQuantIgnoresNaNInTheAmaxAndKeepsIt) {
  // Row 0 holds the NaN (the identity GEMM spreads it over row 0 only); row 1 is quantized with
  // the amax of the finite values (2), as without the NaN.
  const float nan = std::nanf("");
  const std::vector<float> y =
      fprop_operand(fake_quant("FP8E4M3"), {nan, 0, 0, 0, 2, -1, 0.45f, 0});
  for (int j = 0; j < 4; ++j) EXPECT_TRUE(std::isnan(y[size_t(j)]));
  EXPECT_EQ(std::vector<float>(y.begin() + 4, y.end()),
            (std::vector<float>{2, -1, 104 * (1.0f / 224), 0}));
}

TEST(DebugModify, ClipFeatureRunsInTheReference) {
  const std::vector<float> y = fprop_operand(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    Clip: {gemms: [fprop], tensors: [activation], c: 0.5}\n",
      {2, -1, 0.25f, -0.5f});
  EXPECT_EQ(y, (std::vector<float>{0.5f, -0.5f, 0.25f, -0.5f}));
}

// FakeQuant equals the language's quantize op under a current-scaling recipe in front of a GEMM
// kept in high precision; the other GEMMs reading the activation (wgrad) and the weight (dgrad)
// give the plain program's gradients bit for bit.
TEST(DebugModify, FakeQuantEqualsQuantizeOpAndLeavesTheOtherGemmsUnchanged) {
  const std::string plain_text = R"(
sequence s(x: fp32[tokens, 32]) -> (y: fp32[tokens, 16]) {
  linear(32, 16, bias = false) as fc1
}
)";
  const std::string quantize_text = R"(
recipe cs = current_scaling(format = e4m3)
sequence s(x: fp32[tokens, 32]) -> (y: fp32[tokens, 16]) uses cs {
  quantize()
  linear(32, 16, bias = false) as fc1
}
)";
  const auto fq = route_yaml(fake_quant("FP8E4M3"), {"fc1"}, false);
  const auto hp = route_yaml(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    DisableFP8Layer: {}\n",
      {"fc1"}, true);
  const auto plain = compile(plain_text, nullptr);
  const auto modified = compile(plain_text, &fq->routing);
  const auto quantized = compile(quantize_text, &hp->routing);
  const int64_t tokens = 24;
  cpu::Tensor<float> x = cpu::seeded_normal({tokens, 32}, 3, 1.0);
  cpu::Tensor<float> dy = cpu::seeded_normal({tokens, 16}, 4, 0.1);
  const cpu::Tensor<float> w = cpu::seeded_normal({16, 32}, 5, 0.2);
  auto run = [&](const driver::CompileResult& c) {
    cpu::ReferenceExecutor<float> exec(c.program.sequences[0], {{"tokens", tokens}});
    exec.param("fc1.weight").data = w.data;
    exec.params_changed();
    auto y = exec.forward({x});
    auto g = exec.backward({dy});
    return std::make_tuple(y[0].data, g.inputs[0].data, g.params[0].data);
  };
  const auto [y0, dx0, dw0] = run(plain);
  const auto [y1, dx1, dw1] = run(modified);
  const auto [y2, dx2, dw2] = run(quantized);
  EXPECT_EQ(y1, y2);    // the fprop operand: current-scaling quantize-dequantize
  EXPECT_NE(y1, y0);    // ... which changes it
  EXPECT_EQ(dx1, dx0);  // dgrad reads dy and W unchanged
  EXPECT_EQ(dw1, dw0);  // wgrad reads dy and the unmodified x
}

// PerTensorScaling on fc1's fprop activation: fprop's copy gets a current-scaling quantizer of
// its own; wgrad's copy keeps the plain plan's quantizer, spec and values.
TEST(DebugModify, PerTensorScalingChangesOnlyTheSelectedGemmsCast) {
  const auto r = route_yaml(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    PerTensorScaling: {gemms: [fprop], tensors: [activation]}\n",
      {"fc1"}, true);
  const auto plain = compile(kFp8Linear, nullptr);
  const auto v = compile(kFp8Linear, &r->routing);
  const ir::Sequence& p = plain.program.sequences[0];
  const ir::Sequence& s = v.program.sequences[0];
  const ir::Operation* fprop = find(s, ir::OpKind::Linear, "fc1");
  const ir::Operation* wgrad = find(s, ir::OpKind::LinearWgrad, "fc1");
  ASSERT_TRUE(fprop && wgrad);
  const ir::QuantizerDecl* fq = operand_quantizer(s, *fprop, 0);
  const ir::QuantizerDecl* wq = operand_quantizer(s, *wgrad, 1);
  ASSERT_TRUE(fq && wq);
  EXPECT_EQ(fq->name, "fc1.input.fprop");
  EXPECT_EQ(fq->spec.scaling, plan::ScalingKind::Current);
  EXPECT_EQ(fq->source, s.inputs[0]);
  EXPECT_EQ(wq->name, "fc1.input");
  const ir::QuantizerDecl* plain_x = quantizer(p, "fc1.input");
  ASSERT_NE(plain_x, nullptr);
  EXPECT_EQ(wq->spec, plain_x->spec);
  EXPECT_TRUE(wq->usages.columnwise);
  EXPECT_FALSE(wq->usages.rowwise);
  EXPECT_EQ(operand_quantizer(s, *fprop, 1)->name, "fc1.weight");  // the GEMM stays FP8

  // Numbers: the wgrad (dW) of the variant equals the plain plan's bit for bit, fprop differs.
  const int64_t tokens = 16;
  cpu::Tensor<float> x = cpu::seeded_normal({tokens, 64}, 8, 0.05);
  cpu::round_to_bf16(x.data);
  cpu::Tensor<float> dy = cpu::seeded_normal({tokens, 96}, 9, 0.1);
  cpu::round_to_bf16(dy.data);
  auto run = [&](const ir::Sequence& seq) {
    cpu::ReferenceExecutor<float> exec(seq, {{"tokens", tokens}});
    cpu::init_params_from_seed(exec, 1);
    auto y = exec.forward({x});
    auto g = exec.backward({dy});
    return std::make_pair(y[0].data, g.params[0].data);
  };
  const auto [y0, dw0] = run(p);
  const auto [y1, dw1] = run(s);
  EXPECT_NE(y0, y1);
  EXPECT_EQ(dw0, dw1);
}

TEST(DebugModify, ClipUnderAnFp8RecipeIsCastByAQuantizerOfItsOwn) {
  const auto r = route_yaml(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    Clip: {gemms: [wgrad], tensors: [activation], c: 2}\n",
      {"fc1"}, true);
  const auto c = compile(kFp8Linear, &r->routing);
  const ir::Sequence& s = c.program.sequences[0];
  const ir::Operation* mod = find(s, ir::OpKind::ModifyTensor, "fc1.wgrad.input");
  const ir::Operation* fprop = find(s, ir::OpKind::Linear, "fc1");
  const ir::Operation* wgrad = find(s, ir::OpKind::LinearWgrad, "fc1");
  ASSERT_TRUE(mod && fprop && wgrad);
  const ir::QuantizerDecl* wq = operand_quantizer(s, *wgrad, 1);
  const ir::QuantizerDecl* fq = operand_quantizer(s, *fprop, 0);
  ASSERT_TRUE(wq && fq);
  EXPECT_EQ(wq->name, "fc1.input.wgrad");
  EXPECT_EQ(wq->source, mod->results[0]);
  EXPECT_EQ(fq->name, "fc1.input");
  EXPECT_EQ(fq->source, s.inputs[0]);
  EXPECT_TRUE(fq->usages.rowwise);
  EXPECT_FALSE(fq->usages.columnwise);
}

TEST(DebugModify, RoutingDescribesTheModifications) {
  const auto r = route_yaml(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    FakeQuant: {gemms: [fprop], tensors: [activation], quant_format: FP8E4M3}\n"
      "    Clip: {gemms: [dgrad], tensors: [gradient], c: 0.5}\n",
      {"fc1"}, true);
  const std::string text = describe(r->routing.layers[0], r->sources);
  EXPECT_NE(
      text.find("fprop: high precision; activation: modified by FakeQuant (quantize-dequantize "
                "through e4m3, per-tensor current scaling), weight: high precision"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("gradient: modified by Clip (clip to [-0.5, 0.5]: x -> "), std::string::npos)
      << text;
  // What a modifier computes is part of the variant's key.
  const auto other = route_yaml(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    FakeQuant: {gemms: [fprop], tensors: [activation], quant_format: FP8E4M3}\n"
      "    Clip: {gemms: [dgrad], tensors: [gradient], c: 0.75}\n",
      {"fc1"}, true);
  EXPECT_NE(r->routing.variant_key(), other->routing.variant_key());
}

TEST(DebugModify, ExpressionTextRoundTrips) {
  ir::scalar::Graph g;
  const ir::scalar::NodeId x = g.var(0);
  const ir::scalar::NodeId f =
      g.add(g.mul(g.tanh(x), g.constant(-1.5e-3)),
            g.select(ir::scalar::Cmp::Gt, x, g.constant(0), g.exp(x), g.sigmoid(g.neg(x))));
  const std::string text = ir::scalar::encode(g, f);
  const auto d = ir::scalar::decode(text);
  ASSERT_TRUE(d);
  EXPECT_EQ(ir::scalar::encode(d->graph, d->value), text);
  for (const float v : {-2.0f, -0.1f, 0.0f, 0.3f, 4.0f}) {
    std::vector<float> a(g.size()), b(d->graph.size());
    const ir::scalar::NodeId ra[] = {f}, rb[] = {d->value};
    const float in[] = {v};
    g.evaluate<float>(g.schedule(ra), in, a);
    d->graph.evaluate<float>(d->graph.schedule(rb), in, b);
    EXPECT_EQ(a[f], b[d->value]) << v;
  }
  for (const char* bad : {"", "v0_add0x1", "q1", "v0_neg", "v0_c1p5p", "v9999999"})
    EXPECT_FALSE(ir::scalar::decode(bad)) << bad;
}

// fusec: debug-plan names each modification and what it does; run --device cpu executes them
// (the fake quantizations' quantizers appear in the run's report, the debug log has the routing).
TEST(DebugModify, FusecDebugPlanAndCpuRunExecuteFakeQuant) {
  const std::string dir = test::make_temp_dir("debug_modify_cli");
  const std::string config = dir + "/debug.yaml";
  {
    std::ofstream out(config);
    out << "s:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
           "    FakeQuant:\n      gemms_struct:\n"
           "        - {gemm: fprop, tensors: [activation], quant_format: FP8E4M3}\n"
           "        - {gemm: dgrad, tensors: [gradient], quant_format: FP8E5M2}\n";
  }
  const std::string program =
      test::shell_quoted(std::string(OPFUSE_TESTS_DIR) + "/errors/debug_config/program.fuse");
  const auto plan =
      test::fusec("debug-plan " + program + " --debug-config " + test::shell_quoted(config));
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_NE(plan.output.find("fprop: high precision; activation: modified by FakeQuant "
                             "(quantize-dequantize through e4m3, per-tensor current scaling)"),
            std::string::npos)
      << plan.output;
  EXPECT_NE(plan.output.find("gradient: modified by FakeQuant (quantize-dequantize through e5m2"),
            std::string::npos)
      << plan.output;
  EXPECT_NE(plan.output.find("modified operand fc1.fprop.input: fake-quantize bf16 through e4m3"),
            std::string::npos)
      << plan.output;
  const auto run = test::fusec(
      "run " + program + " --device cpu --bind tokens=16 --steps 2 --debug-config " +
      test::shell_quoted(config) + " --debug-log-dir " + test::shell_quoted(dir + "/logs"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("quant  fc1.input.fake_quant_fprop       e4m3"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("quant  fc1.grad_output.fake_quant_dgrad e5m2"), std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("not executed yet"), std::string::npos) << run.output;
  const std::string log =
      test::read_text(dir + "/logs/nvdlfw_inspect_logs/nvdlfw_inspect_globalrank-0.log");
  EXPECT_NE(log.find("activation: modified by FakeQuant (quantize-dequantize through e4m3"),
            std::string::npos)
      << log;
}

// The kernels a FakeQuant and a Clip variant add compile with NVRTC (the GPU test runs them).
TEST(DebugModify, ModificationKernelsCompileWithNvrtc) {
  const auto r = route_yaml(
      "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
      "    FakeQuant: {gemms: [fprop], tensors: [activation], quant_format: FP8E5M2}\n"
      "    Clip: {gemms: [dgrad, wgrad], tensors: [gradient], c: 0.5}\n",
      {"fc1"}, false);
  const auto c = compile(
      "sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 96]) {\n"
      "  linear(64, 96, bias = false) as fc1\n}\n",
      &r->routing, driver::Stage::Plan);
  std::vector<jit::CompileRequest> requests;
  bool fake = false, clip = false;
  for (const codegen::Kernel& k : c.plan.kernels) {
    fake |= k.template_name == "fake_quantize";
    clip |= k.name_expression.find("pointwise_expr_") != std::string::npos;
    jit::CompileRequest req;
    req.kernel_name = k.id;
    req.source = codegen::kernel_source(c.plan, k);
    req.name_expressions = {k.name_expression};
    req.arch = "sm_90a";
    requests.push_back(std::move(req));
  }
  EXPECT_TRUE(fake);
  EXPECT_TRUE(clip);
  const jit::CompileAllResult result = jit::compile_all(requests, nullptr);
  ASSERT_EQ(result.kernels.size(), requests.size());
  for (const jit::CompiledKernel& k : result.kernels) EXPECT_FALSE(k.is_ptx) << k.kernel_name;
}

// A long expression names its kernel by a hash (the id is a file stem); a short one spells it.
TEST(DebugModify, LongExpressionsGiveShortKernelIds) {
  const codegen::KernelTemplate* t = codegen::find_kernel_template("activation_fwd");
  ASSERT_NE(t, nullptr);
  ir::scalar::Graph g;
  ir::scalar::NodeId v = g.var(0);
  for (int i = 0; i < 40; ++i) v = g.add(g.mul(v, g.constant(0.5 + i)), g.constant(i));
  const std::string long_name = ir::expression_functor_name(ir::scalar::encode(g, v));
  const std::string id =
      codegen::kernel_id(*t, {long_name, "__nv_bfloat16", "__nv_bfloat16", "false"});
  EXPECT_LT(id.size(), 100u) << id;
  EXPECT_EQ(id.rfind("activation_fwd_expr_", 0), 0u) << id;
  EXPECT_NE(
      id, codegen::kernel_id(*t, {long_name + "_neg0", "__nv_bfloat16", "__nv_bfloat16", "false"}));
  ir::scalar::Graph small;
  const std::string short_id = codegen::kernel_id(
      *t, {ir::expression_functor_name(ir::scalar::encode(small, small.neg(small.var(0)))),
           "__nv_bfloat16", "__nv_bfloat16", "false"});
  EXPECT_EQ(short_id, "activation_fwd_expr_v0_neg0_bf16_bf16");
}

}  // namespace
}  // namespace opfuse::debug
