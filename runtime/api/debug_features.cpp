#include "api/debug_features.h"

#include <fmt/format.h>

#include <stdexcept>

#include "debug_config/modification.h"
#include "opfuse/error.h"

namespace opfuse {

std::string_view debug_tensor_name(DebugTensor tensor) {
  return plan::name(static_cast<debug::TensorKind>(tensor));
}

std::string_view debug_gemm_name(DebugGemm gemm) {
  return plan::name(static_cast<plan::GemmRole>(gemm));
}

DebugExpr DebugExpr::x() { return make(Op::X, {}); }

DebugExpr::DebugExpr(double constant) {
  auto node = std::make_shared<Node>();
  node->op = Op::Const;
  node->value = constant;
  node_ = std::move(node);
}

DebugExpr DebugExpr::make(Op op, std::vector<std::shared_ptr<const Node>> args) {
  auto node = std::make_shared<Node>();
  node->op = op;
  node->args = std::move(args);
  return DebugExpr(std::move(node));
}

DebugExpr operator+(const DebugExpr& a, const DebugExpr& b) {
  return DebugExpr::make(DebugExpr::Op::Add, {a.node_, b.node_});
}
DebugExpr operator-(const DebugExpr& a, const DebugExpr& b) {
  return DebugExpr::make(DebugExpr::Op::Sub, {a.node_, b.node_});
}
DebugExpr operator*(const DebugExpr& a, const DebugExpr& b) {
  return DebugExpr::make(DebugExpr::Op::Mul, {a.node_, b.node_});
}
DebugExpr operator/(const DebugExpr& a, const DebugExpr& b) {
  return DebugExpr::make(DebugExpr::Op::Div, {a.node_, b.node_});
}
DebugExpr operator-(const DebugExpr& a) { return DebugExpr::make(DebugExpr::Op::Neg, {a.node_}); }
DebugExpr exp(const DebugExpr& a) { return DebugExpr::make(DebugExpr::Op::Exp, {a.node_}); }
DebugExpr tanh(const DebugExpr& a) { return DebugExpr::make(DebugExpr::Op::Tanh, {a.node_}); }
DebugExpr sigmoid(const DebugExpr& a) { return DebugExpr::make(DebugExpr::Op::Sigmoid, {a.node_}); }
DebugExpr min(const DebugExpr& a, const DebugExpr& b) {
  return DebugExpr::make(DebugExpr::Op::Min, {a.node_, b.node_});
}
DebugExpr max(const DebugExpr& a, const DebugExpr& b) {
  return DebugExpr::make(DebugExpr::Op::Max, {a.node_, b.node_});
}
DebugExpr select_gt(const DebugExpr& a, const DebugExpr& b, const DebugExpr& then,
                    const DebugExpr& otherwise) {
  return DebugExpr::make(DebugExpr::Op::SelectGt, {a.node_, b.node_, then.node_, otherwise.node_});
}

namespace api {

namespace {

using ir::scalar::NodeId;

// The application's view of a feature's settings.
class SettingsView final : public DebugSettings {
 public:
  explicit SettingsView(const debug::Settings& settings) : s_(settings) {}
  bool has(std::string_view key) const override { return s_.find(key) != nullptr; }
  bool get_bool(std::string_view key, bool fallback) const override {
    return s_.get_bool(key, fallback);
  }
  std::int64_t get_int(std::string_view key, std::int64_t fallback) const override {
    return s_.get_int(key, fallback);
  }
  double get_number(std::string_view key, double fallback) const override {
    return s_.get_number(key, fallback);
  }
  std::string get_string(std::string_view key, std::string_view fallback) const override {
    return s_.get_string(key, fallback);
  }

 private:
  const debug::Settings& s_;
};

debug::Route route_of(const DebugRoute& r) { return {r.enabled, r.next}; }

NodeId lower(const DebugExpr::Node& node, ir::scalar::Graph& g) {
  const auto arg = [&](size_t i) { return lower(*node.args.at(i), g); };
  switch (node.op) {
    case DebugExpr::Op::X:
      return g.var(0);
    case DebugExpr::Op::Const:
      return g.constant(node.value);
    case DebugExpr::Op::Add:
      return g.add(arg(0), arg(1));
    case DebugExpr::Op::Sub:
      return g.sub(arg(0), arg(1));
    case DebugExpr::Op::Mul:
      return g.mul(arg(0), arg(1));
    case DebugExpr::Op::Div:
      return g.div(arg(0), arg(1));
    case DebugExpr::Op::Neg:
      return g.neg(arg(0));
    case DebugExpr::Op::Exp:
      return g.exp(arg(0));
    case DebugExpr::Op::Tanh:
      return g.tanh(arg(0));
    case DebugExpr::Op::Sigmoid:
      return g.sigmoid(arg(0));
    case DebugExpr::Op::Min:
      return g.min(arg(0), arg(1));
    case DebugExpr::Op::Max:
      return g.max(arg(0), arg(1));
    case DebugExpr::Op::SelectGt:
      return g.select(ir::scalar::Cmp::Gt, arg(0), arg(1), arg(2), arg(3));
  }
  return g.var(0);
}

debug::KeyType key_type(DebugKey::Type t) {
  switch (t) {
    case DebugKey::Type::Bool:
      return debug::KeyType::Bool;
    case DebugKey::Type::Int:
      return debug::KeyType::Int;
    case DebugKey::Type::PositiveInt:
      return debug::KeyType::PositiveInt;
    case DebugKey::Type::Number:
      return debug::KeyType::Number;
    case DebugKey::Type::Choice:
      return debug::KeyType::Choice;
  }
  return debug::KeyType::Bool;
}

// One application feature as a config feature. The key names live in `names_` (KeySpec holds
// string_views).
class Adapter final : public debug::Feature {
 public:
  explicit Adapter(std::shared_ptr<const DebugFeature> feature) : f_(std::move(feature)) {
    spec_.name = f_->name();
    spec_.doc = f_->doc();
    spec_.selects_gemms = f_->selects_gemms();
    spec_.selects_tensors = f_->selects_tensors();
    spec_.modifies = f_->modifies();
    for (const DebugTensor t : f_->tensors())
      spec_.tensors.push_back(static_cast<debug::TensorKind>(t));
    keys_ = f_->keys();
    for (const DebugKey& k : keys_) {
      spec_.keys.push_back(debug::KeySpec{k.name, key_type(k.type), k.choices, k.doc, k.required});
    }
  }
  const debug::FeatureSpec& spec() const override { return spec_; }

