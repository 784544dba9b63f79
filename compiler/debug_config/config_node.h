// The YAML document of a debug config as a tree that remembers where each value was written, so
// every later check can point at it (`debug.yaml:12:7: error: ...`). yaml-cpp stays inside
// config_node.cpp; everything else reads this tree.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/diagnostics.h"

namespace opfuse::debug {

struct ConfigNode {
  enum class Kind { Null, Scalar, List, Map };
  Kind kind = Kind::Null;
  SourceLoc loc;
  std::string scalar;             // Scalar: the text as written (quotes removed)
  bool quoted = false;            // Scalar: written in quotes (so `"1"` is a string, not a number)
  std::vector<ConfigNode> items;  // List
  // Map, in file order; each key with the location of the key itself.
  struct Entry;
  std::vector<Entry> entries;

  const ConfigNode* find(std::string_view key) const;
  std::string_view kind_name() const;  // "a list", "a map", "a value", "nothing"
};

struct ConfigNode::Entry {
  std::string key;
  SourceLoc key_loc;
  ConfigNode value;
};

// A plain scalar as a boolean the way TE's YAML reader (YAML 1.1) takes it: true/false, yes/no and
// on/off in lower, capitalized or upper case. nullopt for anything else.
std::optional<bool> yaml_bool(std::string_view text);

// Parses YAML text registered in `sources` as `file`. A syntax error (or a duplicate map key, an
// anchor or alias, a non-scalar key) is reported through `diags` and gives a Null root.
ConfigNode parse_yaml(const SourceManager& sources, FileId file, DiagnosticEngine& diags);

}  // namespace opfuse::debug
