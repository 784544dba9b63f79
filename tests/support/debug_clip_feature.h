// A C++ precision-debug feature for tests (docs/debugging.md, "C++ features"): "Clip" replaces the
// GEMM operands it selects by clip(x, -c, c) (key `c`, default 1), a pointwise modification.
#pragma once

#include <fmt/format.h>

#include <optional>

#include "debug_config/feature.h"

namespace opfuse::test {

// The test's C++ feature: clips the selected GEMM operands to [-c, c] (key `c`, default 1).
class Clip final : public debug::Feature {
 public:
  Clip() {
    spec_.name = "Clip";
    spec_.doc = "clip the listed GEMM operands to [-c, c]";
    spec_.selects_gemms = true;
    spec_.selects_tensors = true;
    spec_.modifies = true;
    spec_.tensors = {debug::TensorKind::Activation, debug::TensorKind::Weight,
                     debug::TensorKind::Gradient};
    spec_.keys.push_back({"c", debug::KeyType::Number, {}, "the bound"});
  }
  const debug::FeatureSpec& spec() const override { return spec_; }
  debug::Route modify_tensor_enabled(const debug::CallContext&, debug::GemmRole, debug::TensorKind,
                                     int64_t) const override {
    return {true, debug::kNever};
  }
  std::optional<debug::Modification> modify_tensor(const debug::CallContext& call, debug::GemmRole,
                                                   debug::TensorKind, int64_t) const override {
    const double c = call.settings.get_number("c", 1.0);
    ir::scalar::Graph g;
    const ir::scalar::NodeId x = g.var(0);
    const ir::scalar::NodeId clipped = g.min(g.max(x, g.constant(-c)), g.constant(c));
    return debug::Modification::pointwise(std::move(g), clipped,
                                          fmt::format("clip to [-{}, {}]", c, c));
  }

 private:
  debug::FeatureSpec spec_;
};

}  // namespace opfuse::test
