#include "debug_config/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "support/spelling.h"

namespace opfuse::debug {

bool LayerSelector::matches(std::string_view layer) const {
  if (std::find(exact_names.begin(), exact_names.end(), layer) != exact_names.end()) return true;
  if (regex && std::regex_search(layer.begin(), layer.end(), *regex)) return true;
  return std::any_of(types.begin(), types.end(),
                     [&](const std::string& t) { return layer.find(t) != std::string_view::npos; });
}

const Settings* FeatureConfig::find(std::optional<GemmRole> gemm,
                                    std::optional<TensorKind> tensor) const {
  for (const FeatureScope& s : scopes) {
    if (s.gemm && s.gemm != gemm) continue;
    if (s.tensor && s.tensor != tensor) continue;
    return &s.settings;
  }
  return nullptr;
}

namespace {

using Kind = ConfigNode::Kind;

std::string quoted_list(const std::vector<std::string>& names) {
  std::vector<std::string> q;
  q.reserve(names.size());
  for (const std::string& n : names) q.push_back(fmt::format("'{}'", n));
  return fmt::format("{}", fmt::join(q, ", "));
}

template <typename Enum>
std::vector<std::string> enum_names() {
  std::vector<std::string> out;
  for (const Enum v : plan::all_values<Enum>()) out.emplace_back(plan::name(v));
  return out;
}

std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates) {
  const std::string near = closest_spelling(name, candidates);
  return near.empty() ? fmt::format("expected one of {}", quoted_list(candidates))
                      : fmt::format("did you mean '{}'?", near);
}

class Reader {
 public:
  Reader(DiagnosticEngine& diags, const FeatureRegistry& registry)
      : diags_(diags), registry_(registry) {}

  std::vector<ConfigSection> sections(const ConfigNode& root) {
    std::vector<ConfigSection> out;
    if (root.kind == Kind::Null) return out;  // an empty file: no sections
    if (root.kind != Kind::Map) {
      error(root.loc, fmt::format("a debug config is a map of sections, not {}", root.kind_name()),
            "write `section_name:` with `enabled`, `layers` and `transformer_engine` under it");
      return out;
    }
    for (const ConfigNode::Entry& e : root.entries) {
      if (auto s = section(e)) out.push_back(std::move(*s));
    }
    return out;
  }

 private:
  void error(SourceLoc loc, std::string message, std::string hint = {}) {
    // One message per place: a flat key is checked once per GEMM/tensor it applies to.
    if (reported_.insert({loc.line, loc.col, message}).second) {
      diags_.error(loc, std::move(message), std::move(hint));
    }
  }

  std::optional<bool> as_bool(const ConfigNode& n, std::string_view what) {
    if (n.kind == Kind::Scalar && !n.quoted) {
      if (const auto b = yaml_bool(n.scalar)) return b;
    }
    error(n.loc, fmt::format("'{}' must be true or false, not {}", what, describe(n)));
    return std::nullopt;
  }

  std::optional<int64_t> as_int(const ConfigNode& n, std::string_view what, int64_t min) {
    if (n.kind == Kind::Scalar && !n.quoted) {
      int64_t v = 0;
      const char* first = n.scalar.data();
      const char* last = first + n.scalar.size();
      const auto [end, ec] = std::from_chars(first, last, v);
      if (ec == std::errc() && end == last) {
        if (v >= min) return v;
        error(n.loc, fmt::format("'{}' must be at least {}, not {}", what, min, v));
        return std::nullopt;
      }
    }
    error(n.loc, fmt::format("'{}' must be an integer, not {}", what, describe(n)));
    return std::nullopt;
  }

  std::optional<std::string> as_string(const ConfigNode& n, std::string_view what) {
    if (n.kind == Kind::Scalar && !n.scalar.empty()) return n.scalar;
    error(n.loc, fmt::format("'{}' must be a name, not {}", what, describe(n)));
    return std::nullopt;
  }

  // A list of names; a single name is accepted as a list of one (TE accepts both).
  std::optional<std::vector<std::pair<std::string, SourceLoc>>> as_names(const ConfigNode& n,
                                                                         std::string_view what) {
    std::vector<std::pair<std::string, SourceLoc>> out;
    if (n.kind == Kind::Scalar) {
      out.emplace_back(n.scalar, n.loc);
      return out;
    }
    if (n.kind != Kind::List) {
      error(n.loc, fmt::format("'{}' must be a list of names, not {}", what, describe(n)));
      return std::nullopt;
    }
    bool ok = true;
    for (const ConfigNode& item : n.items) {
      if (auto s = as_string(item, what)) {
        out.emplace_back(*s, item.loc);
      } else {
        ok = false;
      }
    }
    if (!ok) return std::nullopt;
    return out;
  }

