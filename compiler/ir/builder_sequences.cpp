// The IR builder's sequences: inputs and outputs, the op statements in order, and unknown extra
// inputs and outputs (the Builder class is in builder_impl.h).

#include <fmt/format.h>

#include "ir/builder_impl.h"
#include "support/spelling.h"

namespace opfuse::ir::builder_detail {

ValueId Builder::add_value(Sequence& s, ValueKind kind, TensorType type, std::string name,
                           int32_t producer) {
  const ValueId id = static_cast<ValueId>(s.values.size());
  s.values.push_back(Value{id, kind, std::move(type), std::move(name), producer});
  return id;
}

void Builder::build_sequence(const dsl::SequenceDecl& d) {
  SequenceScope sc;
  Sequence& s = sc.seq;
  s.name = d.name;
  s.loc = d.loc;
  bool ok = true;

  // The parallel option first: `tp` names the group size in the signature (`tokens / tp`).
  bool defined_tp = false;
  for (const dsl::SequenceFlag& f : d.flags) {
    if (f.name != "parallel") continue;
    if (!parallel_option(s, f)) return;
    if (auto c = consts_.find("tp"); c != consts_.end()) {
      if (!std::holds_alternative<int64_t>(c->second) ||
          std::get<int64_t>(c->second) != s.parallel.tp) {
        diags_.error(f.loc,
                     fmt::format("parallel(tp = {}) disagrees with the constant tp = {}",
                                 s.parallel.tp, const_value_string(c->second)),
                     "write parallel(tp = tp), or rename the constant");
        return;
      }
    } else {
      consts_["tp"] = int64_t(s.parallel.tp);
      defined_tp = true;
    }
  }
  struct EraseTp {
    std::map<std::string, ConstValue>& consts;
    bool active;
    ~EraseTp() {
      if (active) consts.erase("tp");
    }
  } erase_tp{consts_, defined_tp};

  if (d.inputs.empty()) {
    diags_.error(d.loc, fmt::format("sequence '{}' has no inputs", d.name),
                 "the first input is the tensor the ops transform");
    return;
  }
  if (d.outputs.empty()) {
    diags_.error(d.loc, fmt::format("sequence '{}' has no outputs", d.name),
                 "the first output is the result of the last op");
    return;
  }
  std::map<std::string, SourceLoc> io_names;
  auto check_io_name = [&](const dsl::Param& p) {
    auto [it, inserted] = io_names.emplace(p.name, p.loc);
    if (!inserted) {
      diags_.error(
          p.loc, fmt::format("'{}' is already an input or output of sequence '{}'", p.name, d.name),
          "inputs and outputs share one namespace; rename one");
      ok = false;
    }
    return inserted;
  };
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    const dsl::Param& p = d.inputs[i];
    if (!check_io_name(p)) continue;
    auto t = eval_type(p.type, p.quantized.has_value());
    if (!t) {
      ok = false;
      continue;
    }
    if (p.quantized) {
      s.quantized_input = quantized_boundary(p, /*input=*/true, /*main=*/i == 0);
      ok &= s.quantized_input.has_value();
    }
    const ValueId v = add_value(s, ValueKind::Input, *t, p.name, -1);
    s.inputs.push_back(v);
    if (i > 0) sc.extra_inputs[p.name] = v;
    sc.params_by_name[p.name] = &p;
  }
  std::vector<std::optional<TensorType>> output_types;
  for (size_t i = 0; i < d.outputs.size(); ++i) {
    const dsl::Param& p = d.outputs[i];
    if (!check_io_name(p)) {
      output_types.push_back(std::nullopt);
      continue;
    }
    auto t = eval_type(p.type, p.quantized.has_value());
    if (!t) ok = false;
    if (p.quantized) {
      s.quantized_output = quantized_boundary(p, /*input=*/false, /*main=*/i == 0);
      ok &= s.quantized_output.has_value();
    }
    output_types.push_back(t);
    s.outputs.push_back(SequenceOutput{p.name, 0, p.loc});
    if (i > 0) sc.extra_outputs[p.name] = s.outputs.size() - 1;
    sc.params_by_name[p.name] = &p;
  }
  if (!ok || s.inputs.size() != d.inputs.size()) return;

