// A precision-debug config (docs/debugging.md, "The config file"): TE's config.yaml schema read
// into sections, each selecting layers and configuring features. Reading checks everything that
// does not depend on the program (YAML, feature names and keys, value types, regexes, GEMM and
// tensor names); matching against a program's layers (debug_config/routing.h) checks the rest.
#pragma once

#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "debug_config/config_node.h"
#include "debug_config/feature.h"

namespace opfuse::debug {

// Which layers a section applies to (TE's `layers:` block). Precedence as TE: exact names first,
// then the regex (searched anywhere in the name), then the types (substrings of the name).
struct LayerSelector {
  std::vector<std::string> exact_names;
  std::optional<std::string> pattern;
  std::shared_ptr<const std::regex> regex;  // compiled `pattern`
  std::vector<std::string> types;
  SourceLoc loc;  // the `layers:` key

  bool matches(std::string_view layer) const;
};

// Where a feature's settings apply: one GEMM and/or one tensor (nullopt: the feature does not
// select by it), with the keys that hold there.
struct FeatureScope {
  std::optional<GemmRole> gemm;
  std::optional<TensorKind> tensor;
  Settings settings;
};

struct FeatureConfig {
  const Feature* feature = nullptr;  // from the registry
  std::string name;                  // as written
  bool enabled = true;
  SourceLoc loc;
  std::vector<FeatureScope> scopes;  // a feature selecting neither: one scope for the layer

  // The settings for (gemm, tensor); nullptr where the feature does not apply.
  const Settings* find(std::optional<GemmRole> gemm, std::optional<TensorKind> tensor) const;
};

struct ConfigSection {
  std::string name;
  bool enabled = true;
  SourceLoc loc;
  LayerSelector layers;
  std::vector<FeatureConfig> features;
};

struct DebugConfig {
  // The parsed tree that the settings point into (its text stays in the caller's SourceManager).
  std::shared_ptr<const ConfigNode> root;
  FileId file = kNoFile;
  std::vector<ConfigSection> sections;
  std::shared_ptr<const FeatureRegistry> registry;
};

// Reads the config in `file` of `sources`. Errors and warnings go to `diags` (which must be over
// `sources`); returns nullopt if there was an error.
std::optional<DebugConfig> read_debug_config(const SourceManager& sources, FileId file,
                                             const std::shared_ptr<const FeatureRegistry>& registry,
                                             DiagnosticEngine& diags);

// Adds the file at `path` to `sources` and reads it; an unreadable file is reported (as an error
// without location) and gives nullopt.
std::optional<DebugConfig> load_debug_config(const std::string& path, SourceManager& sources,
                                             const std::shared_ptr<const FeatureRegistry>& registry,
                                             DiagnosticEngine& diags);

}  // namespace opfuse::debug
