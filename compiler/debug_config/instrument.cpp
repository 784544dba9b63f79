#include "debug_config/instrument.h"

#include <algorithm>
#include <array>
#include <bit>
#include <set>

#include <fmt/format.h>

#include "debug_config/captures.h"
#include "debug_config/modification.h"
#include "debug_config/stat_request.h"
#include "passes/plan_quantization.h"

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

// The statistics LogFp8TensorStats asks of `tensor`, parsed (checked when read).
std::vector<StatRequest> quant_stats(const FeatureConfig& f, TensorKind tensor) {
  std::vector<StatRequest> out;
  const Settings* s = f.find(std::nullopt, tensor);
  if (!s) return out;
  for (const ConfigNode* entry : s->stats()) {
    std::string error, hint;
    if (auto r = parse_stat_request(*entry, StatFamily::Quantized, error, hint)) out.push_back(*r);
  }
  return out;
}

// The Quantized record a LogFp8TensorStats request of `tensor` reads (its format left E4M3:
// matches() ignores it). The layer's own quantizer answers both a bare statistic and
// fp8_delayed_scaling_ (TE computes that what-if with the layer's delayed quantizer); a
// per-tensor scale has one record for both copies (they hold the same values), as has a weight's
// 128x128 blocks (its column-wise copy is the transposed blocks).
plan::StatSlot quant_slot(const std::string& layer, TensorKind tensor, const StatRequest& r) {
  plan::StatSlot s{layer, std::string(plan::name(tensor)), 0, 1};
  s.record = plan::StatRecordKind::Quantized;
  const plan::ScalingKind recipe = r.recipe.value_or(plan::ScalingKind::Delayed);
  if (recipe == plan::ScalingKind::Current) {
    s.cast = plan::QuantStatCast::Current;
  } else if (recipe == plan::ScalingKind::Block1D) {
    s.cast = plan::QuantStatCast::Float8Block;
    s.block_size = 128;
    s.dims = tensor == TensorKind::Weight ? 2 : 1;
    s.columnwise = r.columnwise && s.dims == 1;
  } else if (recipe == plan::ScalingKind::MicroScaled) {
    s.cast = plan::QuantStatCast::Mxfp8;
    s.block_size = 32;
    s.columnwise = r.columnwise;
  }
  return s;
}

bool matches(const plan::StatSlot& slot, const plan::StatSlot& want) {
  return slot.layer == want.layer && slot.tensor == want.tensor && slot.record == want.record &&
         slot.cast == want.cast && slot.block_size == want.block_size && slot.dims == want.dims &&
         slot.columnwise == want.columnwise;
}

// Adds `slot` unless there is one like it; a Quantized slot asking for its exponent histogram
// gets its parts right after it (plan::StatSlot::exponent_histogram), also when an earlier
// request made the slot without them.
void add_slot(ir::Sequence& seq, const plan::StatSlot& slot) {
  auto it = std::find_if(seq.inspections.begin(), seq.inspections.end(),
                         [&](const plan::StatSlot& s) { return matches(s, slot); });
  if (it == seq.inspections.end()) {
    seq.inspections.push_back(slot);
    it = seq.inspections.end() - 1;
  } else if (!slot.exponent_histogram || it->exponent_histogram) {
    return;
  }
  if (!slot.exponent_histogram) return;
  it->exponent_histogram = true;
  std::vector<plan::StatSlot> parts;
  for (int k = 0; k < kExponentHistogramRecords; ++k) {
    plan::StatSlot part = *it;
    part.record = plan::StatRecordKind::ExponentHistogram;
    part.exponent_histogram = false;
    part.part = k;
    parts.push_back(std::move(part));
  }
  seq.inspections.insert(it + 1, parts.begin(), parts.end());
}

// The parts of `slot`'s exponent histogram among `merged`; empty when it has none.
template <typename Merged>
std::vector<TensorMoments> histogram_parts(const Merged& merged, const plan::StatSlot& slot) {
  std::vector<TensorMoments> parts(static_cast<size_t>(kExponentHistogramRecords));
  int found = 0;
  for (const auto& m : merged) {
    const plan::StatSlot& o = m.first;
    if (o.record != plan::StatRecordKind::ExponentHistogram || o.layer != slot.layer ||
        o.tensor != slot.tensor || o.cast != slot.cast || o.block_size != slot.block_size ||
        o.dims != slot.dims || o.columnwise != slot.columnwise || o.part < 0 ||
        o.part >= kExponentHistogramRecords)
      continue;
    parts[size_t(o.part)] = m.second;
    ++found;
  }
  if (found != kExponentHistogramRecords) parts.clear();
  return parts;
}

