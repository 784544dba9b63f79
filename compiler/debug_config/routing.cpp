#include "debug_config/routing.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "support/spelling.h"

namespace opfuse::debug {

std::string_view operand_action_name(OperandAction a) {
  switch (a) {
    case OperandAction::Quantize:
      return "quantize";
    case OperandAction::HighPrecision:
      return "high precision";
    case OperandAction::Modify:
      return "modified";
  }
  return "?";
}

std::vector<LayerInfo> program_layers(const ir::Program& program) {
  std::vector<LayerInfo> out;
  for (const ir::Sequence& seq : program.sequences) {
    for (const ir::Operation& op : seq.ops) {
      if (op.kind == ir::OpKind::Linear && op.phase == ir::Phase::Forward) {
        out.push_back(
            {op.instance, op.loc, seq.recipe.is_fp8() && !ir::linear_high_precision(op.attrs)});
      }
    }
  }
  return out;
}

std::vector<LayerBinding> bind_layers(const DebugConfig& config,
                                      const std::vector<LayerInfo>& layers,
                                      DiagnosticEngine& diags) {
  std::vector<LayerBinding> out;
  std::vector<std::string> names;
  for (const LayerInfo& l : layers) {
    out.push_back({l.name, l.quantized, nullptr});
    names.push_back(l.name);
  }
  for (const ConfigSection& s : config.sections) {
    if (!s.enabled) continue;
    bool any = false;
    for (LayerBinding& b : out) {
      if (!s.layers.matches(b.layer)) continue;
      any = true;
      if (b.section) {
        diags.error(s.layers.loc,
                    fmt::format("layer '{}' is matched by sections '{}' and '{}'", b.layer,
                                b.section->name, s.name),
                    "a layer may be matched by one enabled section only; narrow one of them");
        continue;
      }
      b.section = &s;
    }
    if (!any) {
      std::vector<std::string> near;
      for (const std::string& n : s.layers.exact_names) {
        const std::string c = closest_spelling(n, names);
        if (!c.empty()) near.push_back(fmt::format("'{}' for '{}'", c, n));
      }
      diags.warning(s.layers.loc,
                    fmt::format("section '{}' matches no layer of the program", s.name),
                    near.empty() ? fmt::format("its layers are {}", fmt::join(names, ", "))
                                 : fmt::format("did you mean {}?", fmt::join(near, ", ")));
    }
  }
  return out;
}

bool LayerRouting::active() const {
  for (const auto& i : inspectors)
    if (!i.empty()) return true;
  for (const GemmRouting& g : gemms) {
    if (recipe_quantized && !g.quantized) return true;
    for (const OperandAction a : g.operands)
      if (a == OperandAction::Modify) return true;
  }
  return false;
}

namespace {

constexpr std::array<GemmRole, 3> kGemms = {GemmRole::Fprop, GemmRole::Dgrad, GemmRole::Wgrad};

void take(int64_t& next, const Route& r) { next = std::min(next, r.next); }

}  // namespace

Routing route(const std::vector<LayerBinding>& bindings, int64_t iteration) {
  Routing out;
  out.iteration = iteration;
  for (const LayerBinding& b : bindings) {
    LayerRouting lr;
    lr.layer = b.layer;
    lr.section = b.section;
    lr.recipe_quantized = b.quantized;
    const bool recipe_quantized = b.quantized;
    for (size_t gi = 0; gi < kGemms.size(); ++gi) {
      GemmRouting& g = lr.gemms[gi];
      g.quantized = recipe_quantized;
      g.operands = {recipe_quantized ? OperandAction::Quantize : OperandAction::HighPrecision,
                    recipe_quantized ? OperandAction::Quantize : OperandAction::HighPrecision};
    }
    if (b.section) {
      for (const FeatureConfig& f : b.section->features) {
        if (!f.enabled) continue;
        for (size_t gi = 0; gi < kGemms.size(); ++gi) {
          const GemmRole gemm = kGemms[gi];
          GemmRouting& g = lr.gemms[gi];
          // fp8_gemm_enabled: the GEMM leaves quantization if any feature says so.
          if (const Settings* s = f.find(gemm, std::nullopt)) {
            const Route r = f.feature->fp8_gemm_enabled({b.layer, *s}, gemm, iteration);
            take(out.next_change, r);
            if (!r.enabled) g.quantized = false;
          } else if (f.feature->spec().selects_gemms && f.feature->spec().selects_tensors) {
            // Features selecting (GEMM, tensor) pairs answer for the GEMM when any pair matches.
            for (const TensorKind t : operands_of(gemm)) {
              if (const Settings* st = f.find(gemm, t)) {
                const Route r = f.feature->fp8_gemm_enabled({b.layer, *st}, gemm, iteration);
                take(out.next_change, r);
                if (!r.enabled) g.quantized = false;
                break;
              }
            }
          }
          const auto ops = operands_of(gemm);
          for (size_t k = 0; k < 2; ++k) {
            const Settings* s = f.find(gemm, ops[k]);
            if (!s) continue;
            const Route r =
                f.feature->modify_tensor_enabled({b.layer, *s}, gemm, ops[k], iteration);
            take(out.next_change, r);
            if (!r.enabled) continue;
            if (g.modifiers[k]) {
              out.conflicts.push_back(fmt::format(
                  "layer '{}': {} and {} both modify the {} of the {} GEMM (one feature may)",
                  b.layer, g.modifiers[k]->name, f.name, plan::name(ops[k]), plan::name(gemm)));
            } else {
              g.modifiers[k] = &f;
              g.modifications[k] = f.feature->modify_tensor({b.layer, *s}, gemm, ops[k], iteration);
            }
          }
        }
        for (const TensorKind t : plan::all_values<TensorKind>()) {
          const Settings* s = f.find(std::nullopt, t);
          if (!s) continue;
          const Route r = f.feature->inspect_tensor_enabled({b.layer, *s}, t, iteration);
          take(out.next_change, r);
          if (r.enabled) lr.inspectors[size_t(t)].push_back(&f);
        }
      }
    }
    for (size_t gi = 0; gi < kGemms.size(); ++gi) {
      GemmRouting& g = lr.gemms[gi];
      if (!recipe_quantized) g.quantized = false;
      for (size_t k = 0; k < 2; ++k) {
        g.operands[k] = g.modifiers[k] ? OperandAction::Modify
                        : g.quantized  ? OperandAction::Quantize
                                       : OperandAction::HighPrecision;
      }
    }
    out.layers.push_back(std::move(lr));
  }
  return out;
}

std::string Routing::variant_key() const {
  std::string key;
  for (const LayerRouting& l : layers) {
    if (!l.active()) continue;
    key += l.layer + "{";
    for (size_t gi = 0; gi < kGemms.size(); ++gi) {
      const GemmRouting& g = l.gemms[gi];
      key += fmt::format("{}:{}{}{}{}{};", plan::name(kGemms[gi]), g.quantized ? 'q' : 'h',
                         int(g.operands[0]), int(g.operands[1]),
                         g.modifiers[0] ? g.modifiers[0]->name : "-",
                         g.modifiers[1] ? "/" + g.modifiers[1]->name : "/-");
      // What a modifier computes is part of the variant (a C++ feature's expression may change).
      for (size_t k = 0; k < 2; ++k)
        if (g.modifications[k]) key += fmt::format("{}={};", k, g.modifications[k]->key());
    }
    for (const TensorKind t : plan::all_values<TensorKind>()) {
      const auto& ins = l.inspectors[size_t(t)];
      if (ins.empty()) continue;
      key += fmt::format("{}<", plan::name(t));
      for (const FeatureConfig* f : ins) key += f->name + ",";
      key += ">";
    }
    key += "}";
  }
  return key;
}

std::string describe(const LayerRouting& l, const SourceManager& sources) {
  std::string out;
  if (!l.section) {
    return fmt::format("{}: no section; plain plan\n", l.layer);
  }
  out += fmt::format("{}: section '{}' ({}:{}:{}){}\n", l.layer, l.section->name,
                     sources.name(l.section->loc.file), l.section->loc.line, l.section->loc.col,
                     l.active() ? "" : "; nothing active, plain plan");
  for (size_t gi = 0; gi < kGemms.size(); ++gi) {
    const GemmRouting& g = l.gemms[gi];
    const auto ops = operands_of(kGemms[gi]);
    std::vector<std::string> parts;
    for (size_t k = 0; k < 2; ++k) {
      std::string p = fmt::format("{}: {}", plan::name(ops[k]), operand_action_name(g.operands[k]));
      if (g.modifiers[k]) p += fmt::format(" by {}", g.modifiers[k]->name);
      if (g.modifications[k]) {
        p += fmt::format(" ({}", g.modifications[k]->describe());
        if (g.modifications[k]->kind == Modification::Kind::PerTensorScaling && !g.quantized)
          p += "; nothing to do: the GEMM runs in high precision";
        p += ")";
      }
      parts.push_back(std::move(p));
    }
    out += fmt::format("  {}: {}; {}\n", plan::name(kGemms[gi]),
                       g.quantized ? "quantized" : "high precision", fmt::join(parts, ", "));
  }
  for (const TensorKind t : plan::all_values<TensorKind>()) {
    const auto& ins = l.inspectors[size_t(t)];
    if (ins.empty()) continue;
    std::vector<std::string> names;
    for (const FeatureConfig* f : ins) names.push_back(f->name);
    out += fmt::format("  {}: inspected by {}\n", plan::name(t), fmt::join(names, ", "));
  }
  return out;
}

}  // namespace opfuse::debug
