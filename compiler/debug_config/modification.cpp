#include "debug_config/modification.h"

#include <fmt/format.h>

#include "ir/scalar_code.h"
#include "passes/plan_quantization.h"

namespace opfuse::debug {

ir::QuantizerRole role_of(TensorKind t) {
  switch (t) {
    case TensorKind::Activation:
      return ir::QuantizerRole::Input;
    case TensorKind::Weight:
      return ir::QuantizerRole::Weight;
    default:
      return ir::QuantizerRole::GradOutput;
  }
}

namespace {

// Whether the expression reads no input but x (var 0).
bool reads_only_x(const ir::scalar::Graph& g, ir::scalar::NodeId value) {
  const ir::scalar::NodeId roots[] = {value};
  for (const ir::scalar::NodeId id : g.schedule(roots)) {
    const ir::scalar::Node& n = g.node(id);
    if (n.op == ir::scalar::Op::Var && n.var != 0) return false;
  }
  return true;
}

}  // namespace

Modification Modification::fake_quant(plan::DType format) {
  Modification m;
  m.kind = Kind::FakeQuant;
  m.format = format;
  return m;
}

Modification Modification::per_tensor_scaling() {
  Modification m;
  m.kind = Kind::PerTensorScaling;
  return m;
}

Modification Modification::pointwise(ir::scalar::Graph graph, ir::scalar::NodeId value,
                                     std::string description) {
  Modification m;
  m.kind = Kind::Pointwise;
  m.graph = std::move(graph);
  m.value = value;
  m.description = std::move(description);
  return m;
}

std::string Modification::key() const {
  switch (kind) {
    case Kind::FakeQuant:
      return fmt::format("fake_quant({})", plan::name(format));
    case Kind::PerTensorScaling:
      return "per_tensor_scaling";
    case Kind::Pointwise:
      return fmt::format("pointwise({})", ir::scalar::encode(graph, value));
  }
  return "?";
}

std::string Modification::describe() const {
  switch (kind) {
    case Kind::FakeQuant:
      return fmt::format("quantize-dequantize through {}, per-tensor current scaling",
                         plan::name(format));
    case Kind::PerTensorScaling:
      return "FP8 cast with per-tensor current scaling";
    case Kind::Pointwise: {
      const std::string f = ir::scalar::describe(graph, value);
      return description.empty() ? fmt::format("x -> {}", f)
                                 : fmt::format("{}: x -> {}", description, f);
    }
  }
  return "?";
}

std::string add_modification(ir::Sequence& seq, const std::string& layer, GemmRole gemm,
                             TensorKind tensor, bool gemm_quantized, const std::string& feature,
                             const Modification& m) {
  const ir::QuantizerRole role = role_of(tensor);
  if (m.kind == Modification::Kind::PerTensorScaling) {
    if (!gemm_quantized) return {};  // its GEMM left quantization: no cast to rescale
    // Only this GEMM's copy: plan-quantization gives it its own quantizer when the other GEMM
    // reading the tensor keeps the recipe's spec.
    ir::QuantOverride o;
    o.layer = layer;
    o.gemm = gemm;
    o.tensor = role;
    o.spec = passes::recipe_spec(seq.recipe, role);
    o.spec.scaling = plan::ScalingKind::Current;
    o.spec.history_length = 1;
    o.spec.margin = 0;
    seq.quant_overrides.push_back(std::move(o));
    return {};
  }
  ir::TensorModification t;
  t.layer = layer;
  t.gemm = gemm;
  t.tensor = role;
  t.feature = feature;
  if (m.kind == Modification::Kind::FakeQuant) {
    if (!plan::dtype_is_fp8(m.format))
      return fmt::format("{} (layer '{}', {} of {}): fake quantization needs an FP8 format, not {}",
                         feature, layer, plan::name(tensor), plan::name(gemm),
                         plan::name(m.format));
    t.fake_quant = m.format;
  } else {
    if (m.value >= m.graph.size() || !reads_only_x(m.graph, m.value))
      return fmt::format(
          "{} (layer '{}', {} of {}): a pointwise modification must be an "
          "expression of x (var 0) only",
          feature, layer, plan::name(tensor), plan::name(gemm));
    t.expression = ir::scalar::encode(m.graph, m.value);
  }
  seq.modifications.push_back(std::move(t));
  return {};
}

}  // namespace opfuse::debug