// Two records of counts (ExponentHistogram parts) added field by field.
TensorMoments add_counts(const TensorMoments& a, const TensorMoments& b) {
  using Counts = std::array<int64_t, kCountsPerRecord>;
  const auto x = std::bit_cast<Counts>(a);
  const auto y = std::bit_cast<Counts>(b);
  Counts sum{};
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = x[i] + y[i];
  return std::bit_cast<TensorMoments>(sum);
}

// How `tensor` of layer `l` is cast this iteration: nullopt when none of its GEMMs quantizes it,
// else its quantizer's scaling (the recipe's, or per-tensor current under PerTensorScaling).
std::optional<plan::ScalingKind> own_scaling(const ir::Sequence& seq, const LayerRouting& l,
                                             TensorKind tensor) {
  std::optional<plan::ScalingKind> out;
  for (size_t gi = 0; gi < 3; ++gi) {
    const GemmRouting& g = l.gemms[gi];
    for (size_t k = 0; k < 2; ++k) {
      if (operands_of(kGemms[gi])[k] != tensor || !l.recipe_quantized || !g.quantized) continue;
      if (g.operands[k] == OperandAction::Quantize && !out) {
        out = passes::recipe_spec(seq.recipe, role_of(tensor)).scaling;
      } else if (g.operands[k] == OperandAction::Modify && g.modifiers[k] &&
                 g.modifiers[k]->feature->spec().name == "PerTensorScaling") {
        out = plan::ScalingKind::Current;
      }
    }
  }
  return out;
}

// How the first GEMM reading `tensor` (fprop for the activation and the weight, dgrad for the
// gradient) quantizes it this iteration: its recipe's scaling, per-tensor current under
// PerTensorScaling, nullopt when that GEMM runs in high precision or reads another feature's
// modification of it (whose copy is not the layer's tensor).
std::optional<plan::ScalingKind> first_gemm_scaling(const ir::Sequence& seq, const LayerRouting& l,
                                                    TensorKind tensor) {
  const GemmRole gemm = gemms_of(tensor).front();  // the row-wise copy's reader
  const GemmRouting& g = l.gemms[size_t(gemm)];
  if (!l.recipe_quantized || !g.quantized) return std::nullopt;
  for (size_t k = 0; k < 2; ++k) {
    if (operands_of(gemm)[k] != tensor) continue;
    if (g.operands[k] == OperandAction::Quantize)
      return passes::recipe_spec(seq.recipe, role_of(tensor)).scaling;
    if (g.operands[k] == OperandAction::Modify && g.modifiers[k] &&
        g.modifiers[k]->feature->spec().name == "PerTensorScaling")
      return plan::ScalingKind::Current;
  }
  return std::nullopt;
}