  static std::string describe(const ConfigNode& n) {
    if (n.kind == Kind::Scalar) return fmt::format("'{}'", n.scalar);
    return std::string(n.kind_name());
  }

  std::optional<ConfigSection> section(const ConfigNode::Entry& e) {
    ConfigSection s;
    s.name = e.key;
    s.loc = e.key_loc;
    const ConfigNode& body = e.value;
    if (body.kind != Kind::Map) {
      error(body.kind == Kind::Null ? e.key_loc : body.loc,
            fmt::format("section '{}' must be a map, not {}", e.key, body.kind_name()),
            "give it `enabled`, `layers` and `transformer_engine`");
      return std::nullopt;
    }
    // A misspelled key is reported once, not again as the key that is missing.
    bool has_layers = false, has_features = false, unknown = false;
    for (const ConfigNode::Entry& k : body.entries) {
      if (k.key == "enabled") {
        if (auto b = as_bool(k.value, "enabled")) s.enabled = *b;
      } else if (k.key == "layers") {
        has_layers = true;
        s.layers = layers(k);
      } else if (k.key == "transformer_engine") {
        has_features = true;
        features(k, s.features);
      } else {
        unknown = true;
        error(k.key_loc, fmt::format("unknown key '{}' in section '{}'", k.key, s.name),
              did_you_mean(k.key, {"enabled", "layers", "transformer_engine"}));
      }
    }
    check_modifiers(s);
    if (!has_layers && !unknown) {
      error(e.key_loc, fmt::format("section '{}' selects no layers", s.name),
            "add `layers:` with `layer_name_regex_pattern`, `layer_types` or "
            "`exact_layer_names`");
    }
    if (!has_features && !unknown) {
      error(e.key_loc, fmt::format("section '{}' has no `transformer_engine` block", s.name),
            "list the features under `transformer_engine:`");
    }
    return s;
  }

  // One feature per modified GEMM operand (TE's rule): reported at the second feature.
  void check_modifiers(const ConfigSection& s) {
    std::map<std::pair<GemmRole, TensorKind>, const FeatureConfig*> owner;
    for (const FeatureConfig& f : s.features) {
      if (!f.enabled || !f.feature->spec().modifies) continue;
      for (const FeatureScope& scope : f.scopes) {
        if (!scope.gemm || !scope.tensor) continue;
        auto [it, added] = owner.try_emplace({*scope.gemm, *scope.tensor}, &f);
        if (!added && it->second != &f) {
          error(f.loc,
                fmt::format("{} and {} both modify the {} of the {} GEMM", it->second->name, f.name,
                            plan::name(*scope.tensor), plan::name(*scope.gemm)),
                "a GEMM operand can be modified by one feature; drop it from one of them");
        }
      }
    }
  }

  LayerSelector layers(const ConfigNode::Entry& e) {
    LayerSelector sel;
    sel.loc = e.key_loc;
    const ConfigNode& n = e.value;
    if (n.kind != Kind::Map) {
      error(n.kind == Kind::Null ? e.key_loc : n.loc,
            fmt::format("'layers' must be a map, not {}", n.kind_name()),
            "use `layer_name_regex_pattern`, `layer_types` or `exact_layer_names`");
      return sel;
    }
    for (const ConfigNode::Entry& k : n.entries) {
      if (k.key == "layer_name_regex_pattern") {
        if (auto p = as_string(k.value, k.key)) {
          try {
            sel.regex = std::make_shared<const std::regex>(*p, std::regex::ECMAScript);
            sel.pattern = *p;
          } catch (const std::regex_error& re) {
            error(k.value.loc, fmt::format("bad regular expression '{}': {}", *p, re.what()));
          }
        }
      } else if (k.key == "layer_types" || k.key == "exact_layer_names") {
        if (auto names = as_names(k.value, k.key)) {
          auto& out = k.key == "layer_types" ? sel.types : sel.exact_names;
          for (auto& [name, loc] : *names) out.push_back(name);
        }
      } else {
        error(
            k.key_loc, fmt::format("unknown key '{}' in 'layers'", k.key),
            did_you_mean(k.key, {"layer_name_regex_pattern", "layer_types", "exact_layer_names"}));
      }
    }
    if (!sel.pattern && sel.types.empty() && sel.exact_names.empty() && !n.entries.empty()) {
      return sel;  // every key was wrong: reported above
    }
    if (n.entries.empty()) {
      error(e.key_loc, "'layers' selects nothing",
            "use `layer_name_regex_pattern`, `layer_types` or `exact_layer_names`");
    }
    return sel;
  }

