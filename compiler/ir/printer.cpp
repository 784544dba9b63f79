#include "ir/printer.h"

#include <fmt/format.h>

namespace opfuse::ir {

namespace {

// Inputs print as %name, parameters as %instance.role, op results as %0, %1, ... in order.
class ValueNames {
 public:
  explicit ValueNames(const Sequence& s) : names_(s.values.size()) {
    int next = 0;
    for (const Value& v : s.values) {
      names_[v.id] = v.kind == ValueKind::Result ? fmt::format("%{}", next++) : "%" + v.name;
    }
  }
  const std::string& operator[](ValueId id) const { return names_.at(id); }

 private:
  std::vector<std::string> names_;
};

std::string location(const SourceLoc& loc, const SourceManager* sources) {
  if (!sources || !loc.valid() || loc.file >= sources->file_count()) return {};
  return fmt::format("  // {}:{}", sources->base_name(loc.file), loc.line);
}

}  // namespace

std::string print_sequence(const Sequence& s, const SourceManager* sources) {
  const ValueNames names(s);
  std::string out = fmt::format("sequence @{}(", s.name);
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const Value& v = s.value(s.inputs[i]);
    out += fmt::format("{}{}: {}", i ? ", " : "", names[v.id], type_string(v.type));
  }
  out += ") -> (";
  for (size_t i = 0; i < s.outputs.size(); ++i) {
    const Value& v = s.value(s.outputs[i].value);
    out += fmt::format("{}{} = {}: {}", i ? ", " : "", s.outputs[i].name, names[v.id],
                       type_string(v.type));
  }
  out += ")\n";
  // A declared recipe is printed once at the top of the program; sequences name it.
  out += "    uses " + (s.recipe.name.empty() ? recipe_string(s.recipe) : s.recipe.name);
  if (s.fp8_weights) out += " fp8_weights";
  out += " {\n";
  for (ValueId p : s.params) {
    const Value& v = s.value(p);
    out += fmt::format("  param {}: {}\n", names[v.id], type_string(v.type));
  }
  for (const Operation& op : s.ops) {
    std::string line = "  ";
    for (size_t i = 0; i < op.results.size(); ++i) line += (i ? ", " : "") + names[op.results[i]];
    line += fmt::format(" = {}(", op_info(op.kind).name);
    for (size_t i = 0; i < op.operands.size(); ++i) line += (i ? ", " : "") + names[op.operands[i]];
    line += ")";
    if (!op.attrs.empty()) {
      line += " {";
      for (size_t i = 0; i < op.attrs.size(); ++i)
        line += fmt::format("{}{} = {}", i ? ", " : "", op.attrs[i].name,
                            attr_value_string(op.attrs[i].value));
      line += "}";
    }
    line += fmt::format(" as \"{}\"", op.instance);
    if (!op.results.empty()) line += " : " + type_string(s.value(op.results[0]).type);
    line += location(op.loc, sources);
    out += line + "\n";
  }
  out += "  return";
  for (size_t i = 0; i < s.outputs.size(); ++i) out += (i ? ", " : " ") + names[s.outputs[i].value];
  out += "\n}\n";
  return out;
}

std::string print_program(const Program& program, const SourceManager* sources) {
  std::string out;
  for (const Recipe& r : program.recipes)
    out += fmt::format("recipe {} = {}\n", r.name, recipe_string(r));
  for (const Sequence& s : program.sequences) {
    if (!out.empty()) out += "\n";
    out += print_sequence(s, sources);
  }
  return out;
}

}  // namespace opfuse::ir
