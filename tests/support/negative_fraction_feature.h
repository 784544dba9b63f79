// A C++ precision-debug feature for tests (docs/debugging.md, "C++ features"): NegativeFraction
// logs `negative_fraction`, the fraction of a tensor's values below zero, through TE's
// inspect_tensor call, on a cadence. Plus the registry and config reading the tests use with it.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "debug_config/config.h"
#include "debug_config/routing.h"

namespace opfuse::test {

class NegativeFraction final : public debug::Feature {
 public:
  NegativeFraction() {
    spec_.name = "NegativeFraction";
    spec_.doc = "the fraction of a tensor's values below zero";
    spec_.selects_tensors = true;
    spec_.keys = debug::cadence_keys();
  }
  const debug::FeatureSpec& spec() const override { return spec_; }
  debug::Route inspect_tensor_enabled(const debug::CallContext& c, debug::TensorKind,
                                      int64_t it) const override {
    return c.settings.cadence().route(it);
  }
  std::vector<debug::FeatureStat> inspect_tensor(const debug::CallContext&, debug::TensorKind,
                                                 const debug::InspectedTensor& t,
                                                 int64_t) const override {
    double negative = 0;
    for (float v : t.values) negative += v < 0 ? 1 : 0;
    return {{"negative_fraction", t.values.empty() ? 0.0 : negative / double(t.values.size())}};
  }

 private:
  debug::FeatureSpec spec_;
};

// The built-in features and NegativeFraction.
inline std::shared_ptr<const debug::FeatureRegistry> registry_with_negative_fraction() {
  auto r = std::make_shared<debug::FeatureRegistry>(debug::FeatureRegistry::with_builtins());
  r->add(std::make_shared<NegativeFraction>());
  return r;
}

// A config read with that registry, its layers bound (`quantized`: their recipe is FP8).
struct CustomConfig {
  SourceManager sources;
  std::unique_ptr<DiagnosticEngine> diags;
  std::optional<debug::DebugConfig> config;
  std::vector<debug::LayerBinding> bindings;
};

inline std::unique_ptr<CustomConfig> read_custom_config(const std::string& yaml,
                                                        const std::vector<std::string>& layers,
                                                        bool quantized) {
  auto r = std::make_unique<CustomConfig>();
  r->diags = std::make_unique<DiagnosticEngine>(r->sources);
  const FileId f = r->sources.add_buffer("debug.yaml", yaml);
  r->config = debug::read_debug_config(r->sources, f, registry_with_negative_fraction(), *r->diags);
  EXPECT_TRUE(r->config) << r->diags->format_all();
  if (!r->config) return r;
  std::vector<debug::LayerInfo> infos;
  for (const std::string& l : layers) infos.push_back({l, {}, quantized});
  r->bindings = debug::bind_layers(*r->config, infos, *r->diags);
  return r;
}

}  // namespace opfuse::test