  void features(const ConfigNode::Entry& e, std::vector<FeatureConfig>& out) {
    const ConfigNode& n = e.value;
    if (n.kind != Kind::Map) {
      error(n.kind == Kind::Null ? e.key_loc : n.loc,
            fmt::format("'transformer_engine' must be a map of features, not {}", n.kind_name()));
      return;
    }
    for (const ConfigNode::Entry& f : n.entries) {
      const Feature* feature = registry_.find(f.key);
      if (!feature) {
        error(f.key_loc, fmt::format("unknown feature '{}'", f.key),
              did_you_mean(f.key, registry_.names()));
        continue;
      }
      if (auto fc = feature_config(f, *feature)) out.push_back(std::move(*fc));
    }
  }

  // Checks one feature key's value against its spec.
  void check_key(const FeatureSpec& spec, const KeySpec& key, const ConfigNode& v) {
    switch (key.type) {
      case KeyType::Bool:
        as_bool(v, key.name);
        break;
      case KeyType::Int:
        as_int(v, key.name, 0);
        break;
      case KeyType::PositiveInt:
        as_int(v, key.name, 1);
        break;
      case KeyType::Number: {
        char* end = nullptr;
        const double d = v.kind == Kind::Scalar && !v.quoted && !v.scalar.empty()
                             ? std::strtod(v.scalar.c_str(), &end)
                             : 0.0;
        if (end != v.scalar.c_str() + v.scalar.size() || end == nullptr || !std::isfinite(d))
          error(v.loc, fmt::format("'{}' must be a finite number, not {}", key.name, describe(v)));
        break;
      }
      case KeyType::Choice:
        if (auto s = as_string(v, key.name)) {
          if (std::find(key.choices.begin(), key.choices.end(), *s) == key.choices.end()) {
            error(v.loc, fmt::format("'{}' cannot be '{}' for {}", key.name, *s, spec.name),
                  did_you_mean(*s, key.choices));
          }
        }
        break;
      case KeyType::Stats:
        if (v.kind != Kind::List) {
          error(v.loc,
                fmt::format("'{}' must be a list of statistics, not {}", key.name, describe(v)));
          break;
        }
        for (const ConfigNode& item : v.items) {
          std::string hint;
          const std::string why = spec.check_stat ? spec.check_stat(item, hint) : std::string();
          if (!why.empty()) error(item.loc, why, hint);
        }
        break;
      case KeyType::IntervalList:
        if (v.kind != Kind::List) {
          error(v.loc, fmt::format("'{}' must be a list of [start, end] pairs, not {}", key.name,
                                   describe(v)));
          break;
        }
        for (const ConfigNode& item : v.items) {
          if (item.kind != Kind::List || item.items.size() != 2) {
            error(item.loc, fmt::format("each entry of '{}' must be [start, end]", key.name));
            continue;
          }
          const auto s = as_int(item.items[0], "start", 0);
          const auto t = as_int(item.items[1], "end", 0);
          if (s && t && *s > *t) {
            error(item.loc, fmt::format("interval [{}, {}] ends before it starts", *s, *t));
          }
        }
        break;
    }
  }

  // Splits a map's entries into selection keys (returned) and feature keys (checked, added to
  // `settings`).
  void take_keys(const FeatureSpec& spec, const ConfigNode& map, Settings& settings,
                 const std::set<std::string_view>& selection_keys) {
    for (const ConfigNode::Entry& k : map.entries) {
      if (selection_keys.count(k.key)) continue;
      const auto it = std::find_if(spec.keys.begin(), spec.keys.end(),
                                   [&](const KeySpec& s) { return s.name == k.key; });
      if (it == spec.keys.end()) {
        std::vector<std::string> known;
        for (const KeySpec& s : spec.keys) known.emplace_back(s.name);
        for (std::string_view s : selection_keys) known.emplace_back(s);
        std::sort(known.begin(), known.end());
        error(k.key_loc, fmt::format("{} has no key '{}'", spec.name, k.key),
              known.empty() ? fmt::format("{} takes no keys", spec.name)
                            : did_you_mean(k.key, known));
        continue;
      }
      check_key(spec, *it, k.value);
      settings.set(k.key, &k.value);
    }
  }

