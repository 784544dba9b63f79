// The IR builder's op statements: attribute binding and values, shape rules and parameters (the
// Builder class is in builder_impl.h).

#include <fmt/format.h>

#include "ir/builder_impl.h"
#include "plan/gemm_caps.h"

namespace opfuse::ir::builder_detail {

std::optional<AttrList> Builder::bind_attrs(const dsl::OpStmt& stmt, const OpInfo& info) {
  std::vector<const dsl::Arg*> bound(info.attrs.size(), nullptr);
  bool ok = true;
  size_t positional = 0;
  bool seen_named = false;
  for (const dsl::Arg& a : stmt.args) {
    if (!a.value) {
      ok = false;
      continue;
    }
    if (!a.name) {
      if (seen_named) {
        diags_.error(a.value->loc, "a positional argument cannot follow a named one",
                     "write positional arguments first");
        ok = false;
        continue;
      }
      if (positional >= info.attrs.size()) {
        diags_.error(a.value->loc,
                     fmt::format("'{}' takes {} argument{}, got more", info.name, info.attrs.size(),
                                 info.attrs.size() == 1 ? "" : "s"),
                     usage(info));
        ok = false;
        continue;
      }
      bound[positional++] = &a;
      continue;
    }
    seen_named = true;
    size_t index = info.attrs.size();
    for (size_t i = 0; i < info.attrs.size(); ++i)
      if (info.attrs[i].name == *a.name) index = i;
    if (index == info.attrs.size()) {
      std::vector<std::string> names;
      for (const AttrSpec& s : info.attrs) names.emplace_back(s.name);
      std::string hint = did_you_mean(*a.name, names);
      if (hint.empty()) hint = usage(info);
      diags_.error(a.name_loc, fmt::format("'{}' has no argument '{}'", info.name, *a.name), hint);
      ok = false;
      continue;
    }
    if (bound[index]) {
      diags_.error(a.name_loc,
                   fmt::format("argument '{}' of '{}' is given twice", *a.name, info.name));
      ok = false;
      continue;
    }
    bound[index] = &a;
  }
  if (!ok) return std::nullopt;
  AttrList attrs;
  for (size_t i = 0; i < info.attrs.size(); ++i) {
    const AttrSpec& spec = info.attrs[i];
    if (!bound[i]) {
      if (spec.required) {
        diags_.error(
            stmt.loc,
            fmt::format("'{}' needs the argument '{}' ({})", info.name, spec.name, spec.doc),
            usage(info));
        ok = false;
        continue;
      }
      attrs.push_back(default_attr(spec));
      continue;
    }
    auto v = eval_attr(spec, *bound[i]->value);
    if (!v) {
      ok = false;
      continue;
    }
    attrs.push_back(Attr{std::string(spec.name), std::move(*v)});
  }
  if (!ok) return std::nullopt;
  return attrs;
}

Attr Builder::default_attr(const AttrSpec& spec) {
  switch (spec.type) {
    case AttrType::Int:
      return {std::string(spec.name), int64_t(spec.default_value)};
    case AttrType::Float:
      return {std::string(spec.name), spec.default_value};
    case AttrType::Bool:
      return {std::string(spec.name), spec.default_value != 0};
    case AttrType::Name:
      return {std::string(spec.name), std::string()};
    case AttrType::Shape:
      return {std::string(spec.name), Shape{}};
  }
  return {std::string(spec.name), int64_t(0)};
}

std::string Builder::usage(const OpInfo& info) {
  std::string out = fmt::format("usage: {}(", info.name);
  for (size_t i = 0; i < info.attrs.size(); ++i) {
    const AttrSpec& s = info.attrs[i];
    out += i ? ", " : "";
    out += std::string(s.name);
    if (!s.required) out += " = " + attr_value_string(default_attr(s).value);
  }
  return out + ")";
}

std::optional<AttrValue> Builder::eval_attr(const AttrSpec& spec, const Expr& e) {
  switch (spec.type) {
    case AttrType::Int: {
      auto v = eval_int(e);
      if (!v) return std::nullopt;
      if (double(*v) < spec.min || double(*v) > spec.max) {
        diags_.error(e.loc, fmt::format("{} = {} is out of range", spec.name, *v),
                     fmt::format("{} must be between {} and {}", spec.name, int64_t(spec.min),
                                 int64_t(spec.max)));
        return std::nullopt;
      }
      return AttrValue{*v};
    }
    case AttrType::Float: {
      auto v = eval_number(e);
      if (!v) return std::nullopt;
      if (*v < spec.min || *v > spec.max) {
        diags_.error(e.loc, fmt::format("{} = {} is out of range", spec.name, *v),
                     fmt::format("{} must be between {} and {}", spec.name, spec.min, spec.max));
        return std::nullopt;
      }
      return AttrValue{*v};
    }
    case AttrType::Bool: {
      auto v = eval_bool(e);
      if (!v) return std::nullopt;
      return AttrValue{*v};
    }
    case AttrType::Name: {
      auto w = eval_word(e, "the name of a sequence input or output");
      if (!w) return std::nullopt;
      return AttrValue{*w};
    }
    case AttrType::Shape: {
      if (e.kind != Expr::Kind::List) {
        diags_.error(e.loc, "expected a shape like [tokens, -1, 64]");
        return std::nullopt;
      }
      Shape shape;
      for (const auto& d : e.operands) {
        if (!d) return std::nullopt;
        auto dim = eval_dim(*d, /*allow_minus_one=*/true);
        if (!dim) return std::nullopt;
        shape.push_back(*dim);
      }
      if (shape.empty()) {
        diags_.error(e.loc, "a shape needs at least one dimension");
        return std::nullopt;
      }
      return AttrValue{shape};
    }
  }
  return std::nullopt;
}

SourceLoc Builder::attr_loc(const dsl::OpStmt& stmt, const OpInfo& info, const std::string& attr) {
  if (attr.empty()) return stmt.loc;
  size_t positional = 0;
  for (const dsl::Arg& a : stmt.args) {
    if (!a.value) continue;
    if (a.name) {
      if (*a.name == attr) return a.value->loc;
    } else if (positional < info.attrs.size() && info.attrs[positional++].name == attr) {
      return a.value->loc;
    }
  }
  return stmt.loc;
}

std::optional<ValueId> Builder::build_op(
    SequenceScope& sc, const dsl::OpStmt& stmt, const OpInfo& info, ValueId cur,
    const std::string& instance, const std::vector<std::optional<TensorType>>& output_types) {
  Sequence& s = sc.seq;
  auto attrs = bind_attrs(stmt, info);
  if (!attrs) return std::nullopt;

  const TensorType* extra = nullptr;
  std::optional<ValueId> extra_value;
  if (info.kind == OpKind::AddExtraInput || info.kind == OpKind::MakeExtraOutput) {
    const std::string& name = attr_name(*attrs, "name");
    const SourceLoc loc = attr_loc(stmt, info, "name");
    if (info.kind == OpKind::AddExtraInput) {
      auto it = sc.extra_inputs.find(name);
      if (it == sc.extra_inputs.end()) {
        unknown_io(sc, name, loc, /*want_input=*/true);
        return std::nullopt;
      }
      if (auto used = sc.used_inputs.find(name); used != sc.used_inputs.end()) {
        diags_.error(
            loc, fmt::format("extra input '{}' is already added", name),
            "each extra input is added once; declare a second input for a second residual");
        diags_.note(used->second, "added here");
        return std::nullopt;
      }
      sc.used_inputs[name] = loc;
      extra_value = it->second;
      extra = &s.value(it->second).type;
    } else {
      auto it = sc.extra_outputs.find(name);
      if (it == sc.extra_outputs.end()) {
        unknown_io(sc, name, loc, /*want_input=*/false);
        return std::nullopt;
      }
      if (auto made = sc.made_outputs.find(name); made != sc.made_outputs.end()) {
        diags_.error(loc, fmt::format("extra output '{}' is already made", name));
        diags_.note(made->second, "made here");
        return std::nullopt;
      }
      sc.made_outputs[name] = loc;
      // outputs[i] (i > 0) maps to output_types[i]: both follow the signature order.
      if (const auto& t = output_types.at(it->second)) extra = &*t;
    }
  }

  // Tensor parallelism around a linear (TE's column / row-parallel Linear): a column-parallel
  // linear reading the ranks' shares of the tokens gathers them first; a row-parallel one leaves
  // partial sums that are reduced (all_reduce, or reduce_scatter under sequence parallelism)
  // before its bias is added.
  const bool parallel_linear = info.kind == OpKind::Linear && s.parallel.active() &&
                               linear_parallel(*attrs) != LinearParallel::None &&
                               linear_parallel(*attrs) != LinearParallel::Invalid;
  const bool high_precision = info.kind == OpKind::Linear && linear_high_precision(*attrs);
  if (high_precision && s.parallel.active() && s.recipe.is_fp8()) {
    diags_.error(attr_loc(stmt, info, "precision"),
                 fmt::format("sequence '{}' is tensor-parallel: linear '{}' cannot run in high "
                             "precision under the FP8 recipe '{}' yet (the collectives of an FP8 "
                             "tensor-parallel sequence carry FP8 copies)",
                             s.name, instance, s.recipe.name),
                 "leave out precision = high, or run the sequence under bf16");
    return std::nullopt;
  }
  if (high_precision && s.fp8_weights && s.recipe.is_fp8()) {
    diags_.error(attr_loc(stmt, info, "precision"),
                 fmt::format("linear '{}' runs in high precision, but sequence '{}' keeps its "
                             "weights in FP8 only (with fp8_weights)",
                             instance, s.name),
                 "leave out precision = high, or fp8_weights");
    return std::nullopt;
  }
  bool row_bias = false;
  if (parallel_linear && linear_parallel(*attrs) == LinearParallel::Column &&
      sc.layouts.at(cur) == Layout::SplitTokens) {
    auto gathered = add_builder_op(sc, OpKind::AllGather, {{"dim", int64_t(0)}}, cur,
                                   instance + ".gather", stmt.loc);
    if (!gathered) return std::nullopt;
    return build_op(sc, stmt, info, *gathered, instance, output_types);
  }
  if (parallel_linear && linear_parallel(*attrs) == LinearParallel::Row) {
    for (Attr& a : *attrs)
      if (a.name == "bias" && std::get<bool>(a.value)) {
        row_bias = true;
        a.value = false;
      }
  }
  const TensorType in_type_now = s.value(cur).type;
  ShapeInput shape_input{in_type_now, *attrs, extra};
  shape_input.tp = s.parallel.tp;
  ShapeResult shape = info.shape_rule(shape_input);
  if (!shape.errors.empty()) {
    for (const ShapeError& e : shape.errors)
      diags_.error(attr_loc(stmt, info, e.attr), e.message, e.hint);
    return std::nullopt;
  }
  if (info.kind == OpKind::Linear) {
    // The rank's features: what every pass, the GEMMs and the reference see.
    const Shape& w = shape.params.at(0).type.shape;
    for (Attr& a : *attrs) {
      if (a.name == "out") a.value = w[0].size;
      if (a.name == "in") a.value = w[1].size;
    }
  }
  if (info.kind == OpKind::Linear && s.recipe.is_fp8() && !high_precision) {
    // The strictest FP8 rule of the architectures the compiler targets (plan/gemm_caps.h).
    // Micro-scaled formats block `in` (K) and `out` (the weight's column-wise blocks) by 32
    // (MXFP8) or 16 (NVFP4).
    const int64_t multiple =
        std::max(int64_t(plan::gemm_dim_multiple(plan::gemm_caps(plan::kDefaultArch), true)),
                 int64_t(micro_block_multiple(s.recipe)));
    for (const char* a : {"in", "out"}) {
      const int64_t n = attr_int(*attrs, a);
      if (n % multiple != 0) {
        diags_.error(attr_loc(stmt, info, a),
                     micro_block_multiple(s.recipe) > 0
                         ? fmt::format("{} = {} is not a multiple of {}, which the blocks of {} "
                                       "need",
                                       a, n, multiple, recipe_kind_name(s.recipe.kind))
                         : fmt::format("{} = {} is not a multiple of {}, which FP8 GEMMs need "
                                       "(cuBLASLt)",
                                       a, n, multiple),
                     fmt::format("pad the features to {} or use the bf16 recipe for this sequence",
                                 (n + multiple - 1) / multiple * multiple));
        return std::nullopt;
      }
    }
  }

  const int32_t op_index = static_cast<int32_t>(s.ops.size());
  Operation op;
  op.kind = info.kind;
  op.attrs = std::move(*attrs);
  op.instance = instance;
  op.loc = stmt.loc;
  op.operands.push_back(cur);
  add_params(s, op, shape.params, instance);
  if (extra_value) op.operands.push_back(*extra_value);
  const ValueId result = add_value(s, ValueKind::Result, shape.out, "", op_index);
  op.results.push_back(result);
  if (info.kind == OpKind::MakeExtraOutput) {
    // The extra output aliases the op's result (MakeExtraOutput copies nothing).
    s.outputs[sc.extra_outputs[attr_name(op.attrs, "name")]].value = result;
  }
  s.ops.push_back(std::move(op));
  if (high_precision && s.recipe.is_fp8()) {
    QuantOverride keep;
    keep.layer = instance;
    keep.high_precision = true;
    s.quant_overrides.push_back(std::move(keep));
  }
  if (!check_layout(sc, stmt.loc)) return std::nullopt;
  if (s.parallel.active() && info.family == KernelFamily::GatedActivation &&
      sc.layouts.at(cur) == Layout::SplitFeatures) {
    cut_gated_producer(s, cur);
  }
  if (parallel_linear && linear_parallel(s.ops[size_t(op_index)].attrs) == LinearParallel::Row) {
    const bool sp = s.parallel.sp;
    auto reduced = add_builder_op(sc, sp ? OpKind::ReduceScatter : OpKind::AllReduce,
                                  sp ? AttrList{{"dim", int64_t(0)}} : AttrList{}, result,
                                  instance + (sp ? ".reduce_scatter" : ".all_reduce"), stmt.loc);
    if (!reduced || !row_bias) return reduced;
    // The bias parameter keeps the linear's name ("<linear>.bias"), as without tp.
    return add_builder_op(sc, OpKind::Bias,
                          {{"size", attr_int(s.ops[size_t(op_index)].attrs, "out")}}, *reduced,
                          instance + ".bias", stmt.loc, instance);
  }
  return result;
}

void Builder::add_params(Sequence& s, Operation& op, const std::vector<ParamDecl>& params,
                         const std::string& owner) {
  for (const ParamDecl& p : params) {
    const ValueId v = add_value(s, ValueKind::Param, p.type, owner + "." + p.role, -1);
    s.values[v].init = p.init;
    s.values[v].shard = p.shard;
    s.params.push_back(v);
    op.operands.push_back(v);
  }
}

void Builder::cut_gated_producer(Sequence& s, ValueId gated_input) {
  for (ValueId v = gated_input;;) {
    const int32_t producer = s.value(v).producer;
    if (producer < 0) return;
    Operation& p = s.ops[size_t(producer)];
    if (p.kind == OpKind::Linear) {
      for (size_t i = 1; i < p.operands.size(); ++i) s.values[p.operands[i]].shard.blocks = 2;
      return;
    }
    v = p.operands[0];
  }
}

bool Builder::check_layout(SequenceScope& sc, SourceLoc loc) {
  Sequence& s = sc.seq;
  sc.layouts.resize(s.values.size(), Layout::Replicated);
  const Operation& op = s.ops.back();
  const LayoutResult r = result_layout(s, op, sc.layouts);
  if (!r.error.empty()) {
    diags_.error(loc, r.error, r.hint);
    return false;
  }
  for (ValueId v : op.results) sc.layouts[v] = r.layout;
  return true;
}

std::optional<ValueId> Builder::add_builder_op(SequenceScope& sc, OpKind kind, AttrList attrs,
                                               ValueId cur, const std::string& instance,
                                               SourceLoc loc, const std::string& param_owner) {
  Sequence& s = sc.seq;
  const OpInfo& info = op_info(kind);
  ShapeInput shape_input{s.value(cur).type, attrs, nullptr};
  shape_input.tp = s.parallel.tp;
  ShapeResult shape = info.shape_rule(shape_input);
  if (!shape.errors.empty()) {
    for (const ShapeError& e : shape.errors) diags_.error(loc, e.message, e.hint);
    return std::nullopt;
  }
  Operation op;
  op.kind = kind;
  op.attrs = std::move(attrs);
  op.instance = instance;
  op.loc = loc;
  op.operands.push_back(cur);
  add_params(s, op, shape.params, param_owner.empty() ? instance : param_owner);
  const ValueId result =
      add_value(s, ValueKind::Result, shape.out, "", static_cast<int32_t>(s.ops.size()));
  op.results.push_back(result);
  s.ops.push_back(std::move(op));
  if (!check_layout(sc, loc)) return std::nullopt;
  return result;
}

}  // namespace opfuse::ir::builder_detail
