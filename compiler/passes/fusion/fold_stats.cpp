// Statistics fused into kernels (docs/debugging.md, "Statistics fused into kernels"): a debug
// config's LogTensorStats record of a whole tensor is computed by the tiled kernel that reads the
// tensor as its first input or produces it, instead of a kernel of its own reading it again. The
// patterns absorb the statistics of the results they keep inside a group (Step::stats_ok); this
// pass folds the rest into the kernel op that reads or writes their tensor anyway.
#include <algorithm>
#include <vector>

#include "ir/rewrite.h"
#include "passes/fusion/pattern.h"

namespace opfuse::passes::fusion {

namespace {

using namespace opfuse::ir;

// The tensors a kernel op can take statistics of: its tiled kernel's first input and the value
// it computes (kNoValue where it has none). The shapes are codegen's (note "Kernels by parts"):
// an activation (forward or backward) first, with casts, bias gradients and statistics after it;
// or a cast with bias gradients and statistics.
struct Taps {
  ValueId input = kNoValue;
  ValueId output = kNoValue;
};

Taps taps_of(const Sequence& seq, const Operation& op) {
  std::vector<const Operation*> parts;
  if (op.kind == OpKind::Fused) {
    for (const Operation& p : op.parts) parts.push_back(&p);
  } else {
    parts.push_back(&op);
  }
  const Operation* lead = nullptr;
  const Operation* cast = nullptr;
  for (const Operation* p : parts) {
    if (p->kind == OpKind::TensorStats || p->kind == OpKind::BiasGrad) continue;
    if (p->kind == OpKind::CastFp8) {
      // A block-scaled cast runs a kernel of its own without the statistics (kStats).
      if (cast != nullptr || !seq.quantizers.at(size_t(p->quantizer)).spec.per_tensor()) return {};
      cast = p;
    } else if ((is_pointwise(p->kind) || is_pointwise_backward(p->kind)) && lead == nullptr &&
               p == parts.front()) {
      lead = p;
    } else {
      return {};
    }
  }
  if (lead != nullptr) return {lead->operands.at(0), lead->results.at(0)};
  if (cast != nullptr) return {cast->operands.at(0), kNoValue};
  return {};
}

// Whether `op` already computes statistics of `v` (one record per tensor a kernel reads).
bool has_stats_of(const Operation& op, ValueId v) {
  return std::any_of(op.parts.begin(), op.parts.end(), [&](const Operation& p) {
    return p.kind == OpKind::TensorStats && p.operands.at(0) == v;
  });
}

// The op (index) whose kernel can compute the statistics `stats` asks for; -1: none. Never the
// cast of a parameter: the executor skips a weight's cast while its copy is valid (note "Weight
// cache" in runtime/gpu/plan_executor.cpp; under `with fp8_weights` it is cast only when the
// application says the weight changed), and a cast that also wrote statistics would have to run at
// every forward, recording the weight's amax there.
int host_of(const Sequence& s, const Operation& stats) {
  const ValueId v = stats.operands.at(0);
  if (std::find(s.params.begin(), s.params.end(), v) != s.params.end()) return -1;
  for (size_t j = 0; j < s.ops.size(); ++j) {
    const Operation& op = s.ops[j];
    if (op.phase != stats.phase || op.kind == OpKind::TensorStats) continue;
    const Taps taps = taps_of(s, op);
    if ((taps.input == v || taps.output == v) && !has_stats_of(op, v)) return int(j);
  }
  return -1;
}

}  // namespace

bool stats_can_fold(const Sequence& seq, const Operation& op) {
  if (op.kind != OpKind::TensorStats) return false;
  const auto slot = size_t(attr_int(op.attrs, "slot"));
  if (slot >= seq.inspections.size()) return false;
  const plan::StatSlot& s = seq.inspections[slot];
  if (s.record != plan::StatRecordKind::Moments || s.block_size != 0) return false;
  // LogFp8TensorStats of the same tensor reads this record (its current-scaling what-ifs take
  // the amax from it; codegen/emit_stats.cpp): it must be complete before that op runs, so it
  // stays an op of its own, in place.
  return std::none_of(seq.inspections.begin(), seq.inspections.end(), [&](const plan::StatSlot& q) {
    return q.record == plan::StatRecordKind::Quantized && q.layer == s.layer &&
           q.tensor == s.tensor;
  });
}

bool fold_stats(Sequence& seq, Phase phase) {
  bool changed = false;
  for (size_t i = 0; i < seq.ops.size();) {
    const Operation& stats = seq.ops[i];
    const int host = stats.phase == phase && stats_can_fold(seq, stats) ? host_of(seq, stats) : -1;
    if (host < 0) {
      ++i;
      continue;
    }
    Operation& k = seq.ops[size_t(host)];
    if (k.kind != OpKind::Fused) {
      // One kernel op becomes a group of it and the statistics it computes.
      Operation fused;
      fused.kind = OpKind::Fused;
      fused.phase = k.phase;
      fused.attrs = {{"pattern", std::string("stats")}};
      fused.instance = k.instance;
      fused.loc = k.loc;
      fused.operands = k.operands;
      fused.results = k.results;
      fused.parts.push_back(std::move(k));
      k = std::move(fused);
    }
    k.parts.push_back(std::move(seq.ops[i]));
    seq.ops.erase(seq.ops.begin() + std::ptrdiff_t(i));
    changed = true;
  }
  if (changed) recompute_producers(seq);
  return changed;
}

}  // namespace opfuse::passes::fusion
