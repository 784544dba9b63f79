#include "debug_config/captures.h"

#include <algorithm>
#include <system_error>

#include <fmt/format.h>

#include "debug_config/npy.h"
#include "support/atomic_file.h"

namespace opfuse::debug {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kDumpTensors = "DumpTensors";

const LayerRouting* find_layer(const Routing& routing, const std::string& name) {
  for (const LayerRouting& l : routing.layers)
    if (l.layer == name) return &l;
  return nullptr;
}

bool is_builtin_stats(const FeatureConfig& f) {
  const std::string& name = f.feature->spec().name;
  return name == "LogTensorStats" || name == "LogFp8TensorStats";
}

[[noreturn]] void cannot_dump(const fs::path& where, const std::string& reason) {
  throw DebugLogError(fmt::format("cannot write tensor dumps to '{}': {}", where.string(), reason));
}

}  // namespace

void add_capture(ir::Sequence& seq, const LayerRouting& l, TensorKind tensor,
                 const FeatureConfig& f, std::vector<std::string>& refused) {
  if (f.feature->spec().name == kDumpTensors) {
    const Settings* s = f.find(std::nullopt, tensor);
    if (s && s->get_bool("quantized_tensor", false)) {
      refused.push_back(fmt::format("{} (layer '{}', {}): quantized_tensor is not executed yet",
                                    f.name, l.layer, plan::name(tensor)));
    }
    if (!s || !s->get_bool("high_precision_tensor", true)) return;
  }
  const plan::CaptureSlot slot{l.layer, std::string(plan::name(tensor)), {}};
  if (std::find(seq.captures.begin(), seq.captures.end(), slot) == seq.captures.end())
    seq.captures.push_back(slot);
}

fs::path dump_root(const fs::path& log_dir, int rank) {
  return log_dir / "tensor_dumps" / fmt::format("rank_{}", rank);
}

fs::path dump_dir(const fs::path& log_dir, int rank, int64_t iteration) {
  return dump_root(log_dir, rank) / fmt::format("iter_{:06d}", iteration);
}

bool dumps_tensors(const std::vector<LayerBinding>& bindings) {
  for (const LayerBinding& b : bindings) {
    if (!b.section) continue;
    for (const FeatureConfig& f : b.section->features)
      if (f.enabled && f.feature->spec().name == kDumpTensors) return true;
  }
  return false;
}

void check_dump_dir(const fs::path& log_dir, int rank) {
  const fs::path root = dump_root(log_dir, rank);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) cannot_dump(root, ec.message());
  // A directory that exists read-only passes create_directories: write a file to be sure.
  const fs::path probe = root / ".opfuse_write_check";
  const std::string error = write_file_atomically(probe.string(), "", Durability::VisibleOnly);
  if (!error.empty()) cannot_dump(root, error);
  fs::remove(probe, ec);
}

void IterationCaptures::add_run(std::span<const plan::CaptureSlot> slots,
                                std::span<const CapturedTensor> captures) {
  auto& run = runs_.emplace_back();
  for (size_t i = 0; i < slots.size() && i < captures.size(); ++i) {
    // A weight is the same tensor in every run: kept from the first only.
    if (runs_.size() > 1 && slots[i].tensor == "weight") continue;
    run.emplace_back(slots[i], captures[i]);
  }
}

void IterationCaptures::add_to_last_run(std::span<const plan::CaptureSlot> slots,
                                        std::span<const CapturedTensor> captures) {
  if (runs_.empty()) runs_.emplace_back();
  auto& run = runs_.back();
  for (size_t i = 0; i < slots.size() && i < captures.size(); ++i) {
    if (runs_.size() > 1 && slots[i].tensor == "weight") continue;
    run.emplace_back(slots[i], captures[i]);
  }
}

std::vector<StatRecord> IterationCaptures::finish(const Routing& routing, int64_t iteration,
                                                  const fs::path& log_dir, int rank) const {
  std::vector<StatRecord> out;
  const bool several = runs_.size() > 1;
  for (size_t k = 0; k < runs_.size(); ++k) {
    for (const auto& entry : runs_[k]) {
      const plan::CaptureSlot& slot = entry.first;
      const CapturedTensor& tensor = entry.second;
      const LayerRouting* l = find_layer(routing, slot.layer);
      const auto t = plan::parse<TensorKind>(slot.tensor);
      if (!l || !t) continue;
      for (const FeatureConfig* f : l->inspectors[size_t(*t)]) {
        if (is_builtin_stats(*f)) continue;
        const Settings* s = f->find(std::nullopt, *t);
        if (!s) continue;
        if (f->feature->spec().name == kDumpTensors) {
          if (!s->get_bool("high_precision_tensor", true)) continue;
          const fs::path dir = dump_dir(log_dir, rank, iteration);
          std::error_code ec;
          fs::create_directories(dir, ec);
          if (ec) cannot_dump(dir, ec.message());
          const std::string file = several
                                       ? fmt::format("{}_{}_mb{}.npy", slot.layer, slot.tensor, k)
                                       : fmt::format("{}_{}.npy", slot.layer, slot.tensor);
          try {
            write_npy((dir / file).string(), {NpyType::Float32, tensor.shape, tensor.values, {}});
          } catch (const NpyError& e) {
            cannot_dump(dir, e.what());
          }
          continue;
        }
        const CallContext context{l->layer, *s};
        const InspectedTensor view{tensor.shape, tensor.values, {}, 0};
        for (const FeatureStat& stat : f->feature->inspect_tensor(context, *t, view, iteration))
          out.push_back(StatRecord{slot.layer, slot.tensor, "", stat.name, iteration, stat.value});
      }
    }
  }
  return out;
}

}  // namespace opfuse::debug
