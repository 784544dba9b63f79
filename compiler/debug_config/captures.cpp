#include "debug_config/captures.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <system_error>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

// The value of FP8 code `c`: E4M3 (bias 7, no infinities, S.1111.111 is NaN) or E5M2 (bias 15).
float fp8_value(uint8_t c, bool e4m3) {
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emax = e4m3 ? 15 : 31;
  const int e = (c & 0x7F) >> mbits, m = c & ((1 << mbits) - 1);
  const float sign = (c & 0x80) != 0 ? -1.0f : 1.0f;
  if (e4m3 && e == emax && m == (1 << mbits) - 1) return std::nanf("");
  if (!e4m3 && e == emax) return m == 0 ? sign * INFINITY : std::nanf("");
  const float mantissa =
      e == 0 ? float(m) / float(1 << mbits) : 1.0f + float(m) / float(1 << mbits);
  return sign * std::ldexp(mantissa, (e == 0 ? 1 : e) - bias);
}

// Every number of a format by its float32 bits (both zeros included), built once.
const std::unordered_map<uint32_t, uint8_t>& codes_of(bool e4m3) {
  auto build = [](bool e) {
    std::unordered_map<uint32_t, uint8_t> codes;
    for (int c = 0; c < 256; ++c) {
      const float v = fp8_value(uint8_t(c), e);
      if (!std::isnan(v)) codes.emplace(std::bit_cast<uint32_t>(v), uint8_t(c));
    }
    return codes;
  };
  static const std::unordered_map<uint32_t, uint8_t> e4m3_codes = build(true);
  static const std::unordered_map<uint32_t, uint8_t> e5m2_codes = build(false);
  return e4m3 ? e4m3_codes : e5m2_codes;
}

}  // namespace

std::vector<float> scale_grid(const plan::CaptureSlot& slot, const CapturedTensor& tensor,
                              std::vector<int64_t>* shape) {
  if (slot.block.rows == 0) {
    if (shape != nullptr) shape->clear();
    return tensor.scale_inv;
  }
  const int64_t cols = tensor.shape.empty() ? 1 : tensor.shape.back();
  const int64_t rows = cols == 0 ? 0 : int64_t(tensor.values.size()) / cols;
  const int64_t col_blocks = (cols + slot.block.cols - 1) / slot.block.cols;
  const int64_t row_blocks = (rows + slot.block.rows - 1) / slot.block.rows;
  if (int64_t(tensor.scale_inv.size()) != row_blocks * col_blocks) {
    throw DebugLogError(fmt::format("the captured scale grid of {}'s {} has {} entries, not {}",
                                    slot.layer, slot.tensor, tensor.scale_inv.size(),
                                    row_blocks * col_blocks));
  }
  if (shape != nullptr) *shape = {row_blocks, col_blocks};
  // A 1 x 128 grid arrives block-column major (plan::CaptureSlot): transposed here.
  if (slot.block.rows != 1) return tensor.scale_inv;
  std::vector<float> out(tensor.scale_inv.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t cb = 0; cb < col_blocks; ++cb)
      out[size_t(r * col_blocks + cb)] = tensor.scale_inv[size_t(cb * rows + r)];
  return out;
}

namespace {

// The files of one quantized capture: codes, scale_inv and a description a reader can trust
// without opfuse ({layer}_{tensor}_quantized{suffix}.*).
void write_quantized(const fs::path& dir, const std::string& stem, const plan::CaptureSlot& slot,
                     TensorKind kind, const CapturedTensor& tensor) {
  NpyArray codes{NpyType::Uint8, tensor.shape, {}, {}};
  codes.u8.reserve(tensor.values.size());
  for (const float v : tensor.values) {
    const std::optional<uint8_t> c = fp8_code(v, slot.format);
    // The capture holds the FP8 copy's numbers; anything else is a broken capture.
    if (!c) {
      throw DebugLogError(fmt::format("the captured {} copy of {}'s {} holds {}, not an {} number",
                                      plan::name(slot.format), slot.layer, slot.tensor, v,
                                      plan::name(slot.format)));
    }
    codes.u8.push_back(*c);
  }
  // The scale_inv: a scalar, or the block grid as [row blocks, column blocks].
  const bool blocks = slot.block.rows > 0;
  std::vector<int64_t> grid_shape;
  NpyArray scales{NpyType::Float32, {}, scale_grid(slot, tensor, &grid_shape), {}};
  if (blocks) scales.shape = grid_shape;
  const std::string data_file = stem + ".npy", scale_file = stem + "_scale_inv.npy";
  try {
    write_npy((dir / data_file).string(), codes);
    write_npy((dir / scale_file).string(), scales);
  } catch (const NpyError& e) {
    cannot_dump(dir, e.what());
  }
  nlohmann::json about = {
      {"layer", slot.layer},
      {"tensor", slot.tensor},
      {"format", plan::name(slot.format)},
      {"shape", tensor.shape},
      {"data", data_file},
      {"scale_inv", scale_file},
      {"scaling", blocks ? "block" : "per_tensor"},
      {"dequantize",
       blocks ? "value(code[r, c]) * scale_inv[r // block[0], c // block[1]], value(code) the FP8 "
                "number of the code"
              : "value(code) * scale_inv, value(code) the FP8 number of the code"},
      {"copy", fmt::format("{}, as the {} GEMM reads it",
                           slot.columnwise ? "column-wise, stored transposed" : "row-wise",
                           plan::name(gemms_of(kind)[slot.columnwise ? 1 : 0]))}};
  if (blocks) about["block"] = {slot.block.rows, slot.block.cols};
  const std::string error = write_file_atomically((dir / (stem + ".json")).string(),
                                                  about.dump(2) + "\n", Durability::VisibleOnly);
  if (!error.empty()) cannot_dump(dir, error);
}

}  // namespace