  // Recipe: the sequence's own `uses` is checked even when --recipe overrides it.
  std::optional<Recipe> own = Recipe{};  // no `uses`: no quantization, like TE outside fp8_autocast
  if (d.recipe) {
    own = resolve_recipe(*d.recipe, d.recipe_loc);
    if (!own) return;
  }
  s.recipe = override_ ? *override_ : *own;
  for (const dsl::SequenceFlag& f : d.flags) {
    if (f.name == "parallel" && s.parallel.active() && s.recipe.micro_scaled()) {
      diags_.error(f.loc,
                   fmt::format("sequence '{}' is tensor-parallel under {}, which opfuse runs on "
                               "one GPU only (its per-tensor and block scales are not reduced "
                               "over ranks)",
                               d.name, recipe_kind_name(s.recipe.kind)),
                   "use float8_block_scaling, delayed_scaling or current_scaling here");
      ok = false;
    }
    if (f.name == "parallel") continue;  // read first
    if (f.has_args) {
      diags_.error(f.loc, fmt::format("sequence option '{}' takes no arguments", f.name));
      ok = false;
      continue;
    }
    if (f.name == "fp8_weights") {
      if (s.fp8_weights) diags_.warning(f.loc, "fp8_weights is given twice");
      s.fp8_weights = true;
      if (!s.recipe.is_fp8()) {
        diags_.warning(
            f.loc,
            fmt::format("fp8_weights has no effect: sequence '{}' uses the bf16 recipe", d.name),
            "add 'uses <an FP8 recipe>' to the sequence");
        s.fp8_weights = false;
      } else if (s.recipe.micro_scaled()) {
        diags_.warning(f.loc,
                       fmt::format("fp8_weights has no effect: sequence '{}' uses {}, whose "
                                   "GEMMs read decoded copies that every step makes afresh",
                                   d.name, recipe_kind_name(s.recipe.kind)),
                       "the weights stay high-precision parameters under this recipe");
        s.fp8_weights = false;
      }
    } else {
      const std::string near = did_you_mean(f.name, {"fp8_weights", "parallel"});
      diags_.error(
          f.loc, fmt::format("unknown sequence option '{}'", f.name),
          near.empty() ? "the options are fp8_weights and parallel(tp = N, sp = bool)" : near);
      ok = false;
    }
  }

  // Instance names: user names first, then defaults that avoid them.
  std::map<std::string, SourceLoc> instances;
  for (const dsl::OpStmt& op : d.body) {
    if (!op.instance) continue;
    auto [it, inserted] = instances.emplace(*op.instance, op.instance_loc);
    if (!inserted) {
      diags_.error(
          op.instance_loc,
          fmt::format("layer name '{}' is already used in sequence '{}'", *op.instance, d.name),
          "layer names select layers in configs and checkpoints; make each unique");
      diags_.note(it->second, "first used here");
      ok = false;
    }
  }
  std::map<std::string, int> kind_counters;

  sc.layouts.assign(s.values.size(), s.parallel.active() && s.parallel.sp ? Layout::SplitTokens
                                                                          : Layout::Replicated);
  ValueId cur = s.inputs[0];
  for (const dsl::OpStmt& stmt : d.body) {
    if (diags_.at_error_limit()) return;
    if (auto user = user_ops_.find(stmt.op); user != user_ops_.end()) {
      std::string instance;
      if (stmt.instance) {
        instance = *stmt.instance;
      } else {
        do {
          instance = fmt::format("{}_{}", stmt.op, kind_counters[stmt.op]++);
        } while (instances.count(instance));
        instances.emplace(instance, stmt.loc);
      }
      auto next = build_user_op(sc, stmt, user->second, cur, instance);
      if (!next) {
        ok = false;
        break;
      }
      cur = *next;
      continue;
    }
    const OpInfo* info = find_op(stmt.op);
    if (!info) {
      std::string near = suggest_op(stmt.op);
      if (near.empty()) {
        std::vector<std::string> user_names;
        for (const auto& [name, _] : user_ops_) user_names.push_back(name);
        near = closest_spelling(stmt.op, user_names);
      }
      diags_.error(stmt.loc, fmt::format("unknown op '{}'", stmt.op),
                   near.empty() ? "see docs/language.md for the list of ops"
                                : fmt::format("did you mean '{}'?", near));
      ok = false;
      break;  // the shapes after an unknown op are unknowable
    }
    std::string instance;
    if (stmt.instance) {
      instance = *stmt.instance;
    } else {
      do {
        instance = fmt::format("{}_{}", info->name, kind_counters[std::string(info->name)]++);
      } while (instances.count(instance));
      instances.emplace(instance, stmt.loc);
    }
    auto next = build_op(sc, stmt, *info, cur, instance, output_types);
    if (!next) {
      ok = false;
      break;  // later shapes depend on this one
    }
    cur = *next;
  }
  if (!ok) return;

