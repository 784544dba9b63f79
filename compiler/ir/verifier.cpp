#include "ir/verifier.h"

#include <fmt/format.h>

#include <set>

#include "support/assert.h"

namespace opfuse::ir {

std::vector<std::string> verify_sequence(const Sequence& s) {
  std::vector<std::string> problems;
  auto bad = [&](std::string msg) {
    problems.push_back(fmt::format("sequence '{}': {}", s.name, std::move(msg)));
  };

  for (size_t i = 0; i < s.values.size(); ++i)
    if (s.values[i].id != i) bad(fmt::format("value {} has id {}", i, s.values[i].id));
  if (s.inputs.empty()) bad("no inputs");
  if (s.outputs.empty()) bad("no outputs");

  std::vector<bool> defined(s.values.size(), false);
  for (ValueId v : s.inputs) {
    if (v >= s.values.size() || s.values[v].kind != ValueKind::Input)
      bad(fmt::format("input {} is not an input value", v));
    else
      defined[v] = true;
  }
  for (ValueId v : s.params) {
    if (v >= s.values.size() || s.values[v].kind != ValueKind::Param)
      bad(fmt::format("param {} is not a param value", v));
    else
      defined[v] = true;
  }
  std::set<std::string> instances;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const Operation& op = s.ops[i];
    const OpInfo& info = op_info(op.kind);
    if (!instances.insert(op.instance).second)
      bad(fmt::format("op {} repeats the layer name '{}'", i, op.instance));
    if (op.operands.empty()) bad(fmt::format("op {} ({}) has no operands", i, info.name));
    for (ValueId v : op.operands) {
      if (v >= s.values.size())
        bad(fmt::format("op {} ({}) uses undefined value {}", i, info.name, v));
      else if (!defined[v])
        bad(fmt::format("op {} ({}) uses value {} before it is defined", i, info.name, v));
    }
    if (op.attrs.size() != info.attrs.size()) {
      bad(fmt::format("op {} ({}) has {} attributes, the table says {}", i, info.name,
                      op.attrs.size(), info.attrs.size()));
    } else {
      for (size_t a = 0; a < op.attrs.size(); ++a)
        if (op.attrs[a].name != info.attrs[a].name)
          bad(fmt::format("op {} ({}) attribute {} is '{}', expected '{}'", i, info.name, a,
                          op.attrs[a].name, info.attrs[a].name));
    }
    for (ValueId r : op.results) {
      if (r >= s.values.size()) {
        bad(fmt::format("op {} defines undefined value {}", i, r));
        continue;
      }
      if (defined[r]) bad(fmt::format("op {} redefines value {}", i, r));
      if (s.values[r].producer != int32_t(i))
        bad(fmt::format("value {} names producer {}, not {}", r, s.values[r].producer, i));
      defined[r] = true;
    }
    // Re-run the shape rule: a pass must never leave an op whose result type disagrees with it.
    if (problems.empty() && op.attrs.size() == info.attrs.size() && !op.results.empty()) {
      const TensorType* extra = nullptr;
      if (op.kind == OpKind::AddExtraInput && !op.operands.empty())
        extra = &s.values[op.operands.back()].type;
      ShapeResult r = info.shape_rule(ShapeInput{s.values[op.operands[0]].type, op.attrs, extra});
      if (!r.errors.empty())
        bad(fmt::format("op {} ({}) fails its shape rule: {}", i, info.name, r.errors[0].message));
      else if (!(r.out == s.values[op.results[0]].type))
        bad(fmt::format("op {} ({}) result is {}, its shape rule gives {}", i, info.name,
                        type_string(s.values[op.results[0]].type), type_string(r.out)));
    }
  }
  for (const SequenceOutput& o : s.outputs)
    if (o.value >= s.values.size() || !defined[o.value])
      bad(fmt::format("output '{}' is not a defined value", o.name));
  return problems;
}

void verify_program_or_throw(const Program& program, const char* after_what) {
  std::string all;
  for (const Sequence& s : program.sequences)
    for (const std::string& p : verify_sequence(s)) all += "\n  " + p;
  if (!all.empty())
    internal_failure(__FILE__, __LINE__,
                     fmt::format("IR verification failed after {}:{}", after_what, all));
}

}  // namespace opfuse::ir
