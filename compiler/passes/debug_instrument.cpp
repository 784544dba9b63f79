#include "passes/debug_instrument.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "debug/names.h"
#include "ir/rewrite.h"

namespace opfuse::passes {

namespace {

using namespace opfuse::ir;

// Where a record's tensor is: the value, and the op it goes before (after = false) or after.
struct Place {
  ValueId value = kNoValue;
  int op = -1;
  bool after = false;
};

template <typename Slot>
Place place(const Sequence& s, const Slot& slot) {
  const int fprop = find_layer_op(s, OpKind::Linear, Phase::Forward, slot.layer);
  if (fprop < 0) return {};
  const Operation& f = s.ops[size_t(fprop)];
  if (slot.tensor == "activation") return {f.operands.at(0), fprop, false};
  if (slot.tensor == "weight") return {f.operands.at(1), fprop, false};
  if (slot.tensor == "output") return {f.results.at(0), fprop, true};
  const int dgrad = find_layer_op(s, OpKind::LinearDgrad, Phase::Backward, slot.layer);
  const int wgrad = find_layer_op(s, OpKind::LinearWgrad, Phase::Backward, slot.layer);
  if (slot.tensor == "dgrad" && dgrad >= 0)
    return {s.ops[size_t(dgrad)].results.at(0), dgrad, true};
  if (slot.tensor == "wgrad" && wgrad >= 0)
    return {s.ops[size_t(wgrad)].results.at(0), wgrad, true};
  if (slot.tensor == "gradient" && (dgrad >= 0 || wgrad >= 0)) {
    const int first = dgrad >= 0 && (wgrad < 0 || dgrad < wgrad) ? dgrad : wgrad;
    return {s.ops[size_t(first)].operands.at(0), first, false};
  }
  return {};
}

// Whether a slot is written by an op of its own: not an exponent histogram's part (the op of the
// Quantized record before it writes it).
bool has_op(const plan::StatSlot& slot) {
  return slot.record != plan::StatRecordKind::ExponentHistogram;
}
// A quantized capture reads an FP8 copy, which plan-quantization makes later
// (debug_capture_quantized).
bool has_op(const plan::CaptureSlot& slot) { return !slot.quantized; }

// One op of `kind` reading the tensor of each of `slots`, collected by the op it goes before or
// after; `slots` keeps the placed ones (slot = index).
template <typename Slot>
void place_all(const Sequence& s, OpKind kind, const char* suffix, std::vector<Slot>& slots,
               std::map<int, std::vector<Operation>>& before,
               std::map<int, std::vector<Operation>>& after) {
  std::vector<Slot> kept;
  for (const Slot& slot : slots) {
    const Place p = place(s, slot);
    if (p.value == kNoValue) continue;
    if (!has_op(slot)) {
      kept.push_back(slot);
      continue;
    }
    Operation op;
    op.kind = kind;
    op.phase = s.ops[size_t(p.op)].phase;
    op.operands = {p.value};
    op.attrs = {{"slot", int64_t(kept.size())}};
    // Unique per record: a tensor with block statistics has several.
    op.instance = fmt::format("{}.{}_{}{}", slot.layer, slot.tensor, suffix, kept.size());
    op.loc = s.ops[size_t(p.op)].loc;
    (p.after ? after : before)[p.op].push_back(std::move(op));
    kept.push_back(slot);
  }
  slots = std::move(kept);
}

bool instrument(Sequence& s) {
  if (s.inspections.empty() && s.captures.empty()) return false;
  std::map<int, std::vector<Operation>> before, after;  // by op index, statistics then captures
  place_all(s, OpKind::TensorStats, "stats", s.inspections, before, after);
  place_all(s, OpKind::TensorCapture, "capture", s.captures, before, after);
  std::vector<Operation> ops;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    for (Operation& op : before[int(i)]) ops.push_back(std::move(op));
    ops.push_back(std::move(s.ops[i]));
    for (Operation& op : after[int(i)]) ops.push_back(std::move(op));
  }
  s.ops = std::move(ops);
  recompute_producers(s);
  return true;
}

bool capture_quantized(Sequence& s) {
  std::map<int, std::vector<Operation>> before;
  // Slots whose copy does not exist (a first layer whose backward computes no input gradient,
  // hence no dgrad reading the gradient's copy; plan-quantization disabled): dropped, as TE has
  // no quantized tensor there.
  std::vector<int64_t> renumber(s.captures.size());
  std::vector<plan::CaptureSlot> kept;
  for (size_t slot = 0; slot < s.captures.size(); ++slot) {
    plan::CaptureSlot c = s.captures[slot];
    renumber[slot] = int64_t(kept.size());
    if (!c.quantized) {
      kept.push_back(std::move(c));
      continue;
    }
    // The GEMM reading the copy, and which of its operands the copy is (debug::operands_of: the
    // IR's order, fprop (x, W), dgrad (dy, W^T), wgrad (dy^T, x^T)).
    const std::optional<debug::TensorKind> tensor = plan::parse<debug::TensorKind>(c.tensor);
    if (!tensor) continue;
    // debug::gemms_of: the reader of the row-wise copy first, then the column-wise one's.
    const plan::GemmRole reader = debug::gemms_of(*tensor)[c.columnwise ? 1 : 0];
    const auto operands = debug::operands_of(reader);
    const size_t operand =
        size_t(std::find(operands.begin(), operands.end(), *tensor) - operands.begin());
    const OpKind kind = reader == plan::GemmRole::Fprop   ? OpKind::Linear
                        : reader == plan::GemmRole::Dgrad ? OpKind::LinearDgrad
                                                          : OpKind::LinearWgrad;
    const int gemm =
        find_layer_op(s, kind, kind == OpKind::Linear ? Phase::Forward : Phase::Backward, c.layer);
    if (gemm < 0 || operand >= operands.size()) continue;
    const Operation& g = s.ops[size_t(gemm)];
    const ValueId copy = g.operands.at(operand);
    const Value& v = s.value(copy);
    if (v.quantizer < 0 || !dtype_is_fp8(v.type.dtype)) continue;
    c.format = v.type.dtype;
    const plan::QuantSpec& spec = s.quantizers.at(size_t(v.quantizer)).spec;
    if (!spec.per_tensor()) c.block = spec.block;
    const int64_t index = int64_t(kept.size());
    kept.push_back(c);
    Operation op;
    op.kind = OpKind::TensorCapture;
    op.phase = g.phase;
    op.operands = {copy};
    op.quantizer = v.quantizer;
    op.attrs = {{"slot", index}};
    op.instance = fmt::format("{}.{}_quantized{}_capture{}", c.layer, c.tensor,
                              c.columnwise ? "_columnwise" : "", index);
    op.loc = g.loc;
    before[gemm].push_back(std::move(op));
  }
  if (kept.size() == s.captures.size() && before.empty()) return false;
  std::vector<Operation> ops;
  for (size_t i = 0; i < s.ops.size(); ++i) {
    for (Operation& op : before[int(i)]) ops.push_back(std::move(op));
    Operation& op = s.ops[i];
    if (op.kind == OpKind::TensorCapture)
      op.attrs = {{"slot", renumber.at(size_t(attr_int(op.attrs, "slot")))}};
    ops.push_back(std::move(op));
  }
  s.ops = std::move(ops);
  s.captures = std::move(kept);
  recompute_producers(s);
  return true;
}

}  // namespace

bool debug_capture_quantized(Program& program) {
  bool changed = false;
  for (Sequence& s : program.sequences) changed |= capture_quantized(s);
  return changed;
}

bool debug_instrument(Program& program) {
  bool changed = false;
  for (Sequence& s : program.sequences) changed |= instrument(s);
  return changed;
}

}  // namespace opfuse::passes
