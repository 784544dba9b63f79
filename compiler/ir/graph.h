// The IR: a program is a set of sequences; a sequence is a list of ops over SSA values.
// Values are created once and never reassigned; every op carries its .fuse location.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/op_table.h"
#include "ir/recipe.h"
#include "ir/types.h"
#include "support/source_manager.h"

namespace opfuse::ir {

using ValueId = uint32_t;

enum class ValueKind : uint8_t { Input, Param, Result };

struct Value {
  ValueId id = 0;
  ValueKind kind = ValueKind::Result;
  TensorType type;
  // Input: the signature name. Param: "<instance>.<role>" (e.g. "up_proj.weight"). Result: "".
  std::string name;
  int32_t producer = -1;  // index of the producing op for results
};

struct Operation {
  OpKind kind;
  std::vector<ValueId> operands;  // operands[0] is the main stream; then params; then extra input
  std::vector<ValueId> results;   // one result for every op kind today
  AttrList attrs;
  std::string instance;  // layer name: from `as NAME`, else "<op>_<k>" (k counts that op kind)
  SourceLoc loc;
};

struct SequenceOutput {
  std::string name;
  ValueId value = 0;
  SourceLoc loc;
};

struct Sequence {
  std::string name;
  SourceLoc loc;
  std::vector<ValueId> inputs;          // inputs[0] is the main stream; the rest are extra inputs
  std::vector<SequenceOutput> outputs;  // outputs[0] is the main stream's final value
  std::vector<ValueId> params;          // in order of creation
  std::vector<Operation> ops;
  std::vector<Value> values;  // indexed by ValueId
  Recipe recipe;
  bool fp8_weights = false;  // TE's quantized_model_init: weights stored in FP8 only

  const Value& value(ValueId id) const { return values.at(id); }
  // Symbolic dimensions used anywhere in the sequence, sorted (bound at run time).
  std::vector<std::string> symbols() const;
};

struct Program {
  std::vector<Sequence> sequences;
  std::vector<Recipe> recipes;  // declared recipes, in declaration order

  const Sequence* find_sequence(std::string_view name) const;
};

}  // namespace opfuse::ir
