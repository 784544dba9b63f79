#include "ir/verifier.h"

#include <fmt/format.h>

#include <set>

#include "ir/rewrite.h"
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
  // A quantized input's column-wise copy: an input outside the signature (plan-quantization).
  if (s.quantized_input && s.quantized_input->columnwise != kNoValue) {
    const ValueId v = s.quantized_input->columnwise;
    if (v >= s.values.size() || s.values[v].kind != ValueKind::Input)
      bad(fmt::format("the quantized input's column-wise copy {} is not an input value", v));
    else
      defined[v] = true;
  }
  for (ValueId v : s.params) {
    if (v >= s.values.size() || s.values[v].kind != ValueKind::Param)
      bad(fmt::format("param {} is not a param value", v));
    else
      defined[v] = true;
  }
  for (ValueId v : s.output_grads) {
    if (v >= s.values.size() || s.values[v].kind != ValueKind::OutputGrad)
      bad(fmt::format("output gradient {} is not an output-gradient value", v));
    else
      defined[v] = true;
  }
  std::set<std::string> instances;
  bool seen_backward = false;
  // Checks one op (or a fused op's part): operands defined before use, results defined once and
  // produced by top-level op `top`, attributes as the table says, the shape rule for user ops.
  auto check_op = [&](auto& self, const Operation& op, size_t top,
                      const std::string& where) -> void {
    const OpInfo& info = op_info(op.kind);
    if (op.operands.empty() && op.kind != OpKind::Fused)
      bad(fmt::format("{} ({}) has no operands", where, info.name));
    for (ValueId v : op.operands) {
      if (v >= s.values.size())
        bad(fmt::format("{} ({}) uses undefined value {}", where, info.name, v));
      else if (!defined[v])
        bad(fmt::format("{} ({}) uses value {} before it is defined", where, info.name, v));
      else if (op.phase == Phase::Forward && s.values[v].kind == ValueKind::OutputGrad)
        bad(fmt::format("{} ({}) is a forward op but uses a gradient", where, info.name));
    }
    if (op.attrs.size() != info.attrs.size()) {
      bad(fmt::format("{} ({}) has {} attributes, the table says {}", where, info.name,
                      op.attrs.size(), info.attrs.size()));
    } else {
      for (size_t a = 0; a < op.attrs.size(); ++a)
        if (op.attrs[a].name != info.attrs[a].name)
          bad(fmt::format("{} ({}) attribute {} is '{}', expected '{}'", where, info.name, a,
                          op.attrs[a].name, info.attrs[a].name));
    }
    if (op.quantizer >= int32_t(s.quantizers.size()))
      bad(fmt::format("{} ({}) names quantizer {} of {}", where, info.name, op.quantizer,
                      s.quantizers.size()));
    if (op.kind == OpKind::Fused) {
      if (op.parts.size() < 2) bad(fmt::format("{} fuses {} ops", where, op.parts.size()));
      for (size_t p = 0; p < op.parts.size(); ++p) {
        if (op.parts[p].kind == OpKind::Fused) bad(fmt::format("{} nests a fused op", where));
        if (op.parts[p].phase != op.phase) bad(fmt::format("{} mixes phases", where));
        self(self, op.parts[p], top, fmt::format("{} part {}", where, p));
      }
      for (ValueId r : op.results)
        if (r < s.values.size() && !defined[r])
          bad(fmt::format("{} returns value {} that no part makes", where, r));
      return;
    }
    if (op.results.empty() && op.kind != OpKind::TensorStats && op.kind != OpKind::TensorCapture)
      bad(fmt::format("{} ({}) has no results", where, info.name));
    for (ValueId r : op.results) {
      if (r >= s.values.size()) {
        bad(fmt::format("{} defines undefined value {}", where, r));
        continue;
      }
      if (defined[r]) bad(fmt::format("{} redefines value {}", where, r));
      if (s.values[r].producer != int32_t(top))
        bad(fmt::format("value {} names producer {}, not {}", r, s.values[r].producer, top));
      defined[r] = true;
    }
    if (op.kind == OpKind::CastFp8 && problems.empty() && op.attrs.size() == info.attrs.size()) {
      const Shape& in = s.values[op.operands[0]].type.shape;
      std::vector<Shape> want;
      if (attr_bool(op.attrs, "rowwise")) want.push_back(in);
      const bool transposed =
          op.quantizer >= 0 && size_t(op.quantizer) < s.quantizers.size() &&
          s.quantizers[size_t(op.quantizer)].columnwise_layout == plan::CopyLayout::Transposed;
      if (attr_bool(op.attrs, "columnwise")) want.push_back(transposed ? transposed_shape(in) : in);
      bool ok = want.size() == op.results.size();
      for (size_t r = 0; ok && r < want.size(); ++r)
        ok = s.values[op.results[r]].type.shape == want[r] &&
             dtype_is_fp8(s.values[op.results[r]].type.dtype);
      if (!ok)
        bad(fmt::format("{} (cast_fp8) results do not match its input and attributes", where));
    }
    if (op.kind == OpKind::Fp8Transpose && problems.empty()) {
      const Value& in = s.values[op.operands.at(0)];
      const bool ok = op.results.size() == 1 && dtype_is_fp8(in.type.dtype) && in.quantizer >= 0 &&
                      op.quantizer == in.quantizer &&
                      s.values[op.results[0]].quantizer == in.quantizer &&
                      s.values[op.results[0]].type ==
                          TensorType{in.type.dtype, transposed_shape(in.type.shape)};
      if (!ok)
        bad(
            fmt::format("{} (fp8_transpose) is not the transposed copy of an FP8 value under its "
                        "quantizer",
                        where));
    }
    if (op.kind == OpKind::EmulatedCast && problems.empty()) {
      const Value& in = s.values[op.operands.at(0)];
      const bool quantizer =
          op.results.size() == 1 && op.quantizer >= 0 && size_t(op.quantizer) < s.quantizers.size();
      const QuantizerDecl* q = quantizer ? &s.quantizers[size_t(op.quantizer)] : nullptr;
      const Value* out = quantizer ? &s.values[op.results[0]] : nullptr;
      // Note "Quantized boundaries": a micro-scaled quantized output's codes (the result carries
      // the quantizer), or a quantized input's codes decoded (the operand does).
      const bool codes_out =
          q && out->quantizer == op.quantizer && q->spec.micro_scaled() &&
          out->type.dtype == q->format() && in.quantizer < 0 &&
          (out->type.shape == in.type.shape || out->type.shape == transposed_shape(in.type.shape));
      const bool codes_in = q && in.quantizer == op.quantizer && q->boundary &&
                            q->spec.micro_scaled() && in.type.dtype == q->format() &&
                            out->quantizer < 0 && !dtype_is_fp8(out->type.dtype);
      const bool decoded = q && (q->spec.micro_scaled() || q->spec.block_scaled()) &&
                           !dtype_is_fp8(in.type.dtype) && in.quantizer < 0 && out->type == in.type;
      if (!codes_out && !codes_in && !decoded)
        bad(
            fmt::format("{} (emulated_cast) is not a decoded copy of a high-precision value under "
                        "a micro-scaled or block-scaled quantizer, nor a quantized boundary's "
                        "codes made or decoded",
                        where));
    }
    // Re-run the shape rule: a pass must never leave an op whose result type disagrees with it.
    if (problems.empty() && info.shape_rule != nullptr && op.attrs.size() == info.attrs.size() &&
        !op.results.empty() && op.phase == Phase::Forward) {
      const TensorType* extra = nullptr;
      if (op.kind == OpKind::AddExtraInput && !op.operands.empty())
        extra = &s.values[op.operands.back()].type;
      ShapeInput in{s.values[op.operands[0]].type, op.attrs, extra};
      // A linear's attributes are the rank's features once built; collectives scale by tp.
      in.tp = op.kind == OpKind::Linear ? 1 : s.parallel.tp;
      ShapeResult r = info.shape_rule(in);
      if (!r.errors.empty())
        bad(fmt::format("{} ({}) fails its shape rule: {}", where, info.name, r.errors[0].message));
      else if (!(r.out.shape == s.values[op.results[0]].type.shape) ||
               (!dtype_is_fp8(s.values[op.operands[0]].type.dtype) &&
                r.out.dtype != s.values[op.results[0]].type.dtype))  // FP8 GEMMs output bf16
        bad(fmt::format("{} ({}) result is {}, its shape rule gives {}", where, info.name,
                        type_string(s.values[op.results[0]].type), type_string(r.out)));
    }
  };
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const Operation& op = s.ops[i];
    if (!instances.insert(fmt::format("{}/{}", op.instance, phase_name(op.phase))).second &&
        op.phase == Phase::Forward && op.kind != OpKind::CastFp8 &&
        op.kind != OpKind::Fp8Transpose && op.kind != OpKind::EmulatedCast)
      bad(fmt::format("op {} repeats the layer name '{}'", i, op.instance));
    if (op.phase == Phase::Backward) seen_backward = true;
    if (op.phase == Phase::Forward && seen_backward)
      bad(fmt::format("forward op {} comes after a backward op", i));
    check_op(check_op, op, i, fmt::format("op {}", i));
  }
  for (const SequenceOutput& o : s.outputs)
    if (o.value >= s.values.size() || !defined[o.value])
      bad(fmt::format("output '{}' is not a defined value", o.name));
  if (s.has_backward) {
    if (s.output_grads.size() != s.outputs.size() || s.input_grads.size() != s.inputs.size() ||
        s.param_grads.size() != s.params.size())
      bad("gradient lists do not match the outputs, inputs and params");
    auto check_grad = [&](ValueId g, ValueId of, const char* what) {
      if (g >= s.values.size() || !defined[g])
        bad(fmt::format("the gradient of {} '{}' is not a defined value", what,
                        s.values.at(of).name));
      else if (!(s.values[g].type.shape == s.values[of].type.shape))
        bad(fmt::format("the gradient of {} '{}' has type {}", what, s.values[of].name,
                        type_string(s.values[g].type)));
    };
    // An input no op reads (an extra input never added: a warning) has no gradient op: its
    // gradient is zero (the CPU reference's zeros; a GPU session has no input_grad for it).
    for (size_t i = 0; i < s.input_grads.size() && i < s.inputs.size(); ++i)
      if (s.input_grads[i] != kNoValue) check_grad(s.input_grads[i], s.inputs[i], "input");
    for (size_t i = 0; i < s.param_grads.size() && i < s.params.size(); ++i)
      check_grad(s.param_grads[i], s.params[i], "param");
  }
  for (const QuantizerDecl& q : s.quantizers)
    if (q.boundary ? q.source != kNoValue : q.source >= s.values.size())
      bad(fmt::format("quantizer '{}' {}", q.name,
                      q.boundary ? "is a quantized input's but has a source" : "has no source"));
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
