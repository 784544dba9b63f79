#include "ir/printer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ir/pointwise_ops.h"
#include "ir/row_expr.h"
#include "ir/scalar_code.h"

namespace opfuse::ir {

namespace {

// Inputs print as %name, parameters as %instance.role, output gradients as %d<output>, op results
// as %0, %1, ... in order of creation.
class ValueNames {
 public:
  explicit ValueNames(const Sequence& s) : names_(s.values.size()) {
    int next = 0;
    for (const Value& v : s.values) {
      switch (v.kind) {
        case ValueKind::Result:
          names_[v.id] = fmt::format("%{}", next++);
          break;
        case ValueKind::OutputGrad:
          names_[v.id] = "%d" + v.name;
          break;
        default:
          names_[v.id] = "%" + v.name;
      }
    }
  }
  std::string operator[](ValueId id) const {
    return id == kNoValue ? std::string("none") : names_.at(id);
  }

 private:
  std::vector<std::string> names_;
};

std::string location(const SourceLoc& loc, const SourceManager* sources) {
  if (!sources || !loc.valid() || loc.file >= sources->file_count()) return {};
  return fmt::format("  // {}:{}", sources->base_name(loc.file), loc.line);
}

std::string list(const std::vector<ValueId>& ids, const ValueNames& names) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + names[ids[i]];
  return out;
}

void print_op(const Sequence& s, const Operation& op, const ValueNames& names,
              const SourceManager* sources, const std::string& indent, std::string& out) {
  std::string line = indent + list(op.results, names);
  const PointwiseDef* def = pointwise_def(op.kind);
  const bool user_defined = def != nullptr && def->user_defined;
  // A user-defined op prints as its own name, with its value (not the encoded text).
  // A norm-like user-defined op (compiler/ir/row_expr.h) likewise, its value with its reductions.
  const bool row = op.kind == OpKind::UserNorm || op.kind == OpKind::UserNormBackward;
  const std::string_view name = user_defined && is_pointwise(op.kind)
                                    ? pointwise_op_name(*def, op.attrs)
                                : op.kind == OpKind::UserNorm ? attr_name(op.attrs, "op")
                                                              : op_info(op.kind).name;
  line += fmt::format(" = {}({})", name, list(op.operands, names));
  // A pointwise backward op's kind names its forward definition: printed as its first attribute.
  std::vector<std::string> attrs;
  if (is_pointwise_backward(op.kind))
    attrs.push_back(fmt::format("activation = {}", pointwise_op_name(*def, op.attrs)));
  if (user_defined) {
    const PointwiseExpr expr(*def, op.attrs, /*device=*/false);
    attrs.push_back(fmt::format(
        "value = {}",
        scalar::describe(expr.graph(), expr.value(), expression_var_names(*def, op.attrs))));
  }
  if (row) {
    if (op.kind == OpKind::UserNormBackward)
      attrs.push_back(fmt::format("op = {}", attr_name(op.attrs, "op")));
    attrs.push_back(fmt::format("value = {}", describe_row_value(op.attrs)));
  }
  const std::span<const AttrSpec> specs = op_info(op.kind).attrs;
  for (size_t i = 0; i < op.attrs.size() && !user_defined && !row; ++i) {
    const Attr& a = op.attrs[i];
    // An optional name left unset (a linear's `parallel`) is not printed.
    const bool unset_name =
        i < specs.size() && !specs[i].required && specs[i].type == AttrType::Name &&
        std::get_if<std::string>(&a.value) != nullptr && std::get<std::string>(a.value).empty();
    if (!unset_name) attrs.push_back(fmt::format("{} = {}", a.name, attr_value_string(a.value)));
  }
  if (!attrs.empty()) line += fmt::format(" {{{}}}", fmt::join(attrs, ", "));
  line += fmt::format(" as \"{}\"", op.instance);
  if (op.quantizer >= 0)
    line += fmt::format(" quantizer \"{}\"", s.quantizers.at(op.quantizer).name);
  for (size_t i = 0; i < op.results.size(); ++i)
    line += (i ? ", " : " : ") + type_string(s.value(op.results[i]).type);
  if (op.parts.empty()) {
    out += line + location(op.loc, sources) + "\n";
    return;
  }
  out += line + " {\n";
  for (const Operation& part : op.parts) print_op(s, part, names, sources, indent + "  ", out);
  out += indent + "}\n";
}

// ` quantized(rowwise, columnwise)`, and the column-wise copy's value once planned
// (` quantized(rowwise, columnwise = %7)`).
std::string quantized_string(const ValueNames& names, const QuantizedBoundary& b) {
  std::vector<std::string> usages;
  if (b.usages.rowwise) usages.emplace_back("rowwise");
  if (b.usages.columnwise)
    usages.push_back(b.columnwise == kNoValue
                         ? "columnwise"
                         : fmt::format("columnwise = {}", names[b.columnwise]));
  return fmt::format(" quantized({})", fmt::join(usages, ", "));
}

}  // namespace