  // Main output.
  const Value& last = s.value(cur);
  if (output_types[0] && !(last.type == *output_types[0])) {
    diags_.error(
        d.outputs[0].loc,
        fmt::format("sequence '{}' ends with {}, but its output '{}' is declared {}", d.name,
                    type_string(last.type), d.outputs[0].name, type_string(*output_types[0])),
        "change the declared output or the last op");
    ok = false;
  }
  s.outputs[0].value = cur;
  if (!check_quantized_boundaries(sc, d)) ok = false;
  for (const SequenceOutput& out : s.outputs) {
    const Layout l = sc.layouts.at(out.value);
    if (l == Layout::SplitFeatures || l == Layout::Partial) {
      diags_.error(out.loc,
                   fmt::format("output '{}' is {}: every rank must hold it whole or its share "
                               "of the tokens",
                               out.name, layout_name(l)),
                   l == Layout::Partial
                       ? "sum the parts first: all_reduce() or reduce_scatter()"
                       : "end the split with a row-parallel linear (parallel = row)");
      ok = false;
    }
  }
  for (const auto& [name, index] : sc.extra_outputs) {
    if (!sc.made_outputs.count(name)) {
      diags_.error(
          s.outputs[index].loc, fmt::format("output '{}' is never produced", name),
          fmt::format("add make_extra_output({}) where the tensor should be exposed", name));
      ok = false;
    }
  }
  for (const auto& [name, v] : sc.extra_inputs) {
    if (!sc.used_inputs.count(name)) {
      diags_.warning(sc.params_by_name[name]->loc,
                     fmt::format("extra input '{}' of sequence '{}' is never used", name, d.name),
                     fmt::format("add add_extra_input({}) or remove the input", name));
    }
  }
  for (size_t i = 1; i < s.outputs.size(); ++i) {
    if (s.outputs[i].value == cur) {
      diags_.warning(s.outputs[i].loc,
                     fmt::format("extra output '{}' is the same tensor as the main output '{}'",
                                 s.outputs[i].name, s.outputs[0].name),
                     "move make_extra_output before the op whose input it should expose");
    }
  }
  if (ok) program_.sequences.push_back(std::move(s));
}

bool Builder::parallel_option(Sequence& s, const dsl::SequenceFlag& f) {
  if (s.parallel.active()) {
    diags_.error(f.loc, "parallel is given twice");
    return false;
  }
  std::optional<int64_t> tp;
  bool sp = false;
  size_t positional = 0;
  for (const dsl::Arg& a : f.args) {
    if (!a.value) return false;
    const std::string name = a.name ? *a.name : (positional++ == 0 ? "tp" : "sp");
    const SourceLoc loc = a.name ? a.name_loc : a.value->loc;
    if (name == "tp") {
      tp = eval_int(*a.value);
      if (!tp) return false;
      if (*tp < 1 || *tp > 1024) {
        diags_.error(a.value->loc, fmt::format("tp = {} is out of range", *tp),
                     "the tensor-parallel group has 1 to 1024 ranks, one GPU each");
        return false;
      }
    } else if (name == "sp") {
      auto v = eval_bool(*a.value);
      if (!v) return false;
      sp = *v;
    } else {
      const std::string near = did_you_mean(name, {"tp", "sp"});
      diags_.error(loc, fmt::format("parallel has no argument '{}'", name),
                   near.empty() ? "write parallel(tp = N, sp = true|false)" : near);
      return false;
    }
  }
  if (!tp) {
    diags_.error(f.loc, "parallel needs the group size tp",
                 "write parallel(tp = N, sp = true|false): N ranks, one GPU each");
    return false;
  }
  s.parallel = plan::ParallelSpec{static_cast<int>(*tp), sp};
  return true;
}

void Builder::unknown_io(const SequenceScope& sc, const std::string& name, SourceLoc loc,
                         bool want_input) {
  const Sequence& s = sc.seq;
  if (want_input) {
    if (sc.extra_outputs.count(name)) {
      diags_.error(loc,
                   fmt::format("'{}' is an output of sequence '{}'; add_extra_input needs an input",
                               name, s.name));
    } else if (!s.inputs.empty() && s.value(s.inputs[0]).name == name) {
      diags_.error(
          loc,
          fmt::format("'{}' is the main input of sequence '{}', not an extra input", name, s.name),
          "declare the residual as a second input");
    } else {
      std::vector<std::string> names;
      for (const auto& [n, _] : sc.extra_inputs) names.push_back(n);
      std::string hint = did_you_mean(name, names);
      if (hint.empty())
        hint =
            fmt::format("declare it as an extra input: sequence {}(..., {}: <type>)", s.name, name);
      diags_.error(loc, fmt::format("unknown extra input '{}' in sequence '{}'", name, s.name),
                   hint);
    }
  } else {
    if (sc.extra_inputs.count(name)) {
      diags_.error(
          loc, fmt::format("'{}' is an input of sequence '{}'; make_extra_output needs an output",
                           name, s.name));
    } else if (!s.outputs.empty() && s.outputs[0].name == name) {
      diags_.error(loc,
                   fmt::format("'{}' is the main output of sequence '{}', not an extra output",
                               name, s.name),
                   "the main output is the result of the last op; declare a second output");
    } else {
      std::vector<std::string> names;
      for (const auto& [n, _] : sc.extra_outputs) names.push_back(n);
      std::string hint = did_you_mean(name, names);
      if (hint.empty())
        hint = fmt::format("declare it as an extra output: -> (..., {}: <type>)", name);
      diags_.error(loc, fmt::format("unknown extra output '{}' in sequence '{}'", name, s.name),
                   hint);
    }
  }
}

}  // namespace opfuse::ir::builder_detail