  debug::Route inspect_tensor_enabled(const debug::CallContext& c, debug::TensorKind t,
                                      int64_t it) const override {
    return route_of(f_->inspect_tensor_enabled(c.layer, SettingsView(c.settings),
                                               static_cast<DebugTensor>(t), it));
  }
  debug::Route modify_tensor_enabled(const debug::CallContext& c, debug::GemmRole g,
                                     debug::TensorKind t, int64_t it) const override {
    return route_of(f_->modify_tensor_enabled(c.layer, SettingsView(c.settings),
                                              static_cast<DebugGemm>(g),
                                              static_cast<DebugTensor>(t), it));
  }
  debug::Route fp8_gemm_enabled(const debug::CallContext& c, debug::GemmRole g,
                                int64_t it) const override {
    return route_of(
        f_->fp8_gemm_enabled(c.layer, SettingsView(c.settings), static_cast<DebugGemm>(g), it));
  }
  std::optional<debug::Modification> modify_tensor(const debug::CallContext& c, debug::GemmRole g,
                                                   debug::TensorKind t, int64_t it) const override {
    const std::optional<DebugModification> m =
        f_->modify_tensor(c.layer, SettingsView(c.settings), static_cast<DebugGemm>(g),
                          static_cast<DebugTensor>(t), it);
    if (!m) return std::nullopt;
    switch (m->kind) {
      case DebugModification::Kind::FakeQuant: {
        const auto format = plan::parse<plan::DType>(m->format);
        if (!format || (*format != plan::DType::E4M3 && *format != plan::DType::E5M2)) {
          throw UsageError(fmt::format(
              "feature {}: modify_tensor's FakeQuant format must be e4m3 or e5m2, not '{}'",
              spec_.name, m->format));
        }
        return debug::Modification::fake_quant(*format);
      }
      case DebugModification::Kind::PerTensorScaling:
        return debug::Modification::per_tensor_scaling();
      case DebugModification::Kind::Pointwise:
        break;
    }
    ir::scalar::Graph graph;
    const NodeId value = lower(m->expr.node(), graph);
    return debug::Modification::pointwise(std::move(graph), value, m->description);
  }
  std::vector<debug::FeatureStat> inspect_tensor(const debug::CallContext& c, debug::TensorKind t,
                                                 const debug::InspectedTensor& tensor,
                                                 int64_t it) const override {
    auto copy = [](const debug::QuantizedView& q) {
      return DebugQuantizedTensor{q.shape,      q.values,    q.scale_inv, plan::name(q.format),
                                  q.block_rows, q.block_cols};
    };
    const DebugInspectedTensor view{tensor.shape, tensor.values, copy(tensor.rowwise),
                                    copy(tensor.columnwise)};
    std::vector<debug::FeatureStat> out;
    for (const DebugFeatureStat& s : f_->inspect_tensor(c.layer, SettingsView(c.settings),
                                                        static_cast<DebugTensor>(t), view, it)) {
      out.push_back({s.name, s.value});
    }
    return out;
  }

 private:
  std::shared_ptr<const DebugFeature> f_;
  debug::FeatureSpec spec_;
  std::vector<DebugKey> keys_;
};

}  // namespace

std::shared_ptr<const debug::FeatureRegistry> feature_registry(
    const std::vector<std::shared_ptr<const DebugFeature>>& features) {
  auto registry = std::make_shared<debug::FeatureRegistry>(debug::FeatureRegistry::with_builtins());
  for (const std::shared_ptr<const DebugFeature>& f : features) {
    if (!f) throw UsageError("CompileOptions::debug_features holds a null feature");
    const std::string name = f->name();
    if (name.empty()) throw UsageError("a DebugFeature's name() is empty");
    for (const DebugKey& k : f->keys()) {
      if (k.name == "enabled" || k.name == "tensors" || k.name == "tensors_struct" ||
          k.name == "gemms" || k.name == "gemms_struct" || k.name.empty()) {
        throw UsageError(fmt::format(
            "feature {}: key '{}' is the config schema's own (or empty); name it otherwise", name,
            k.name));
      }
    }
    try {
      registry->add(std::make_shared<Adapter>(f));
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("CompileOptions::debug_features: {}", e.what()));
    }
  }
  return registry;
}

}  // namespace api
}  // namespace opfuse
