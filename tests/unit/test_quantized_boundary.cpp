// Quantized inputs and outputs (docs/language.md, "Quantized inputs and outputs"; note "Quantized
// boundaries" in docs/architecture.md) on the CPU: the plan a producer and a consumer get (the
// copies, their scale buffers, the inference variant), the IR they print, the CPU reference of a
// two-sequence MLP with an FP8 boundary against the one-sequence MLP (bit for bit, over training
// steps, under delayed, current and block scaling), and cpu::quantize_tensor / dequantize_tensor,
// the reference of the runtime's helpers. The located errors are tests/errors/quantized_*.fuse.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/plan.h"
#include "cpu/micro_scaling.h"
#include "cpu/numerics.h"
#include "cpu/quantized_tensor.h"
#include "driver/compile.h"
#include "ir/printer.h"
#include "reference/reference_executor.h"
#include "reference/run_driver.h"
#include "support/diagnostics.h"

namespace opfuse {
namespace {

using cpu::QuantizedTensor;
using cpu::ScaleLayout;
using Ref = cpu::ReferenceExecutor<float>;
using Tensor = cpu::Tensor<float>;

// The seed MLP once whole and once split at the SwiGLU's output, which fc1 hands to fc2 in FP8
// (NVFP4: E2M1).
std::string program(const std::string& recipe) {
  const std::string h = recipe.starts_with("nvfp4") ? "e2m1" : "e4m3";
  return fmt::format(R"(
recipe r = {0}
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 128]) uses r {{
  layernorm(256)
  linear(256, 512, bias = false) as up
  swiglu()
  linear(256, 128, bias = false) as down
}}
sequence fc1(x: bf16[tokens, 256]) -> (h: {1}[tokens, 256] quantized(rowwise, columnwise))
    uses r {{
  layernorm(256)
  linear(256, 512, bias = false) as up
  swiglu()
  quantize()
}}
sequence fc2(h: {1}[tokens, 256] quantized(rowwise, columnwise)) -> (y: bf16[tokens, 128])
    uses r {{
  linear(256, 128, bias = false) as down
}}
)",
                     recipe, h);
}

driver::CompileResult compile(const std::string& text, driver::Stage stage) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  driver::CompileOptions options;
  options.last_stage = stage;
  driver::CompileResult r = driver::compile_source("split.fuse", text, sources, diags, options);
  EXPECT_EQ(r.status, driver::CompileStatus::Ok) << r.error;
  return r;
}

// The name by value (std::string_view): GCC 13's -Wdangling-reference flags a returned reference
// whose call bound a temporary std::string to a const reference parameter.
const plan::SequencePlan& sequence(const plan::Plan& p, std::string_view name) {
  for (const plan::SequencePlan& s : p.sequences)
    if (s.name == name) return s;
  throw std::runtime_error("no sequence " + std::string(name));
}

const plan::Buffer* buffer(const plan::SequencePlan& s, const std::string& name) {
  for (const plan::Buffer& b : s.buffers)
    if (b.name == name) return &b;
  return nullptr;
}

const plan::Buffer* output(const plan::SequencePlan& s, const std::string& name) {
  for (const plan::Buffer& b : s.buffers)
    for (const plan::InterfaceTag& t : b.interface)
      if (t.kind == plan::InterfaceKind::Output && t.name == name) return &b;
  return nullptr;
}