  // The tensors a map selects (tensors / tensors_struct), each with its own keys laid over `base`.
  std::optional<std::vector<std::pair<TensorKind, Settings>>> tensors(
      const FeatureSpec& spec, const ConfigNode& map, const Settings& base,
      std::optional<GemmRole> gemm) {
    std::vector<std::pair<TensorKind, Settings>> out;
    std::set<TensorKind> seen;
    bool any = false;
    auto add = [&](const std::string& name, SourceLoc loc, const Settings& s) {
      const auto t = plan::parse<TensorKind>(name);
      const std::vector<TensorKind>& allowed = spec.tensors;
      if (!t ||
          (!allowed.empty() && std::find(allowed.begin(), allowed.end(), *t) == allowed.end())) {
        static constexpr auto kAll = plan::all_values<TensorKind>();
        std::vector<std::string> names;
        for (const TensorKind k :
             allowed.empty() ? std::vector<TensorKind>(kAll.begin(), kAll.end()) : allowed) {
          names.emplace_back(plan::name(k));
        }
        error(loc,
              t ? fmt::format("{} does not apply to tensor '{}'", spec.name, name)
                : fmt::format("unknown tensor '{}'", name),
              did_you_mean(name, names));
        return;
      }
      if (gemm) {
        const auto ops = operands_of(*gemm);
        if (std::find(ops.begin(), ops.end(), *t) == ops.end()) {
          error(
              loc,
              fmt::format("tensor '{}' is not an operand of the {} GEMM", name, plan::name(*gemm)),
              fmt::format("{} reads {} and {}", plan::name(*gemm), plan::name(ops[0]),
                          plan::name(ops[1])));
          return;
        }
      }
      if (!seen.insert(*t).second) {
        error(loc, fmt::format("tensor '{}' selected twice", name));
        return;
      }
      out.emplace_back(*t, s);
    };
    if (const ConfigNode* list = map.find("tensors")) {
      any = true;
      if (auto names = as_names(*list, "tensors")) {
        for (const auto& [name, loc] : *names) add(name, loc, base);
      }
    }
    if (const ConfigNode* structs = map.find("tensors_struct")) {
      any = true;
      if (structs->kind != Kind::List) {
        error(structs->loc,
              fmt::format("'tensors_struct' must be a list of maps, not {}", structs->kind_name()));
      } else {
        for (const ConfigNode& entry : structs->items) {
          if (entry.kind != Kind::Map || !entry.find("tensor")) {
            error(entry.loc, "each 'tensors_struct' entry must be a map with a 'tensor' key",
                  "e.g. `- tensor: activation`");
            continue;
          }
          Settings s = base;
          take_keys(spec, entry, s, {"tensor"});
          if (auto name = as_string(*entry.find("tensor"), "tensor")) {
            add(*name, entry.find("tensor")->loc, s);
          }
        }
      }
    }
    if (!any) return std::nullopt;
    return out;
  }