// LogFp8TensorStats of `tensor`: one Quantized slot per distinct cast it asks about, after the
// tensor's moments slot (the device takes a current scale's amax from its record).
void add_quant_slots(ir::Sequence& seq, const LayerRouting& l, const FeatureConfig& f,
                     TensorKind tensor, std::vector<std::string>& refused) {
  const std::optional<plan::ScalingKind> own = own_scaling(seq, l, tensor);
  const plan::DType format = passes::recipe_spec(seq.recipe, role_of(tensor)).format;
  for (const StatRequest& r : quant_stats(f, tensor)) {
    const bool own_cast = !r.recipe || *r.recipe == plan::ScalingKind::Delayed;
    std::string problem;
    const plan::QuantSpec own_spec = passes::recipe_spec(seq.recipe, role_of(tensor));
    if (own_cast && !own) {
      problem = "the tensor is not quantized in this iteration (its GEMMs run in high precision)";
    } else if (own_cast && *own == plan::ScalingKind::MicroScaled && own_spec.nvfp4()) {
      problem =
          "its quantizer is NVFP4 (E2M1 values with E4M3 block scales), and LogFp8TensorStats "
          "measures FP8 casts; ask for the mxfp8_ or fp8_block_scaling_ what-ifs instead";
    } else if (own_cast && *own != plan::ScalingKind::Delayed &&
               (r.recipe || r.kind == StatKind::Overflows)) {
      problem = fmt::format(
          "its quantizer uses {} scaling; TE computes {} only with a delayed-"
          "scaling quantizer",
          plan::name(*own), r.recipe ? "fp8_delayed_scaling_ statistics" : "overflows%");
    }
    // A block-scaled own quantizer (float8_block_scaling) casts as the fp8_block_scaling_
    // what-if does when the recipe keeps TE's defaults (1x128 blocks for the activation and the
    // gradient, 128x128 for the weight, power-of-2 scales, no epsilon): one record for both.
    // Other settings get a record of their own, the cast with the recipe's blocks and scales.
    const bool own_block =
        own_cast && own &&
        (*own == plan::ScalingKind::Block1D || *own == plan::ScalingKind::Block2D);
    bool what_if_block = false;
    std::optional<plan::QuantSpec> own_block_spec;
    if (own_block && problem.empty()) {
      const plan::QuantSpec spec = passes::recipe_spec(seq.recipe, role_of(tensor));
      const plan::ScalingKind what_if =
          tensor == TensorKind::Weight ? plan::ScalingKind::Block2D : plan::ScalingKind::Block1D;
      what_if_block = spec.scaling == what_if && spec.power_of_2_scale && spec.epsilon == 0.0;
      if (!what_if_block) own_block_spec = spec;
    }
    if (!problem.empty()) {
      refused.push_back(fmt::format("{} (layer '{}', {}): '{}': {}", f.name, l.layer,
                                    plan::name(tensor), r.name, problem));
      continue;
    }
    StatRequest cast = r;
    if (what_if_block) cast.recipe = plan::ScalingKind::Block1D;  // the fp8_block_scaling_ cast
    // An MXFP8 own quantizer casts as the mxfp8_ what-if does (1 x 32 blocks along the rows,
    // E8M0 scales rounded up, the recipe's format): one record for both.
    if (own_cast && own && *own == plan::ScalingKind::MicroScaled)
      cast.recipe = plan::ScalingKind::MicroScaled;
    plan::StatSlot slot = quant_slot(l.layer, tensor, cast);
    slot.format = format;
    slot.exponent_histogram = r.kind == StatKind::ScaleExponentHistogram;
    if (own_block_spec) {
      slot.block_size = 128;
      slot.dims = own_block_spec->scaling == plan::ScalingKind::Block2D ? 2 : 1;
      slot.columnwise = r.columnwise && slot.dims == 1;
    }
    // Always there: IterationStats::log finds a tensor's quantized records from it.
    add_slot(seq, {l.layer, std::string(plan::name(tensor)), 0, 1});
    add_slot(seq, slot);
  }
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
      // A GEMM takes per-tensor scales on both operands or blocks on both (cuBLASLt; the
      // emulated formats have no FP8 GEMM at all): rescaling one operand per tensor needs the
      // other to be per-tensor too, by the recipe or by this feature.
      if (mod->kind == Modification::Kind::PerTensorScaling && l.recipe_quantized && g.quantized) {
        const TensorKind other = operands_of(gemm)[1 - k];
        const plan::QuantSpec other_spec = passes::recipe_spec(seq.recipe, role_of(other));
        const std::optional<Modification>& other_mod = g.modifications[1 - k];
        const bool other_rescaled =
            other_mod && other_mod->kind == Modification::Kind::PerTensorScaling;
        if (!other_spec.per_tensor() && !other_rescaled) {
          refused.push_back(fmt::format(
              "{} (layer '{}', {} of {}): the GEMM's other operand ({}) is quantized as {} under "
              "{}, and a GEMM takes per-tensor scales on both operands or on neither; give "
              "PerTensorScaling both tensors of {}",
              m->name, l.layer, plan::name(tensor), plan::name(gemm), plan::name(other),
              plan::quant_spec_string(other_spec), ir::recipe_kind_name(seq.recipe.kind),
              plan::name(gemm)));
          continue;
        }
      }
      const std::string error =
          add_modification(seq, l.layer, gemm, tensor, g.quantized, m->name, *mod);
      if (!error.empty()) refused.push_back(error);
    }
  }
  for (const TensorKind t : plan::all_values<TensorKind>()) {
    for (const FeatureConfig* f : l.inspectors[size_t(t)]) {
      if (f->feature->spec().name == "LogFp8TensorStats") {
        add_quant_slots(seq, l, *f, t, refused);
        continue;
      }
      if (f->feature->spec().name != "LogTensorStats") {
        // DumpTensors, C++ features (captures.h).
        add_capture(seq, l, t, *f, first_gemm_scaling(seq, l, t), refused);
        continue;
      }
      // One record for the moments, one per block configuration.
      std::set<std::pair<int, int>> blocks;
      for (const StatRequest& r : tensor_stats(*f, t)) {
        if (r.kind == StatKind::MaxBlockwiseDynamicRange) blocks.insert({r.block_size, r.dims});
      }
      const std::string tensor(plan::name(t));
      add_slot(seq, {l.layer, tensor, 0, 1});
      for (const auto& [size, dims] : blocks) add_slot(seq, {l.layer, tensor, size, dims});
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
    } else if (slots[i].tensor == "weight") {  // a weight is the same tensor in every run
      continue;
    } else if (slots[i].record == plan::StatRecordKind::Quantized) {
      it->second = as_record(merge(as_quantized(it->second), as_quantized(records[i])));
    } else if (slots[i].record == plan::StatRecordKind::ExponentHistogram) {
      it->second = add_counts(it->second, records[i]);
    } else {
      it->second = merge(it->second, records[i]);
    }
  }
}