TEST(QuantizedBoundaryPlan, ConsumerReadsTheCallersCopiesAndScales) {
  for (const std::string recipe : {"delayed_scaling()", "float8_block_scaling()"}) {
    SCOPED_TRACE(recipe);
    const driver::CompileResult r = compile(program(recipe), driver::Stage::Plan);
    const plan::SequencePlan& fc2 = sequence(r.plan, "fc2");
    // A boundary quantizer: no source, no state update, the caller's copies.
    ASSERT_FALSE(fc2.quantizers.empty());
    const plan::QuantizerPlan& h = fc2.quantizers[0];
    EXPECT_EQ(h.name, "h");
    EXPECT_TRUE(h.boundary);
    EXPECT_EQ(h.source_buffer, -1);
    EXPECT_TRUE(h.usages.rowwise && h.usages.columnwise);
    const plan::Buffer* row = buffer(fc2, "%h");
    const plan::Buffer* col = buffer(fc2, "%h.columnwise");
    ASSERT_TRUE(row && col);
    EXPECT_EQ(row->role, plan::BufferRole::Input);
    EXPECT_EQ(col->role, plan::BufferRole::Input);
    EXPECT_EQ(row->dtype, plan::DType::E4M3);
    EXPECT_EQ(col->layout, plan::CopyLayout::Transposed);
    // Both scale_invs are inputs: one shared scalar per tensor, a grid per copy with blocks.
    ASSERT_GE(row->scale_inv.buffer, 0);
    ASSERT_GE(col->scale_inv.buffer, 0);
    EXPECT_EQ(row->scale_inv.quantizer, -1);
    const plan::Buffer& row_scale = fc2.buffers[size_t(row->scale_inv.buffer)];
    EXPECT_EQ(row_scale.role, plan::BufferRole::Input);
    EXPECT_EQ(row_scale.dtype, plan::DType::FP32);
    if (recipe == "delayed_scaling()") {  // NOLINT(bugprone-branch-clone)
      EXPECT_EQ(row->scale_inv.buffer, col->scale_inv.buffer);
      EXPECT_EQ(row_scale.name, "%h.scale_inv");
    } else {
      EXPECT_NE(row->scale_inv.buffer, col->scale_inv.buffer);
      EXPECT_EQ(fc2.buffers[size_t(col->scale_inv.buffer)].role, plan::BufferRole::Input);
    }
    // No cast of h anywhere; its GEMMs read exactly these buffers; it is in no scale update.
    int fprop = 0, wgrad = 0;
    for (const plan::Step& step : fc2.steps) {
      if (const auto* g = std::get_if<plan::GemmStep>(&step.body)) {
        fprop += g->role == plan::GemmRole::Fprop && g->a.buffer == row->id;
        wgrad += g->role == plan::GemmRole::Wgrad && g->b.buffer == col->id;
      }
      if (const auto* l = std::get_if<plan::LaunchStep>(&step.body)) {
        for (const plan::ParamBinding& p : l->params) {
          if (p.kind == plan::ParamKind::Records) {
            EXPECT_EQ(std::count(p.records.begin(), p.records.end(), 0), 0) << step.what;
          }
          for (int b : p.buffers) {
            if (p.written) {
              EXPECT_TRUE(b != row->id && b != col->id) << step.what;
            }
          }
        }
      }
    }
    EXPECT_EQ(fprop, 1);
    EXPECT_EQ(wgrad, 1);
  }
}

TEST(QuantizedBoundaryPlan, ProducerWritesBothCopiesInTrainingAndOneInInference) {
  for (const std::string recipe :
       {"delayed_scaling()", "current_scaling()", "float8_block_scaling()"}) {
    SCOPED_TRACE(recipe);
    const driver::CompileResult r = compile(program(recipe), driver::Stage::Plan);
    const plan::SequencePlan& fc1 = sequence(r.plan, "fc1");
    const plan::Buffer* row = output(fc1, "h");
    const plan::Buffer* col = output(fc1, "h.columnwise");
    ASSERT_TRUE(row && col);
    EXPECT_EQ(row->dtype, plan::DType::E4M3);
    EXPECT_EQ(col->usage, plan::CopyUsage::Columnwise);
    EXPECT_EQ(row->quantizer, col->quantizer);
    const plan::QuantizerPlan& q = fc1.quantizers.at(size_t(row->quantizer));
    EXPECT_EQ(q.name, "h");
    EXPECT_FALSE(q.boundary);
    // The same spec as the one-sequence MLP's quantizer of down's input.
    const plan::SequencePlan& mlp = sequence(r.plan, "mlp");
    bool found = false;
    for (const plan::QuantizerPlan& m : mlp.quantizers) {
      if (m.name != "down.input") continue;
      found = true;
      EXPECT_EQ(m.spec, q.spec);
    }
    EXPECT_TRUE(found);
    const bool blocks = recipe == "float8_block_scaling()";
    if (blocks) {
      EXPECT_NE(output(fc1, "h.scale_inv"), nullptr);
      EXPECT_NE(output(fc1, "h.columnwise.scale_inv"), nullptr);
    } else {
      EXPECT_EQ(row->scale_inv.quantizer, row->quantizer);
    }
    // The step that writes both: an inference variant that writes only the row-wise copy.
    bool variant = false;
    for (const plan::Step& step : fc1.steps) {
      if (std::find(step.writes.begin(), step.writes.end(), col->id) == step.writes.end()) continue;
      ASSERT_TRUE(step.inference.has_value()) << step.what;
      const std::vector<int>& w = step.inference->writes;
      EXPECT_NE(std::find(w.begin(), w.end(), row->id), w.end());
      EXPECT_EQ(std::find(w.begin(), w.end(), col->id), w.end());
      variant = true;
    }
    EXPECT_TRUE(variant);
    EXPECT_EQ(col->inference, (plan::Lifetime{-1, -1}));
    // The quantize op is gone: no fake-quantizing launch, one quantizer per copy made.
    for (const plan::QuantizerPlan& other : fc1.quantizers)
      EXPECT_NE(other.role, plan::QuantizerRole::Output);
  }
}

