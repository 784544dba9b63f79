// The IR builder's declared fusions (docs/language.md, "Declared fusions"): `fusion NAME(phase =
// forward|backward, priority = N) { op; op?; ... }` checked where it is declared, so that a
// pattern codegen cannot lower is an error at build time, never at run time; the fuse passes
// apply it (compiler/passes/fusion/patterns.cpp, patterns_in_order).

#include <fmt/format.h>

#include "ir/builder_impl.h"
#include "ir/kernel_shapes.h"
#include "ir/pointwise_ops.h"
#include "ir/printer.h"

namespace opfuse::ir::builder_detail {

namespace {

constexpr int kMaxFusionPriority = 100;

// Backward ops a forward pattern cannot hold (and the forward ops a backward one cannot).
bool backward_only(OpKind k) {
  return is_pointwise_backward(k) || k == OpKind::LayerNormBackward ||
         k == OpKind::RMSNormBackward || k == OpKind::LinearDgrad || k == OpKind::LinearWgrad ||
         k == OpKind::BiasGrad || k == OpKind::GradAdd;
}
bool forward_only(OpKind k) {
  return is_pointwise(k) || k == OpKind::LayerNorm || k == OpKind::RMSNorm || k == OpKind::Linear ||
         k == OpKind::Bias || k == OpKind::AddExtraInput || k == OpKind::MakeExtraOutput ||
         k == OpKind::Quantize;
}

// Fixed kinds (user and internal ops) by name; the built-in pointwise ops by their definition's.
std::optional<OpKind> kind_named(std::string_view name) {
  for (size_t k = 0; k < kNumOpKinds; ++k)
    if (op_info(OpKind(k)).name == name) return OpKind(k);
  for (const PointwiseDef* d : pointwise_defs())
    if (d->name == name) return pointwise_kind(*d);
  return std::nullopt;
}

std::vector<std::string> step_names(Phase phase) {
  std::vector<std::string> names;
  for (size_t k = 0; k < kNumOpKinds; ++k) {
    const OpKind kind = OpKind(k);
    if (kind == OpKind::Fused || kind == OpKind::UserNorm || kind == OpKind::UserNormBackward ||
        (phase == Phase::Forward ? backward_only(kind) : false))
      continue;
    names.emplace_back(op_info(kind).name);
  }
  for (const PointwiseDef* d : pointwise_defs()) names.emplace_back(d->name);
  return names;
}

std::string shapes_hint() {
  std::string out = "one kernel runs one of: ";
  bool first = true;
  for (const KernelShapeInfo& s : kernel_shapes()) {
    out += fmt::format("{}{} ({})", first ? "" : "; ", s.name, s.parts);
    first = false;
  }
  return out;
}

}  // namespace

std::optional<DeclaredFusion::Step> Builder::fusion_step(const dsl::FusionDecl& d,
                                                         const dsl::FusionStep& step, Phase phase) {
  const bool backward = phase == Phase::Backward;
  DeclaredFusion::Step out;
  out.optional = step.optional;
  if (auto it = user_ops_.find(step.op); it != user_ops_.end()) {
    if (it->second.norm_like) {
      diags_.error(step.loc,
                   fmt::format("op '{}' reduces over the last dimension; fusion '{}' cannot hold "
                               "it",
                               step.op, d.name),
                   "a norm-like op runs as its own row kernel; declared fusions hold pointwise "
                   "user ops");
      return std::nullopt;
    }
    const PointwiseDef& carrier = user_pointwise_def(it->second.decl->gated);
    out.kind = backward ? pointwise_backward_kind(carrier) : pointwise_kind(carrier);
    out.user_op = step.op;
    return out;
  }
  std::optional<OpKind> kind = kind_named(step.op);
  if (kind && (*kind == OpKind::UserNorm || *kind == OpKind::UserNormBackward ||
               op_info(*kind).pointwise == &user_pointwise_def(false) ||
               op_info(*kind).pointwise == &user_pointwise_def(true)))
    kind.reset();  // the carriers are not names a program can use
  if (!kind) {
    std::vector<std::string> names = step_names(phase);
    for (const auto& [n, _] : user_ops_) names.push_back(n);
    std::string hint = did_you_mean(step.op, names);
    diags_.error(step.loc, fmt::format("unknown op '{}' in fusion '{}'", step.op, d.name),
                 hint.empty() ? "a step names a built-in op, an internal op such as cast_fp8, or "
                                "a user-defined op"
                              : hint);
    return std::nullopt;
  }
  if (backward) {
    // A forward op's name in a backward fusion means the op its backward runs as.
    if (is_pointwise(*kind)) {
      kind = pointwise_backward_kind(*op_info(*kind).pointwise);
    } else if (*kind == OpKind::LayerNorm) {
      kind = OpKind::LayerNormBackward;
    } else if (*kind == OpKind::RMSNorm) {
      kind = OpKind::RMSNormBackward;
    } else if (*kind == OpKind::Bias) {
      kind = OpKind::BiasGrad;
    } else if (*kind == OpKind::Linear) {
      diags_.error(step.loc,
                   fmt::format("'linear' runs as two GEMMs in the backward; fusion '{}' must name "
                               "one",
                               d.name),
                   "write linear_dgrad (dx = dy W) or linear_wgrad (dW = dy^T x)");
      return std::nullopt;
    } else if (forward_only(*kind)) {
      diags_.error(step.loc,
                   fmt::format("'{}' has no op in the backward (its gradient passes through), so "
                               "backward fusion '{}' cannot hold it",
                               step.op, d.name));
      return std::nullopt;
    }
  } else if (backward_only(*kind)) {
    diags_.error(
        step.loc,
        fmt::format("'{}' runs in the backward; fusion '{}' is a forward fusion", step.op, d.name),
        fmt::format("declare it as: fusion {}(phase = backward) {{ ... }}", d.name));
    return std::nullopt;
  }
  if (*kind == OpKind::Fused) {
    diags_.error(step.loc, fmt::format("fusion '{}' cannot hold a fused op", d.name));
    return std::nullopt;
  }
  out.kind = *kind;
  return out;
}

void Builder::define_fusion(const dsl::FusionDecl& d) {
  DeclaredFusion fusion;
  fusion.name = d.name;
  fusion.loc = d.loc;
  bool ok = true;
  bool seen_phase = false, seen_priority = false;
  for (const dsl::Arg& a : d.args) {
    if (!a.value) return;
    if (!a.name) {
      diags_.error(
          a.value->loc,
          fmt::format("the arguments of fusion '{}' are named: phase and priority", d.name),
          fmt::format("write: fusion {}(phase = backward, priority = 2) {{ ... }}", d.name));
      ok = false;
      continue;
    }
    bool& seen = *a.name == "phase" ? seen_phase : seen_priority;
    if (*a.name != "phase" && *a.name != "priority") {
      std::string hint = did_you_mean(*a.name, {"phase", "priority"});
      diags_.error(
          a.name_loc, fmt::format("fusion '{}' has no argument '{}'", d.name, *a.name),
          hint.empty() ? "a fusion takes phase = forward|backward and priority = N" : hint);
      ok = false;
      continue;
    }
    if (seen) {
      diags_.error(a.name_loc, fmt::format("'{}' is given twice", *a.name));
      ok = false;
      continue;
    }
    seen = true;
    if (*a.name == "phase") {
      const bool word = a.value->kind == Expr::Kind::Name;
      if (word && (a.value->text == "forward" || a.value->text == "backward")) {
        fusion.phase = a.value->text == "forward" ? Phase::Forward : Phase::Backward;
      } else {
        diags_.error(a.value->loc,
                     fmt::format("the phase of fusion '{}' is forward or backward", d.name));
        ok = false;
      }
      continue;
    }
    const auto v = eval(*a.value, /*allow_float=*/false);
    const int64_t* n = v ? std::get_if<int64_t>(&*v) : nullptr;
    if (n == nullptr) {
      if (v) diags_.error(a.value->loc, "a fusion's priority is an integer");
      ok = false;
    } else if (*n < -kMaxFusionPriority || *n > kMaxFusionPriority) {
      diags_.error(a.value->loc,
                   fmt::format("priority {} is out of range for fusion '{}'", *n, d.name),
                   fmt::format("a priority is between {} and {}: above 0 the fusion is tried "
                               "before the built-in patterns, below 0 after them",
                               -kMaxFusionPriority, kMaxFusionPriority));
      ok = false;
    } else {
      fusion.priority = int(*n);
    }
  }
  size_t required = 0;
  for (const dsl::FusionStep& step : d.steps) {
    const auto resolved = fusion_step(d, step, fusion.phase);
    if (!resolved) {
      ok = false;
      continue;
    }
    required += step.optional ? 0 : 1;
    fusion.steps.push_back(*resolved);
  }
  if (!ok) return;
  if (!d.steps.empty() && d.steps.front().optional) {
    diags_.error(d.steps.front().loc,
                 fmt::format("the first step of fusion '{}' cannot be optional", d.name),
                 "a match starts at an op that is there");
    return;
  }
  if (required < 2) {
    diags_.error(d.loc,
                 fmt::format("fusion '{}' needs at least two ops that are not optional", d.name),
                 "one op is a kernel of its own already");
    return;
  }
  // Every match, whichever optional steps are absent, must select a kernel shape that takes all
  // its ops (ir/kernel_shapes.h): codegen dispatches through the same table.
  std::vector<size_t> optional;
  for (size_t k = 0; k < fusion.steps.size(); ++k)
    if (fusion.steps[k].optional) optional.push_back(k);
  for (size_t mask = 0; mask < (size_t(1) << optional.size()); ++mask) {
    std::vector<OpKind> kinds;
    std::string absent;
    for (size_t k = 0, o = 0; k < fusion.steps.size(); ++k) {
      const bool skipped = o < optional.size() && optional[o] == k && ((mask >> o++) & 1) != 0;
      if (skipped) {
        absent += fmt::format("{}'{}'", absent.empty() ? "" : ", ", d.steps[k].op);
        continue;
      }
      kinds.push_back(fusion.steps[k].kind);
    }
    if (kernel_shape_allows(kinds)) continue;
    const KernelShapeInfo* shape = select_kernel_shape(kinds);
    diags_.error(d.loc,
                 fmt::format("codegen has no kernel for fusion '{}'{}{}", d.name,
                             absent.empty() ? "" : fmt::format(" without {}", absent),
                             shape == nullptr ? std::string()
                                              : fmt::format(": its ops select the {}, which "
                                                            "takes {}",
                                                            shape->name, shape->parts)),
                 shapes_hint());
    return;
  }
  program_.fusions.push_back(std::move(fusion));
}

}  // namespace opfuse::ir::builder_detail
