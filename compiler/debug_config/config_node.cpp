#include "debug_config/config_node.h"

#include <set>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

namespace opfuse::debug {

const ConfigNode* ConfigNode::find(std::string_view key) const {
  for (const Entry& e : entries)
    if (e.key == key) return &e.value;
  return nullptr;
}

std::string_view ConfigNode::kind_name() const {
  switch (kind) {
    case Kind::Null:
      return "nothing";
    case Kind::Scalar:
      return "a value";
    case Kind::List:
      return "a list";
    case Kind::Map:
      return "a map";
  }
  return "?";
}

std::optional<bool> yaml_bool(std::string_view text) {
  static constexpr std::string_view kTrue[] = {"true", "True", "TRUE", "yes", "Yes",
                                               "YES",  "on",   "On",   "ON"};
  static constexpr std::string_view kFalse[] = {"false", "False", "FALSE", "no", "No",
                                                "NO",    "off",   "Off",   "OFF"};
  for (std::string_view t : kTrue)
    if (t == text) return true;
  for (std::string_view f : kFalse)
    if (f == text) return false;
  return std::nullopt;
}

namespace {

// Nesting deeper than any config needs is refused rather than recursed into (hostile input).
constexpr int kMaxDepth = 32;

SourceLoc loc_of(FileId file, const YAML::Mark& mark) {
  if (mark.is_null()) return SourceLoc{file, 1, 1};
  return SourceLoc{file, uint32_t(mark.line + 1), uint32_t(mark.column + 1)};
}

ConfigNode convert(const YAML::Node& n, FileId file, int depth, DiagnosticEngine& diags) {
  ConfigNode out;
  out.loc = loc_of(file, n.Mark());
  if (depth > kMaxDepth) {
    diags.error(out.loc, fmt::format("nesting deeper than {} levels", kMaxDepth));
    return out;
  }
  switch (n.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      out.kind = ConfigNode::Kind::Null;
      break;
    case YAML::NodeType::Scalar:
      out.kind = ConfigNode::Kind::Scalar;
      out.scalar = n.Scalar();
      // yaml-cpp tags a quoted scalar "!" and a plain one "?".
      out.quoted = n.Tag() == "!";
      break;
    case YAML::NodeType::Sequence:
      out.kind = ConfigNode::Kind::List;
      for (const YAML::Node& item : n) out.items.push_back(convert(item, file, depth + 1, diags));
      break;
    case YAML::NodeType::Map: {
      out.kind = ConfigNode::Kind::Map;
      std::set<std::string> seen;
      for (const auto& kv : n) {
        const SourceLoc key_loc = loc_of(file, kv.first.Mark());
        if (!kv.first.IsScalar()) {
          diags.error(key_loc, "a map key must be a plain name");
          continue;
        }
        const std::string key = kv.first.Scalar();
        if (!seen.insert(key).second) {
          diags.error(key_loc, fmt::format("key '{}' given twice in one map", key),
                      "YAML would keep only one of them; merge the two");
          continue;
        }
        out.entries.push_back({key, key_loc, convert(kv.second, file, depth + 1, diags)});
      }
      break;
    }
  }
  return out;
}

}  // namespace

ConfigNode parse_yaml(const SourceManager& sources, FileId file, DiagnosticEngine& diags) {
  try {
    const YAML::Node root = YAML::Load(sources.text(file));
    return convert(root, file, 0, diags);
  } catch (const YAML::Exception& e) {
    diags.error(loc_of(file, e.mark), fmt::format("not valid YAML: {}", e.msg));
  }
  return ConfigNode{};
}

}  // namespace opfuse::debug