// MXFP8 / NVFP4 (emulated on Hopper): the producer's casts store codes and compact block scales
// (NVFP4: the column-wise copy Hadamard-transformed under a quantizer of its own, with its own
// S_enc); the consumer takes them, with NVFP4's tensor scales, as inputs and decodes each copy
// for its GEMMs, the column-wise one only in training.
TEST(QuantizedBoundaryPlan, MicroScaledBoundariesCarryCodesAndScales) {
  for (const std::string recipe : {"mxfp8_block_scaling()", "nvfp4_block_scaling(rht = true)"}) {
    SCOPED_TRACE(recipe);
    const bool nvfp4 = recipe.starts_with("nvfp4");
    const driver::CompileResult r = compile(program(recipe), driver::Stage::Plan);
    const plan::SequencePlan& fc1 = sequence(r.plan, "fc1");
    const plan::Buffer* row = output(fc1, "h");
    const plan::Buffer* col = output(fc1, "h.columnwise");
    const plan::Buffer* row_scales = output(fc1, "h.scale_inv");
    const plan::Buffer* col_scales = output(fc1, "h.columnwise.scale_inv");
    ASSERT_TRUE(row && col && row_scales && col_scales);
    EXPECT_EQ(row->dtype, nvfp4 ? plan::DType::E2M1 : plan::DType::E4M3);
    EXPECT_EQ(row->bytes.text(), nvfp4 ? "tokens * 128" : "tokens * 256");
    EXPECT_EQ(row_scales->dtype, nvfp4 ? plan::DType::E4M3 : plan::DType::E8M0);
    EXPECT_EQ(row_scales->bytes.text(), nvfp4 ? "tokens * 16" : "tokens * 8");
    EXPECT_EQ(col->layout, nvfp4 ? plan::CopyLayout::Transposed : plan::CopyLayout::AsIs);
    const plan::QuantizerPlan& qr = fc1.quantizers.at(size_t(row->quantizer));
    const plan::QuantizerPlan& qc = fc1.quantizers.at(size_t(col->quantizer));
    EXPECT_EQ(qr.name, "h");
    EXPECT_EQ(qc.name, nvfp4 ? "h.columnwise" : "h");
    EXPECT_EQ(qc.spec.rht, nvfp4);
    // The one-sequence MLP casts down's input with the same specs.
    const plan::SequencePlan& mlp = sequence(r.plan, "mlp");
    int same = 0;
    for (const plan::QuantizerPlan& m : mlp.quantizers)
      same += m.name.starts_with("down.input") && (m.spec == qr.spec || m.spec == qc.spec);
    EXPECT_EQ(same, nvfp4 ? 2 : 1);
    // No decoded copy of h is written: the casts write codes and scales.
    for (const plan::Step& step : fc1.steps) {
      const auto* l = std::get_if<plan::LaunchStep>(&step.body);
      if (l == nullptr || !l->name_expression.starts_with("opfuse::micro_scale_cast<")) continue;
      const bool writes_codes =
          std::find(step.writes.begin(), step.writes.end(), row->id) != step.writes.end() ||
          std::find(step.writes.begin(), step.writes.end(), col->id) != step.writes.end();
      if (!writes_codes) continue;
      EXPECT_TRUE(l->name_expression.ends_with("true>")) << l->name_expression;  // kWriteCodes
    }

    const plan::SequencePlan& fc2 = sequence(r.plan, "fc2");
    std::vector<std::string> inputs;
    for (const plan::Buffer& b : fc2.buffers)
      if (b.role == plan::BufferRole::Input) inputs.push_back(b.name);
    std::vector<std::string> want = {"%h", "%h.scale_inv", "%h.columnwise",
                                     "%h.columnwise.scale_inv"};
    if (nvfp4) {
      want.insert(want.begin() + 2, "%h.tensor_scale");
      want.push_back("%h.columnwise.tensor_scale");
    }
    EXPECT_EQ(inputs, want);
    int decodes = 0;
    for (const plan::Step& step : fc2.steps) {
      const auto* l = std::get_if<plan::LaunchStep>(&step.body);
      if (l == nullptr || !l->name_expression.starts_with("opfuse::micro_dequantize<")) continue;
      ++decodes;
      const bool columnwise = l->name_expression.ends_with("true>");
      EXPECT_EQ(step.inference.has_value(), columnwise) << step.what;
      // What it writes is what a GEMM of down reads, in bf16.
      ASSERT_EQ(step.writes.size(), 1u);
      bool read = false;
      for (const plan::Step& g : fc2.steps) {
        if (const auto* gemm = std::get_if<plan::GemmStep>(&g.body)) {
          read |= (gemm->role == plan::GemmRole::Fprop && !columnwise &&
                   gemm->a.buffer == step.writes[0]) ||
                  (gemm->role == plan::GemmRole::Wgrad && columnwise &&
                   gemm->b.buffer == step.writes[0]);
        }
      }
      EXPECT_TRUE(read) << step.what;
      EXPECT_EQ(fc2.buffers[size_t(step.writes[0])].dtype, plan::DType::BF16);
    }
    EXPECT_EQ(decodes, 2);
  }
}