  std::optional<FeatureConfig> feature_config(const ConfigNode::Entry& f, const Feature& feature) {
    const FeatureSpec& spec = feature.spec();
    FeatureConfig fc;
    fc.feature = &feature;
    fc.name = f.key;
    fc.loc = f.key_loc;
    static const ConfigNode kEmpty{ConfigNode::Kind::Map, {}, {}, false, {}, {}};
    const ConfigNode& body = f.value.kind == Kind::Null ? kEmpty : f.value;
    if (body.kind != Kind::Map) {
      error(body.loc,
            fmt::format("feature '{}' must be a map of keys, not {}", f.key, body.kind_name()));
      return std::nullopt;
    }
    std::set<std::string_view> selection = {"enabled"};
    if (spec.selects_tensors) selection.insert({"tensors", "tensors_struct"});
    if (spec.selects_gemms) selection.insert({"gemms", "gemms_struct"});
    if (const ConfigNode* en = body.find("enabled")) {
      if (auto b = as_bool(*en, "enabled")) fc.enabled = *b;
    }
    Settings base;
    take_keys(spec, body, base, selection);

    if (spec.selects_gemms) {
      std::vector<std::pair<GemmRole, const ConfigNode*>> gemms;  // with the struct entry
      std::set<GemmRole> seen;
      auto add_gemm = [&](const std::string& name, SourceLoc loc, const ConfigNode* entry) {
        const auto g = plan::parse<GemmRole>(name);
        if (!g) {
          error(loc, fmt::format("unknown GEMM '{}'", name),
                did_you_mean(name, enum_names<GemmRole>()));
        } else if (!seen.insert(*g).second) {
          error(loc, fmt::format("GEMM '{}' selected twice", name));
        } else {
          gemms.emplace_back(*g, entry);
        }
      };
      if (const ConfigNode* list = body.find("gemms")) {
        if (auto names = as_names(*list, "gemms")) {
          for (const auto& [name, loc] : *names) add_gemm(name, loc, nullptr);
        }
      }
      if (const ConfigNode* structs = body.find("gemms_struct")) {
        if (structs->kind != Kind::List) {
          error(structs->loc,
                fmt::format("'gemms_struct' must be a list of maps, not {}", structs->kind_name()));
        } else {
          for (const ConfigNode& entry : structs->items) {
            if (entry.kind != Kind::Map || !entry.find("gemm")) {
              error(entry.loc, "each 'gemms_struct' entry must be a map with a 'gemm' key",
                    "e.g. `- gemm: fprop`");
              continue;
            }
            if (auto name = as_string(*entry.find("gemm"), "gemm")) {
              add_gemm(*name, entry.find("gemm")->loc, &entry);
            }
          }
        }
      }
      if (!body.find("gemms") && !body.find("gemms_struct")) {
        error(f.key_loc, fmt::format("{} selects no GEMMs", spec.name),
              "add `gemms: [fprop, dgrad, wgrad]` (or some of them) or `gemms_struct`");
      }
      for (const auto& [gemm, entry] : gemms) {
        Settings s = base;
        if (entry) {
          std::set<std::string_view> inner = {"gemm"};
          if (spec.selects_tensors) inner.insert({"tensors", "tensors_struct"});
          take_keys(spec, *entry, s, inner);
        }
        if (!spec.selects_tensors) {
          fc.scopes.push_back({gemm, std::nullopt, s});
          continue;
        }
        auto ts = entry ? tensors(spec, *entry, s, gemm) : std::nullopt;
        if (!ts) ts = tensors(spec, body, s, gemm);
        if (!ts) {
          error(entry ? entry->loc : f.key_loc,
                fmt::format("{} selects no tensors for the {} GEMM", spec.name, plan::name(gemm)),
                "add `tensors: [...]` to the feature or to the GEMM's gemms_struct entry");
          continue;
        }
        for (auto& [t, ts_settings] : *ts) fc.scopes.push_back({gemm, t, std::move(ts_settings)});
      }
    } else if (spec.selects_tensors) {
      auto ts = tensors(spec, body, base, std::nullopt);
      if (!ts) {
        error(f.key_loc, fmt::format("{} selects no tensors", spec.name),
              "add `tensors: [...]` or `tensors_struct`");
      } else {
        for (auto& [t, s] : *ts) fc.scopes.push_back({std::nullopt, t, std::move(s)});
      }
    } else {
      fc.scopes.push_back({std::nullopt, std::nullopt, base});
    }
    for (const FeatureScope& scope : fc.scopes) {
      const ConfigNode* start = scope.settings.find("start_step");
      const ConfigNode* end = scope.settings.find("end_step");
      if (start && end &&
          scope.settings.get_int("end_step", 0) < scope.settings.get_int("start_step", 0)) {
        error(end->loc,
              fmt::format("end_step {} is before start_step {}", end->scalar, start->scalar));
      }
      for (const KeySpec& key : spec.keys) {
        if (key.required && !scope.settings.find(key.name)) {
          error(f.key_loc, fmt::format("{} needs '{}'", spec.name, key.name),
                scope.tensor ? fmt::format("missing for tensor '{}'", plan::name(*scope.tensor))
                             : std::string());
        }
      }
    }
    return fc;
  }

  DiagnosticEngine& diags_;
  const FeatureRegistry& registry_;
  std::set<std::tuple<uint32_t, uint32_t, std::string>> reported_;
};

}  // namespace

std::optional<DebugConfig> read_debug_config(const SourceManager& sources, FileId file,
                                             const std::shared_ptr<const FeatureRegistry>& registry,
                                             DiagnosticEngine& diags) {
  const size_t errors_before = diags.error_count();
  DebugConfig config;
  config.file = file;
  config.registry = registry;
  auto root = std::make_shared<ConfigNode>(parse_yaml(sources, file, diags));
  config.root = root;
  if (diags.error_count() == errors_before) {
    config.sections = Reader(diags, *registry).sections(*root);
  }
  if (diags.error_count() != errors_before) return std::nullopt;
  return config;
}

std::optional<DebugConfig> load_debug_config(const std::string& path, SourceManager& sources,
                                             const std::shared_ptr<const FeatureRegistry>& registry,
                                             DiagnosticEngine& diags) {
  std::string why;
  const FileId file = sources.add_file(path, &why);
  if (file == kNoFile) {
    diags.error(SourceLoc{}, fmt::format("cannot read debug config '{}': {}", path, why));
    return std::nullopt;
  }
  return read_debug_config(sources, file, registry, diags);
}

}  // namespace opfuse::debug
