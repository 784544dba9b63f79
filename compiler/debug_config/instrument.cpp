#include "debug_config/instrument.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "debug_config/stat_request.h"

namespace opfuse::debug {

namespace {

constexpr GemmRole kGemms[] = {GemmRole::Fprop, GemmRole::Dgrad, GemmRole::Wgrad};

const LayerRouting* find_layer(const Routing& routing, const std::string& name) {
  for (const LayerRouting& l : routing.layers)
    if (l.layer == name) return &l;
  return nullptr;
}

// The statistics LogTensorStats asks of `tensor` of `layer`, parsed (checked when read).
std::vector<StatRequest> tensor_stats(const FeatureConfig& f, TensorKind tensor) {
  std::vector<StatRequest> out;
  const Settings* s = f.find(std::nullopt, tensor);
  if (!s) return out;
  for (const ConfigNode* entry : s->stats()) {
    std::string error, hint;
    if (auto r = parse_stat_request(*entry, StatFamily::Tensor, error, hint)) out.push_back(*r);
  }
  return out;
}

void apply_to_layer(ir::Sequence& seq, const LayerRouting& l, std::vector<std::string>& refused) {
  for (size_t gi = 0; gi < 3; ++gi) {
    const GemmRouting& g = l.gemms[gi];
    const GemmRole gemm = kGemms[gi];
    if (l.recipe_quantized && !g.quantized) {
      ir::QuantOverride o;
      o.layer = l.layer;
      o.gemm = gemm;
      o.high_precision = true;
      seq.quant_overrides.push_back(std::move(o));
    }
    for (size_t k = 0; k < 2; ++k) {
      const FeatureConfig* m = g.modifiers[k];
      if (!m) continue;
      const TensorKind tensor = operands_of(gemm)[k];
      const std::optional<Modification>& mod = g.modifications[k];
      if (!mod) {
        refused.push_back(fmt::format(
            "{} (layer '{}', {} of {}): modify_tensor_enabled says yes but modify_tensor "
            "returns no modification",
            m->name, l.layer, plan::name(tensor), plan::name(gemm)));
        continue;
      }
      const std::string error =
          add_modification(seq, l.layer, gemm, tensor, g.quantized, m->name, *mod);
      if (!error.empty()) refused.push_back(error);
    }
  }
  for (const TensorKind t : plan::all_values<TensorKind>()) {
    for (const FeatureConfig* f : l.inspectors[size_t(t)]) {
      if (f->feature->spec().name != "LogTensorStats") {
        refused.push_back(
            fmt::format("{} (layer '{}', {}): not executed yet", f->name, l.layer, plan::name(t)));
        continue;
      }
      // One record for the moments, one per block configuration.
      std::set<std::pair<int, int>> blocks;
      for (const StatRequest& r : tensor_stats(*f, t)) {
        if (r.kind == StatKind::MaxBlockwiseDynamicRange) blocks.insert({r.block_size, r.dims});
      }
      const std::string tensor(plan::name(t));
      seq.inspections.push_back({l.layer, tensor, 0, 1});
      for (const auto& [size, dims] : blocks)
        seq.inspections.push_back({l.layer, tensor, size, dims});
    }
  }
}

}  // namespace

std::vector<std::string> apply_routing(ir::Program& program, const Routing& routing) {
  std::vector<std::string> refused;
  for (ir::Sequence& seq : program.sequences) {
    for (const ir::Operation& op : seq.ops) {
      if (op.kind != ir::OpKind::Linear || op.phase != ir::Phase::Forward) continue;
      const LayerRouting* l = find_layer(routing, op.instance);
      if (l && l->active()) apply_to_layer(seq, *l, refused);
    }
  }
  return refused;
}

void IterationStats::add_run(std::span<const plan::StatSlot> slots,
                             std::span<const TensorMoments> records) {
  for (size_t i = 0; i < slots.size() && i < records.size(); ++i) {
    auto it = std::find_if(merged_.begin(), merged_.end(),
                           [&](const auto& m) { return m.first == slots[i]; });
    if (it == merged_.end()) {
      merged_.emplace_back(slots[i], records[i]);
    } else if (slots[i].tensor != "weight") {  // a weight is the same tensor in every run
      it->second = merge(it->second, records[i]);
    }
  }
}

void IterationStats::log(const Routing& routing, int64_t iteration, StatLog& out) const {
  for (const auto& entry : merged_) {
    // References, not a structured binding: the lambda below captures `slot` (clang 14 cannot
    // capture bindings).
    const plan::StatSlot& slot = entry.first;
    const TensorMoments& moments = entry.second;
    if (slot.block_size != 0) continue;  // logged with the slot of its tensor's moments
    const LayerRouting* l = find_layer(routing, slot.layer);
    const auto t = plan::parse<TensorKind>(slot.tensor);
    if (!l || !t) continue;
    for (const FeatureConfig* f : l->inspectors[size_t(*t)]) {
      if (f->feature->spec().name != "LogTensorStats") continue;
      for (const StatRequest& r : tensor_stats(*f, *t)) {
        double v = 0;
        if (r.kind == StatKind::MaxBlockwiseDynamicRange) {
          const auto b = std::find_if(merged_.begin(), merged_.end(), [&](const auto& m) {
            return m.first.layer == slot.layer && m.first.tensor == slot.tensor &&
                   m.first.block_size == r.block_size && m.first.dims == r.dims;
          });
          if (b == merged_.end()) continue;
          v = b->second.max_blockwise_dynamic_range;
        } else {
          v = value(moments, r.kind);
        }
        out.add(StatRecord{slot.layer, slot.tensor, "", r.name, iteration, v});
      }
    }
  }
}

}  // namespace opfuse::debug