TEST(QuantizedBoundaryPlan, IrShowsTheBoundary) {
  const driver::CompileResult r = compile(program("delayed_scaling()"), driver::Stage::Passes);
  const ir::Sequence* fc2 = r.program.find_sequence("fc2");
  ASSERT_NE(fc2, nullptr);
  const std::string text = ir::print_sequence(*fc2, nullptr);
  EXPECT_NE(text.find("(%h: e4m3[tokens, 256] quantized(rowwise, columnwise = %h.columnwise))"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("quantizer \"h\": input e4m3 of the caller (boundary)"), std::string::npos)
      << text;
}

// ---- the CPU reference -------------------------------------------------------------------------

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  cpu::round_to_bf16(v);
  return v;
}

Tensor tensor(std::vector<int64_t> shape, uint32_t seed, float scale) {
  Tensor t = Tensor::zeros(shape);
  t.data = random_values(t.data.size(), seed, scale);
  return t;
}

void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  size_t differ = 0;
  for (size_t i = 0; i < a.data.size(); ++i)
    differ += std::bit_cast<uint32_t>(a.data[i]) != std::bit_cast<uint32_t>(b.data[i]);
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.data.size() << " differ";
}

class QuantizedBoundaryReference : public ::testing::TestWithParam<std::string> {};

// fc1 then fc2 with the FP8 boundary equals the one-sequence MLP, every output, gradient and
// quantizer state, over steps in which delayed scales move.
TEST_P(QuantizedBoundaryReference, SplitEqualsWhole) {
  const driver::CompileResult r = compile(program(GetParam()), driver::Stage::FrontEnd);
  const cpu::Bindings bindings{{"tokens", 96}};
  Ref whole(*r.program.find_sequence("mlp"), bindings);
  Ref fc1(*r.program.find_sequence("fc1"), bindings);
  Ref fc2(*r.program.find_sequence("fc2"), bindings);
  uint32_t seed = 1;
  for (const std::string& p : whole.param_names()) {
    Tensor& w = whole.param(p);
    w = tensor(w.shape, seed++, p.find("layernorm") == 0 ? 1.0f : 0.05f);
    Ref& part = p.rfind("down", 0) == 0 ? fc2 : fc1;
    part.param(p) = w;
  }
  whole.params_changed();
  fc1.params_changed();
  fc2.params_changed();
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    const Tensor x = tensor({96, 256}, 100 + step, 1.0f + step);
    const Tensor dy = tensor({96, 128}, 200 + step, 0.01f);
    const std::vector<Tensor> y_whole = whole.forward({x});
    const std::vector<Tensor> h = fc1.forward({x});
    const QuantizedTensor hq = fc1.quantized_output();
    EXPECT_EQ(cpu::quantized_tensor_problem(hq), "");
    EXPECT_FALSE(hq.columnwise.empty());
    // forward() gives the decoded row-wise copy.
    const std::vector<float> decoded = cpu::dequantize_tensor(hq);
    EXPECT_TRUE(std::equal(decoded.begin(), decoded.end(), h[0].data.begin()));
    fc2.set_quantized_input(hq);
    const std::vector<Tensor> y_split = fc2.forward({Tensor{}});
    expect_same(y_split[0], y_whole[0], "y");
    const cpu::Gradients<float> g_whole = whole.backward({dy});
    const cpu::Gradients<float> g2 = fc2.backward({dy});
    const cpu::Gradients<float> g1 = fc1.backward({g2.inputs[0]});
    expect_same(g1.inputs[0], g_whole.inputs[0], "dx");
    for (size_t i = 0; i < whole.param_names().size(); ++i) {
      const std::string& p = whole.param_names()[i];
      const bool down = p.rfind("down", 0) == 0;
      const Ref& part = down ? fc2 : fc1;
      const auto& names = part.param_names();
      const size_t k = size_t(std::find(names.begin(), names.end(), p) - names.begin());
      expect_same((down ? g2 : g1).params.at(k), g_whole.params[i], p);
    }
    // The producer's "h" quantizer is the whole MLP's "down.input".
    for (const cpu::QuantizerInfo& q : fc1.quantizers()) {
      if (q.name != "h") continue;
      for (const cpu::QuantizerInfo& w : whole.quantizers())
        if (w.name == "down.input") {
          EXPECT_EQ(q.amax_history, w.amax_history);
          EXPECT_EQ(q.scale_inv, w.scale_inv);
        }
    }
    whole.step();
    fc1.step();
    fc2.step();
  }
}

