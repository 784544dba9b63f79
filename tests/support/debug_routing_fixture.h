// A debug config's routing at one iteration, for tests that compile plan variants: owns the
// config (the routing points into it).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "debug_config/routing.h"

namespace opfuse::test {

struct RoutedConfig {
  SourceManager sources;
  std::unique_ptr<DiagnosticEngine> diags;
  std::optional<debug::DebugConfig> config;
  std::vector<debug::LayerBinding> bindings;
  debug::Routing routing;
};

// Reads `yaml`, binds it to `layers` (names; `quantized`: their recipe is FP8) and routes
// iteration `iteration`. Fails the current test on a config error.
// `registry`: the features the config may name (default: the built-ins).
inline std::unique_ptr<RoutedConfig> routed(
    const std::string& yaml, const std::vector<std::string>& layers, bool quantized,
    int64_t iteration = 0, std::shared_ptr<const debug::FeatureRegistry> registry = nullptr) {
  auto r = std::make_unique<RoutedConfig>();
  r->diags = std::make_unique<DiagnosticEngine>(r->sources);
  if (registry == nullptr)
    registry =
        std::make_shared<const debug::FeatureRegistry>(debug::FeatureRegistry::with_builtins());
  const FileId f = r->sources.add_buffer("debug.yaml", yaml);
  r->config = debug::read_debug_config(r->sources, f, registry, *r->diags);
  EXPECT_TRUE(r->config) << r->diags->format_all();
  if (!r->config) return r;
  std::vector<debug::LayerInfo> infos;
  for (const std::string& l : layers) infos.push_back({l, {}, quantized});
  r->bindings = debug::bind_layers(*r->config, infos, *r->diags);
  r->routing = debug::route(r->bindings, iteration);
  return r;
}

}  // namespace opfuse::test