std::string print_sequence(const Sequence& s, const SourceManager* sources) {
  const ValueNames names(s);
  std::string out = fmt::format("sequence @{}(", s.name);
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const Value& v = s.value(s.inputs[i]);
    out += fmt::format("{}{}: {}", i ? ", " : "", names[v.id], type_string(v.type));
    if (i == 0 && s.quantized_input) out += quantized_string(names, *s.quantized_input);
  }
  out += ") -> (";
  for (size_t i = 0; i < s.outputs.size(); ++i) {
    const Value& v = s.value(s.outputs[i].value);
    out += fmt::format("{}{} = {}: {}", i ? ", " : "", s.outputs[i].name, names[v.id],
                       type_string(v.type));
    if (i == 0 && s.quantized_output) out += quantized_string(names, *s.quantized_output);
  }
  out += ")\n";
  // A declared recipe is printed once at the top of the program; sequences name it.
  out += "    uses " + (s.recipe.name.empty() ? recipe_string(s.recipe) : s.recipe.name);
  if (s.fp8_weights) out += " fp8_weights";
  if (s.parallel.active())
    out += fmt::format(" parallel(tp = {}, sp = {})", s.parallel.tp, s.parallel.sp);
  out += " {\n";
  for (ValueId p : s.params) {
    const Value& v = s.value(p);
    out += fmt::format("  param {}: {}", names[v.id], type_string(v.type));
    if (v.shard.sharded())
      out += fmt::format(" shard(dim = {}{})", v.shard.dim,
                         v.shard.blocks > 1 ? fmt::format(", blocks = {}", v.shard.blocks) : "");
    out += "\n";
  }
  for (const QuantizerDecl& q : s.quantizers) {
    out += fmt::format(
        "  quantizer \"{}\": {} {} of {}{}{} {}\n", q.name, quantizer_role_name(q.role),
        dtype_name(q.format()), q.boundary ? "the caller (boundary)" : names[q.source],
        q.usages.rowwise ? " rowwise" : "",
        q.usages.columnwise ? fmt::format(" columnwise({})", plan::name(q.columnwise_layout)) : "",
        plan::quant_spec_string(q.spec));
  }
  Phase phase = Phase::Forward;
  for (const Operation& op : s.ops) {
    if (op.phase != phase) {
      phase = op.phase;
      out += fmt::format("  {}:\n", phase_name(phase));
    }
    print_op(s, op, names, sources, "  ", out);
  }
  out += "  return " + [&] {
    std::vector<ValueId> ids;
    for (const SequenceOutput& o : s.outputs) ids.push_back(o.value);
    return list(ids, names);
  }() + "\n";
  if (s.has_backward) {
    out += fmt::format("  gradients(outputs: {}) -> (inputs: {}; params: {})\n",
                       list(s.output_grads, names), list(s.input_grads, names),
                       list(s.param_grads, names));
  }
  out += "}\n";
  return out;
}

std::string print_fusion(const DeclaredFusion& fusion) {
  std::string steps;
  for (const DeclaredFusion::Step& step : fusion.steps) {
    steps += steps.empty() ? "" : "; ";
    // A pointwise op's backward is written with the op's name (its kind's name is the family's).
    const PointwiseDef* def = op_info(step.kind).pointwise;
    steps += !step.user_op.empty() ? step.user_op
             : def != nullptr      ? std::string(def->name)
                                   : std::string(op_info(step.kind).name);
    steps += step.optional ? "?" : "";
  }
  return fmt::format("fusion {}(phase = {}, priority = {}) {{ {} }}", fusion.name,
                     fusion.phase == Phase::Backward ? "backward" : "forward", fusion.priority,
                     steps);
}

std::string print_program(const Program& program, const SourceManager* sources) {
  std::string out;
  for (const Recipe& r : program.recipes)
    out += fmt::format("recipe {} = {}\n", r.name, recipe_string(r));
  for (const DeclaredFusion& f : program.fusions)
    out += print_fusion(f) + location(f.loc, sources) + "\n";
  for (const Sequence& s : program.sequences) {
    if (!out.empty()) out += "\n";
    out += print_sequence(s, sources);
  }
  return out;
}

}  // namespace opfuse::ir