// An inference forward makes no column-wise copy, and the consumer refuses a tensor that does not
// match its input.
TEST_P(QuantizedBoundaryReference, InferenceAndMismatches) {
  const driver::CompileResult r = compile(program(GetParam()), driver::Stage::FrontEnd);
  const cpu::Bindings bindings{{"tokens", 64}};
  Ref fc1(*r.program.find_sequence("fc1"), bindings);
  Ref fc2(*r.program.find_sequence("fc2"), bindings);
  EXPECT_THROW(fc1.quantized_output(), cpu::ReferenceError);
  EXPECT_THROW(fc2.forward({Tensor{}}), cpu::ReferenceError);  // no copies given
  fc1.forward_inference({tensor({64, 256}, 7, 1.0f)});
  QuantizedTensor hq = fc1.quantized_output();
  EXPECT_FALSE(hq.rowwise.empty());
  EXPECT_TRUE(hq.columnwise.empty());
  EXPECT_THROW(fc2.set_quantized_input(hq), cpu::ReferenceError);  // wgrad's copy missing
  fc1.forward({tensor({64, 256}, 7, 1.0f)});
  hq = fc1.quantized_output();
  fc2.set_quantized_input(hq);
  QuantizedTensor wrong = hq;
  if (hq.scales == ScaleLayout::Nvfp4) {
    wrong.hadamard = !hq.hadamard;  // E2M1 has no other format; the transform must match
  } else {
    wrong.format = cpu::Fp8Format::E5M2;
  }
  EXPECT_THROW(fc2.set_quantized_input(wrong), cpu::ReferenceError);
  wrong = hq;
  wrong.scales = hq.scales == ScaleLayout::Tensor ? ScaleLayout::Block1D : ScaleLayout::Tensor;
  EXPECT_THROW(fc2.set_quantized_input(wrong), cpu::ReferenceError);
  wrong = hq;
  if (cpu::micro_scaled(hq.scales)) {
    wrong.columnwise_block_scales.pop_back();
  } else {
    wrong.scale_inv.pop_back();
  }
  EXPECT_THROW(fc2.set_quantized_input(wrong), cpu::ReferenceError);
  wrong = cpu::quantize_tensor(random_values(32 * 256, 3, 1.0f), 32, 256, hq.format, hq.scales,
                               true, true, 1.0f, true, 0.0f, hq.hadamard);
  EXPECT_THROW(fc2.set_quantized_input(wrong), cpu::ReferenceError);  // 32 rows, not 64
}

