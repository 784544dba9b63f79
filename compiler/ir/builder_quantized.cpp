// The IR builder's quantized inputs and outputs (docs/language.md, "Quantized inputs and
// outputs"; note "Quantized boundaries" in docs/architecture.md): a sequence may end with a
// `quantize` whose FP8 copies leave it as they are, and a sequence may start from such copies
// with linears that read them without casting again. What is checked here, located: the
// declaration itself, what the recipe can carry, that the output comes from a `quantize` and that
// only linears read the input (with the copies their GEMMs need), and that a producer and a
// consumer of the same name in one program agree on the format, the scales and the copies.

#include <fmt/format.h>

#include "ir/builder_impl.h"

namespace opfuse::ir::builder_detail {

namespace {

// How a recipe scales the tensor a linear reads (the quantizer of role input): the form a
// quantized boundary carries, as one phrase.
std::string boundary_scales(const Recipe& r) {
  if (r.kind == RecipeKind::Float8BlockScaling)
    return r.x_block == 2 ? "128x128 block scales" : "1x128 block scales";
  if (r.kind == RecipeKind::Mxfp8BlockScaling) return "MXFP8 1x32 E8M0 block scales";
  if (r.kind == RecipeKind::Nvfp4BlockScaling) {
    return r.rht ? "NVFP4 1x16 block scales, the column-wise copy Hadamard-transformed"
                 : "NVFP4 1x16 block scales";
  }
  return "one scale per tensor";
}

// The format of the codes a linear reads under recipe `r` (its input quantizer's).
DType boundary_format(const Recipe& r) {
  return r.kind == RecipeKind::Nvfp4BlockScaling ? DType::E2M1 : DType::E4M3;
}

std::string usages_string(const plan::Usages& u) {
  if (u.rowwise && u.columnwise) return "rowwise, columnwise";
  return u.rowwise ? "rowwise" : "columnwise";
}

}  // namespace

std::optional<QuantizedBoundary> Builder::quantized_boundary(const dsl::Param& p, bool input,
                                                             bool main) {
  const dsl::QuantizedExpr& q = *p.quantized;
  if (!main) {
    diags_.error(q.loc,
                 fmt::format("only the main {} of a sequence can be quantized, not the extra {} "
                             "'{}'",
                             input ? "input" : "output", input ? "input" : "output", p.name),
                 "pass it in bf16, or make it the first one");
    return std::nullopt;
  }
  QuantizedBoundary b;
  b.loc = q.loc;
  b.format = p.type.dtype == "e5m2"   ? DType::E5M2
             : p.type.dtype == "e2m1" ? DType::E2M1
                                      : DType::E4M3;
  bool ok = true;
  for (const auto& [name, loc] : q.usages) {
    bool* usage = name == "rowwise"      ? &b.usages.rowwise
                  : name == "columnwise" ? &b.usages.columnwise
                                         : nullptr;
    if (usage == nullptr) {
      diags_.error(loc,
                   fmt::format("unknown usage '{}' of quantized {} '{}'", name,
                               input ? "input" : "output", p.name),
                   "the usages are rowwise and columnwise");
      ok = false;
    } else if (*usage) {
      diags_.error(loc, fmt::format("usage '{}' is given twice", name));
      ok = false;
    } else {
      *usage = true;
    }
  }
  if (ok && !b.usages.rowwise) {
    diags_.error(
        q.loc,
        fmt::format("quantized {} '{}' has no row-wise copy", input ? "input" : "output", p.name),
        "the forward GEMM reads the row-wise copy: write quantized(rowwise, columnwise)");
    ok = false;
  }
  if (!ok) return std::nullopt;
  return b;
}

bool Builder::check_quantized_boundaries(SequenceScope& sc, const dsl::SequenceDecl& d) {
  Sequence& s = sc.seq;
  bool ok = true;
  for (std::optional<QuantizedBoundary>* boundary : {&s.quantized_input, &s.quantized_output}) {
    if (!boundary->has_value()) continue;
    const QuantizedBoundary& b = **boundary;
    const bool input = boundary == &s.quantized_input;
    const std::string name = input ? s.value(s.inputs[0]).name : s.outputs[0].name;
    const std::string what = fmt::format("quantized {} '{}'", input ? "input" : "output", name);
    // As TE's Quantize outside fp8_autocast: no FP8 recipe, no FP8 tensor. The program still
    // runs (under --recipe bf16, say), the tensor passing in bf16.
    if (!s.recipe.is_fp8()) {
      diags_.warning(b.loc,
                     fmt::format("the {} of sequence '{}' passes in bf16: the sequence uses the "
                                 "bf16 recipe",
                                 what, s.name),
                     "quantized boundaries need an FP8 or FP4 recipe");
      boundary->reset();
      continue;
    }
    if (b.format != boundary_format(s.recipe)) {
      const std::string want(dtype_name(boundary_format(s.recipe)));
      diags_.error(b.loc,
                   fmt::format("the {} is declared {}, but recipe '{}' quantizes the tensors "
                               "linears read to {}",
                               what, dtype_name(b.format), s.recipe.name, want),
                   fmt::format("declare it {}[...]", want));
      ok = false;
    }
    if (s.parallel.active()) {
      diags_.error(b.loc,
                   fmt::format("sequence '{}' is tensor-parallel; its {} would need FP8 "
                               "collectives at the boundary, which opfuse does not run",
                               s.name, what),
                   "pass it in bf16");
      ok = false;
    }
  }
  if (!ok) return false;

  if (s.quantized_output) {
    const QuantizedBoundary& b = *s.quantized_output;
    const ValueId out = s.outputs[0].value;
    const int32_t producer = s.value(out).producer;
    const Operation* op = producer >= 0 ? &s.ops[size_t(producer)] : nullptr;
    if (op != nullptr && op->kind == OpKind::Quantize && !attr_bool(op->attrs, "forward")) {
      diags_.error(op->loc,
                   fmt::format("output '{}' is declared quantized, but the quantize that ends "
                               "sequence '{}' quantizes no forward tensor (forward = false)",
                               s.outputs[0].name, d.name),
                   "write quantize() or quantize(backward = true)");
      ok = false;
    } else if (op == nullptr || op->kind != OpKind::Quantize) {
      diags_.error(b.loc,
                   fmt::format("output '{}' is declared quantized, but sequence '{}' ends with {}",
                               s.outputs[0].name, d.name,
                               op ? fmt::format("'{}'", op_info(op->kind).name) : "its input"),
                   "end the sequence with quantize(): it writes the copies the output carries");
      ok = false;
    }
    for (size_t i = 1; i < s.outputs.size(); ++i) {
      if (s.outputs[i].value != out) continue;
      diags_.error(s.outputs[i].loc,
                   fmt::format("extra output '{}' is the quantized main output '{}'",
                               s.outputs[i].name, s.outputs[0].name),
                   "move make_extra_output before the quantize");
      ok = false;
    }
  }

  if (s.quantized_input) {
    const QuantizedBoundary& b = *s.quantized_input;
    const ValueId in = s.inputs[0];
    const std::string& name = s.value(in).name;
    bool read = false;
    for (const Operation& op : s.ops)
      for (ValueId v : op.operands) read |= v == in;
    if (!read) {
      diags_.error(
          b.loc,
          fmt::format("quantized input '{}' of sequence '{}' is read by no op", name, d.name),
          "start the sequence with the linear that reads it");
      ok = false;
    }
    for (const Operation& op : s.ops) {
      for (size_t k = 0; k < op.operands.size(); ++k) {
        if (op.operands[k] != in) continue;
        if (op.kind == OpKind::Linear && k == 0) {
          if (linear_high_precision(op.attrs)) {
            diags_.error(op.loc,
                         fmt::format("linear '{}' runs in high precision (precision = high) but "
                                     "reads the quantized input '{}', whose FP8 copies only an "
                                     "FP8 GEMM takes",
                                     op.instance, name),
                         "leave out precision = high, or pass the input in bf16");
            ok = false;
            continue;
          }
          if (!b.usages.rowwise || !b.usages.columnwise) {
            diags_.error(b.loc,
                         fmt::format("linear '{}' reads '{}' in its forward (the row-wise copy) "
                                     "and its weight gradient (the column-wise copy), but the "
                                     "input carries only {}",
                                     op.instance, name, usages_string(b.usages)),
                         "declare it quantized(rowwise, columnwise)");
            ok = false;
          }
          continue;
        }
        diags_.error(op.loc,
                     fmt::format("'{}' reads the quantized input '{}': only linears read "
                                 "quantized tensors (their GEMMs take the FP8 copies as they are)",
                                 op_info(op.kind).name, name),
                     "pass the input in bf16, or start the sequence with the linear");
        diags_.note(b.loc, fmt::format("'{}' is declared quantized here", name));
        ok = false;
      }
    }
  }
  return ok;
}

// A quantized output and a quantized input of the same name in one program are one tensor passed
// between two sequences: the consumer must find the format, the scales and the copies it reads.
void Builder::check_quantized_pairs() {
  for (const Sequence& consumer : program_.sequences) {
    if (!consumer.quantized_input) continue;
    const Value& in = consumer.value(consumer.inputs[0]);
    for (const Sequence& producer : program_.sequences) {
      if (!producer.quantized_output || producer.outputs[0].name != in.name) continue;
      const QuantizedBoundary& made = *producer.quantized_output;
      const QuantizedBoundary& read = *consumer.quantized_input;
      std::string problem;
      const TensorType& out_type = producer.value(producer.outputs[0].value).type;
      if (!(out_type.shape == in.type.shape)) {
        problem =
            fmt::format("'{}' makes it {}, '{}' reads {}", producer.name,
                        shape_string(out_type.shape), consumer.name, shape_string(in.type.shape));
      } else if (made.format != read.format) {
        problem = fmt::format("'{}' makes it {}, '{}' reads {}", producer.name,
                              dtype_name(made.format), consumer.name, dtype_name(read.format));
      } else if (boundary_scales(producer.recipe) != boundary_scales(consumer.recipe)) {
        problem =
            fmt::format("'{}' makes it with {} (recipe '{}'), '{}' reads {} (recipe '{}')",
                        producer.name, boundary_scales(producer.recipe), producer.recipe.name,
                        consumer.name, boundary_scales(consumer.recipe), consumer.recipe.name);
      } else if ((read.usages.rowwise && !made.usages.rowwise) ||
                 (read.usages.columnwise && !made.usages.columnwise)) {
        problem =
            fmt::format("'{}' makes the copies ({}), '{}' reads ({})", producer.name,
                        usages_string(made.usages), consumer.name, usages_string(read.usages));
      }
      if (problem.empty()) continue;
      diags_.error(read.loc,
                   fmt::format("quantized input '{}' of sequence '{}' does not match the output "
                               "'{}' of sequence '{}': {}",
                               in.name, consumer.name, in.name, producer.name, problem),
                   "give both sides the same type, recipe scales and copies");
      diags_.note(made.loc, fmt::format("'{}' is made here", in.name));
    }
  }
}

}  // namespace opfuse::ir::builder_detail