void IterationStats::log(const Routing& routing, int64_t iteration, StatLog& log) const {
  for (const StatRecord& r : records(routing, iteration)) log.add(r);
}

std::vector<StatRecord> IterationStats::records(const Routing& routing, int64_t iteration) const {
  std::vector<StatRecord> out;
  for (const auto& entry : merged_) {
    // References, not a structured binding: the lambda below captures `slot` (clang 14 cannot
    // capture bindings).
    const plan::StatSlot& slot = entry.first;
    const TensorMoments& moments = entry.second;
    // Logged with the slot of its tensor's moments: block statistics and quantized records.
    if (slot.block_size != 0 || slot.record != plan::StatRecordKind::Moments) continue;
    const LayerRouting* l = find_layer(routing, slot.layer);
    const auto t = plan::parse<TensorKind>(slot.tensor);
    if (!l || !t) continue;
    for (const FeatureConfig* f : l->inspectors[size_t(*t)]) {
      if (f->feature->spec().name == "LogFp8TensorStats") {
        for (const StatRequest& r : quant_stats(*f, *t)) {
          auto find = [&](const StatRequest& request) {
            const plan::StatSlot want = quant_slot(slot.layer, *t, request);
            return std::find_if(merged_.begin(), merged_.end(),
                                [&](const auto& m) { return matches(m.first, want); });
          };
          auto q = find(r);
          if (q == merged_.end() && !r.recipe) {
            // A block-scaled own quantizer's cast (add_quant_slots): a record of its own where its
            // settings differ from the fp8_block_scaling_ what-if, else the what-if's.
            q = std::find_if(merged_.begin(), merged_.end(), [&](const auto& m) {
              const plan::StatSlot& o = m.first;
              return o.layer == slot.layer && o.tensor == slot.tensor &&
                     o.record == plan::StatRecordKind::Quantized &&
                     o.cast == plan::QuantStatCast::Quantizer && o.block_size > 0 &&
                     (o.dims == 2 || o.columnwise == r.columnwise);
            });
          }
          if (q == merged_.end() && !r.recipe) {
            StatRequest block = r;
            block.recipe = plan::ScalingKind::Block1D;
            q = find(block);
          }
          if (q == merged_.end()) continue;
          if (r.kind == StatKind::ScaleExponentHistogram) {
            // One value per bin that holds a block: `{name}_e-12` (docs/debugging.md).
            const std::vector<TensorMoments> parts = histogram_parts(merged_, q->first);
            if (parts.empty()) continue;
            const ExponentHistogram h = histogram_of(parts);
            for (int b = 0; b < kExponentBins; ++b) {
              if (h.bins[b] == 0) continue;
              out.push_back(StatRecord{slot.layer, slot.tensor, "",
                                       r.name + "_" + exponent_bin_name(b), iteration,
                                       static_cast<double>(h.bins[b])});
            }
            continue;
          }
          out.push_back(StatRecord{slot.layer, slot.tensor, "", r.name, iteration,
                                   value(as_quantized(q->second), r.kind)});
        }
        continue;
      }
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
        out.push_back(StatRecord{slot.layer, slot.tensor, "", r.name, iteration, v});
      }
    }
  }
  return out;
}

}  // namespace opfuse::debug