// A consumer alone (fusec run of it): quantize_input quantizes a tensor as the producer's final
// quantize() would, so the consumer computes what it computes from the producer's copies of the
// same values; the run driver gives it its seeded input that way, step after step.
TEST_P(QuantizedBoundaryReference, ConsumerAloneQuantizesItsInput) {
  const driver::CompileResult r = compile(program(GetParam()), driver::Stage::FrontEnd);
  const cpu::Bindings bindings{{"tokens", 64}};
  const ir::Sequence& consumer = *r.program.find_sequence("fc2");
  Ref a(consumer, bindings), b(consumer, bindings);
  b.param("down.weight") = a.param("down.weight") = tensor({128, 256}, 3, 0.05f);
  a.params_changed();
  b.params_changed();
  const Tensor h = tensor({64, 256}, 4, 2.0f);
  a.quantize_input(h);
  // The producer: a quantize alone under the same recipe, fed the same values.
  const std::string type = GetParam().starts_with("nvfp4") ? "e2m1" : "e4m3";
  const driver::CompileResult q =
      compile(fmt::format("recipe r = {}\nsequence q(x: bf16[tokens, 256]) -> (h: {}[tokens, 256] "
                          "quantized(rowwise, columnwise)) uses r {{\n  quantize()\n}}\n",
                          GetParam(), type),
              driver::Stage::FrontEnd);
  Ref producer(*q.program.find_sequence("q"), bindings);
  producer.forward({h});
  b.set_quantized_input(producer.quantized_output());
  const bool delayed = GetParam().starts_with("delayed");
  if (!delayed) {  // delayed scaling's first cast uses scale 1, not the amax's
    expect_same(a.forward({Tensor{}})[0], b.forward({Tensor{}})[0], "y");
  }
  cpu::RunOptions options;
  options.bindings = bindings;
  options.steps = 2;
  const std::string report = cpu::run_reference_training(consumer, options);
  EXPECT_NE(report.find("\nstep    1  loss"), std::string::npos) << report;
  EXPECT_EQ(report.find("nan"), std::string::npos) << report;
}

std::string recipe_name(const ::testing::TestParamInfo<std::string>& info) {
  static const std::vector<std::string> names = {"delayed", "current",   "block", "block_2d_inputs",
                                                 "mxfp8",   "nvfp4_rht", "nvfp4"};
  return names.at(info.index);
}

INSTANTIATE_TEST_SUITE_P(Recipes, QuantizedBoundaryReference,
                         ::testing::Values("delayed_scaling(amax_history = 4)", "current_scaling()",
                                           "float8_block_scaling()",
                                           "float8_block_scaling(x_block = 2, w_block = 1)",
                                           // Stochastic rounding off: its Philox streams follow
                                           // the quantizers' indices, which differ once split.
                                           "mxfp8_block_scaling()",
                                           "nvfp4_block_scaling(stochastic_rounding = false)",
                                           "nvfp4_block_scaling(rht = false, stochastic_rounding "
                                           "= false)"),
                         recipe_name);

// ---- quantize_tensor / dequantize_tensor
// ---------------------------------------------------------

// The producer's copies are exactly what quantize_tensor makes of the tensor it casts (given the
// scale it cast with), and dequantizing either copy gives the same values.
TEST(QuantizedTensor, RoundTripsEveryLayout) {
  const std::vector<float> x = random_values(200 * 384, 11, 3.0f);
  for (const ScaleLayout layout :
       {ScaleLayout::Tensor, ScaleLayout::Block1D, ScaleLayout::Block2D}) {
    for (const cpu::Fp8Format format : {cpu::Fp8Format::E4M3, cpu::Fp8Format::E5M2}) {
      SCOPED_TRACE(fmt::format("{} {}", cpu::scale_layout_name(layout), int(format)));
      const QuantizedTensor q =
          cpu::quantize_tensor(x, 200, 384, format, layout, true, true, 32.0f);
      EXPECT_EQ(cpu::quantized_tensor_problem(q), "");
      EXPECT_EQ(int64_t(q.scale_inv.size()), cpu::scale_inv_count(layout, 200, 384, false));
      const std::vector<float> row = cpu::dequantize_tensor(q, false);
      const std::vector<float> col = cpu::dequantize_tensor(q, true);
      double err = 0, norm = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        err += std::pow(double(row[i]) - x[i], 2);
        norm += double(x[i]) * x[i];
      }
      EXPECT_LT(std::sqrt(err / norm), format == cpu::Fp8Format::E4M3 ? 0.04 : 0.08);
      if (layout != ScaleLayout::Block1D) {
        EXPECT_EQ(row, col);  // the same blocks both ways
      }
      // Quantizing the decoded values again with the same scale changes nothing.
      if (layout != ScaleLayout::Tensor) continue;
      const QuantizedTensor again =
          cpu::quantize_tensor(row, 200, 384, format, layout, true, true, 32.0f);
      EXPECT_EQ(again.rowwise, q.rowwise);
      EXPECT_EQ(again.scale_inv, q.scale_inv);
    }
  }
}