std::optional<uint8_t> fp8_code(float value, plan::DType format) {
  if (format != plan::DType::E4M3 && format != plan::DType::E5M2) return std::nullopt;
  const bool e4m3 = format == plan::DType::E4M3;
  if (std::isnan(value)) return uint8_t((std::signbit(value) ? 0x80 : 0) | 0x7F);
  const auto& codes = codes_of(e4m3);
  const auto it = codes.find(std::bit_cast<uint32_t>(value));
  if (it == codes.end()) return std::nullopt;
  return it->second;
}

void add_capture(ir::Sequence& seq, const LayerRouting& l, TensorKind tensor,
                 const FeatureConfig& f, std::optional<plan::ScalingKind> quantized_by,
                 std::vector<std::string>& refused) {
  const bool dump = f.feature->spec().name == kDumpTensors;
  bool high_precision = true, quantized = !dump;
  if (dump) {
    const Settings* s = f.find(std::nullopt, tensor);
    if (!s) return;
    high_precision = s->get_bool("high_precision_tensor", true);
    quantized = s->get_bool("quantized_tensor", false);
  }
  auto add = [&](const plan::CaptureSlot& slot) {
    if (std::find(seq.captures.begin(), seq.captures.end(), slot) == seq.captures.end())
      seq.captures.push_back(slot);
  };
  if (high_precision) add({l.layer, std::string(plan::name(tensor)), {}});
  // Only a GEMM operand quantized this iteration has an FP8 copy (TE's quantized tensor is None
  // otherwise: nothing to dump).
  if (!quantized || !is_operand(tensor) || !quantized_by) return;
  if (*quantized_by == plan::ScalingKind::MicroScaled) {
    if (dump) {
      refused.push_back(fmt::format(
          "{} (layer '{}', {}): quantized_tensor: no MXFP8 copy is made (no MXFP8 recipe yet)",
          f.name, l.layer, plan::name(tensor)));
    }
    return;
  }
  plan::CaptureSlot slot{l.layer, std::string(plan::name(tensor)), {}};
  slot.quantized = true;
  add(slot);
  // 1 x 128 blocks quantize the column-wise copy again, down the columns: another copy to dump.
  if (*quantized_by == plan::ScalingKind::Block1D) {
    slot.columnwise = true;
    add(slot);
  }
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
    const auto& run = runs_[k];
    // A quantized capture (row-wise or column-wise) of the same tensor in this run, if any.
    auto quantized_of =
        [&](const plan::CaptureSlot& hp,
            bool columnwise) -> const std::pair<plan::CaptureSlot, CapturedTensor>* {
      for (const auto& other : run) {
        if (other.first.quantized && other.first.columnwise == columnwise &&
            other.first.layer == hp.layer && other.first.tensor == hp.tensor)
          return &other;
      }
      return nullptr;
    };
    for (const auto& entry : run) {
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
          const bool wanted = slot.quantized ? s->get_bool("quantized_tensor", false)
                                             : s->get_bool("high_precision_tensor", true);
          if (!wanted) continue;
          const fs::path dir = dump_dir(log_dir, rank, iteration);
          std::error_code ec;
          fs::create_directories(dir, ec);
          if (ec) cannot_dump(dir, ec.message());
          const std::string stem = fmt::format(
              "{}_{}{}{}{}", slot.layer, slot.tensor, slot.quantized ? "_quantized" : "",
              slot.columnwise ? "_columnwise" : "", several ? fmt::format("_mb{}", k) : "");
          if (slot.quantized) {
            write_quantized(dir, stem, slot, *t, tensor);
            continue;
          }
          try {
            write_npy((dir / (stem + ".npy")).string(),
                      {NpyType::Float32, tensor.shape, tensor.values, {}});
          } catch (const NpyError& e) {
            cannot_dump(dir, e.what());
          }
          continue;
        }
        // C++ features see the high-precision tensor, with the quantized copy beside it.
        if (slot.quantized) continue;
        const CallContext context{l->layer, *s};
        InspectedTensor view{tensor.shape, tensor.values, {}, {}};
        std::vector<float> grids[2];  // the copies' scale grids, row-major
        for (const bool columnwise : {false, true}) {
          const auto* q = quantized_of(slot, columnwise);
          if (q == nullptr || q->second.scale_inv.empty()) continue;
          std::vector<float>& grid = grids[columnwise ? 1 : 0];
          grid = scale_grid(q->first, q->second, nullptr);
          QuantizedView& copy = columnwise ? view.columnwise : view.rowwise;
          copy = QuantizedView{q->second.shape, q->second.values,    grid,
                               q->first.format, q->first.block.rows, q->first.block.cols};
        }
        for (const FeatureStat& stat : f->feature->inspect_tensor(context, *t, view, iteration))
          out.push_back(StatRecord{slot.layer, slot.tensor, "", stat.name, iteration, stat.value});
      }
    }
  }
  return out;
}

}  // namespace opfuse::debug