// MXFP8 and NVFP4 (runtime/cpu/micro_scaling.h): the copies are micro_scaling's own, their scales
// sized as scale_inv_count says, and each decodes to what the emulated cast gives.
TEST(QuantizedTensor, RoundTripsMicroScaledLayouts) {
  const int64_t rows = 64, cols = 96;
  const std::vector<float> x = random_values(size_t(rows * cols), 13, 2.0f);
  for (const bool hadamard : {false, true}) {
    for (const ScaleLayout layout : {ScaleLayout::Mxfp8, ScaleLayout::Nvfp4}) {
      SCOPED_TRACE(fmt::format("{} hadamard {}", cpu::scale_layout_name(layout), hadamard));
      const QuantizedTensor q = cpu::quantize_tensor(x, rows, cols, cpu::Fp8Format::E4M3, layout,
                                                     true, true, 1.0f, true, 0.0f, hadamard);
      EXPECT_EQ(cpu::quantized_tensor_problem(q), "");
      EXPECT_EQ(int64_t(q.rowwise.size()), cpu::copy_bytes(layout, rows, cols));
      EXPECT_EQ(int64_t(q.block_scales.size()), cpu::scale_inv_count(layout, rows, cols, false));
      EXPECT_EQ(int64_t(q.columnwise_block_scales.size()),
                cpu::scale_inv_count(layout, rows, cols, true));
      const bool nvfp4 = layout == ScaleLayout::Nvfp4;
      std::vector<float> row_fake, col_fake;
      if (nvfp4) {
        cpu::Nvfp4Params params;
        row_fake = cpu::nvfp4_fake_quantize(x, rows, cols, q.tensor_scale, params);
        params.columnwise = true;
        params.rht = hadamard;
        col_fake = cpu::nvfp4_fake_quantize(x, rows, cols, q.columnwise_tensor_scale, params);
        EXPECT_EQ(q.hadamard, hadamard);
        if (!hadamard) {
          EXPECT_EQ(q.tensor_scale, q.columnwise_tensor_scale);
        }
      } else {
        row_fake = cpu::mxfp8_fake_quantize(x, rows, cols, cpu::Fp8Format::E4M3, false);
        col_fake = cpu::mxfp8_fake_quantize(x, rows, cols, cpu::Fp8Format::E4M3, true);
      }
      EXPECT_EQ(cpu::dequantize_tensor(q, false), row_fake);
      EXPECT_EQ(cpu::dequantize_tensor(q, true), col_fake);
      QuantizedTensor bad = q;
      bad.block_scales.pop_back();
      EXPECT_NE(cpu::quantized_tensor_problem(bad), "");
      bad = q;
      bad.rowwise.resize(bad.rowwise.size() * 2);
      EXPECT_NE(cpu::quantized_tensor_problem(bad), "");
    }
  }
  // Blocks need their extent: 40 rows make no NVFP4 column-wise blocks of 16.
  const QuantizedTensor odd =
      cpu::quantize_tensor(random_values(40 * 96, 2, 1.0f), 40, 96, cpu::Fp8Format::E4M3,
                           ScaleLayout::Nvfp4, true, false, 1.0f);
  EXPECT_EQ(cpu::quantized_tensor_problem(odd), "");
  QuantizedTensor with_col = odd;
  with_col.columnwise = odd.rowwise;
  EXPECT_NE(cpu::quantized_tensor_problem(with_col), "");
}

TEST(QuantizedTensor, RejectsMalformedTensors) {
  QuantizedTensor q =
      cpu::quantize_tensor(random_values(128 * 128, 5, 1.0f), 128, 128, cpu::Fp8Format::E4M3,
                           ScaleLayout::Block1D, true, false, 1.0f);
  EXPECT_EQ(cpu::quantized_tensor_problem(q), "");
  EXPECT_THROW(cpu::dequantize_tensor(q, true), std::invalid_argument);  // no column-wise copy
  q.scale_inv.resize(3);
  EXPECT_NE(cpu::quantized_tensor_problem(q), "");
  EXPECT_THROW(cpu::dequantize_tensor(q), std::invalid_argument);
}

}  // namespace
}  // namespace opfuse
