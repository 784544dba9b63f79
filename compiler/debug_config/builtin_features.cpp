// TE's built-in precision-debug features (docs/debugging.md, "Features"), as Feature objects. What
// each one computes or changes at run time is compiled from the routing answers given here.
#include <algorithm>
#include <array>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "debug_config/feature.h"

namespace opfuse::debug {

namespace {

// LogTensorStats' statistics of the high-precision tensor.
constexpr std::array<std::string_view, 8> kTensorStats = {
    "min", "max", "mean", "std", "l1_norm", "l2_norm", "cur_amax", "dynamic_range"};
constexpr std::string_view kBlockwise = "max_blockwise_dynamic_range";

// LogFp8TensorStats' statistics of the quantized tensor, optionally prefixed by a recipe ("what
// if this tensor were quantized so": an extra cast) and suffixed `_columnwise`.
constexpr std::array<std::string_view, 5> kQuantStats = {"underflows%", "overflows%",
                                                         "scale_inv_min", "scale_inv_max", "mse"};
constexpr std::array<std::string_view, 2> kRecipes = {"fp8_delayed_scaling", "fp8_current_scaling"};
// TE's block-scaled recipes: valid names, but opfuse cannot quantize so yet.
constexpr std::array<std::string_view, 3> kBlockRecipes = {"fp8_block_scaling", "mxfp8", "nvfp4"};

std::vector<std::string> strings(std::span<const std::string_view> names) {
  return {names.begin(), names.end()};
}

std::string check_tensor_stat(const ConfigNode& entry, std::string& hint) {
  if (entry.kind == ConfigNode::Kind::Map) {
    if (entry.entries.size() != 1 || entry.entries[0].key != kBlockwise) {
      hint = fmt::format("only {} takes parameters: `- {}: {{block_size: 32, dims: 1}}`",
                         kBlockwise, kBlockwise);
      return "a statistic with parameters must be a one-key map";
    }
    const ConfigNode& params = entry.entries[0].value;
    if (params.kind != ConfigNode::Kind::Map) return fmt::format("{} needs a map", kBlockwise);
    bool has_block = false;
    for (const ConfigNode::Entry& p : params.entries) {
      if (p.key == "block_size") {
        has_block = true;
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(p.value.scalar.data(),
                                               p.value.scalar.data() + p.value.scalar.size(), v);
        if (p.value.kind != ConfigNode::Kind::Scalar || ec != std::errc() ||
            end != p.value.scalar.data() + p.value.scalar.size() || v < 1) {
          return "block_size must be a positive integer";
        }
      } else if (p.key == "dims") {
        if (p.value.kind != ConfigNode::Kind::Scalar ||
            (p.value.scalar != "1" && p.value.scalar != "2")) {
          return "dims must be 1 (blocks along a row) or 2 (square tiles)";
        }
      } else {
        hint = "it takes block_size and dims";
        return fmt::format("{} has no parameter '{}'", kBlockwise, p.key);
      }
    }
    if (!has_block) return fmt::format("{} needs block_size", kBlockwise);
    return {};
  }
  if (entry.kind != ConfigNode::Kind::Scalar) return "a statistic must be a name";
  const std::string& s = entry.scalar;
  if (std::find(kTensorStats.begin(), kTensorStats.end(), s) != kTensorStats.end()) return {};
  if (s == kBlockwise) {
    hint = fmt::format("write `- {}: {{block_size: 32, dims: 1}}`", kBlockwise);
    return fmt::format("{} needs block_size (and optionally dims)", kBlockwise);
  }
  std::vector<std::string> known = strings(kTensorStats);
  known.emplace_back(kBlockwise);
  if (std::find(kQuantStats.begin(), kQuantStats.end(), s) != kQuantStats.end()) {
    hint = "statistics of the quantized tensor belong to LogFp8TensorStats";
  } else {
    hint = fmt::format("LogTensorStats computes {}", fmt::join(known, ", "));
  }
  return fmt::format("unknown statistic '{}' for LogTensorStats", s);
}

std::string check_quant_stat(const ConfigNode& entry, std::string& hint) {
  if (entry.kind != ConfigNode::Kind::Scalar) return "a statistic must be a name";
  std::string_view s = entry.scalar;
  constexpr std::string_view kColumnwise = "_columnwise";
  if (s.size() > kColumnwise.size() && s.substr(s.size() - kColumnwise.size()) == kColumnwise) {
    s.remove_suffix(kColumnwise.size());
  }
  std::string_view recipe;
  for (const auto& list : {std::span<const std::string_view>(kRecipes),
                           std::span<const std::string_view>(kBlockRecipes)}) {
    for (std::string_view r : list) {
      if (s.size() > r.size() && s.substr(0, r.size()) == r && s[r.size()] == '_') {
        recipe = r;
        s.remove_prefix(r.size() + 1);
      }
    }
  }
  if (std::find(kQuantStats.begin(), kQuantStats.end(), s) == kQuantStats.end()) {
    hint = fmt::format("LogFp8TensorStats computes [recipe_]stat[_columnwise], stat one of {}",
                       fmt::join(kQuantStats, ", "));
    if (std::find(kTensorStats.begin(), kTensorStats.end(), s) != kTensorStats.end()) {
      hint = "statistics of the high-precision tensor belong to LogTensorStats";
    }
    return fmt::format("unknown statistic '{}' for LogFp8TensorStats", entry.scalar);
  }
  if (std::find(kBlockRecipes.begin(), kBlockRecipes.end(), recipe) != kBlockRecipes.end()) {
    hint = fmt::format("opfuse quantizes with {} so far", fmt::join(kRecipes, " and "));
    return fmt::format("'{}' asks about the {} recipe, which opfuse cannot quantize with yet",
                       entry.scalar, recipe);
  }
  if (s == "overflows%" && recipe == "fp8_current_scaling") {
    hint = "a current-scaled tensor cannot overflow: its scale comes from its own amax";
    return fmt::format("'{}' is always 0", entry.scalar);
  }
  return {};
}

constexpr std::array<TensorKind, 3> kOperands = {TensorKind::Activation, TensorKind::Gradient,
                                                 TensorKind::Weight};

class LogTensorStats final : public Feature {
 public:
  explicit LogTensorStats() {
    spec_.name = "LogTensorStats";
    spec_.doc =
        "statistics of the high-precision tensors (min, max, mean, std, norms, amax, "
        "dynamic ranges)";
    spec_.selects_tensors = true;
    spec_.keys = cadence_keys();
    spec_.keys.push_back({"stats", KeyType::Stats, {}, "the statistics to log", true});
    spec_.check_stat = check_tensor_stat;
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route inspect_tensor_enabled(const CallContext& c, TensorKind, int64_t it) const override {
    return c.settings.cadence().route(it);
  }

 private:
  FeatureSpec spec_;
};

class LogFp8TensorStats final : public Feature {
 public:
  LogFp8TensorStats() {
    spec_.name = "LogFp8TensorStats";
    spec_.doc =
        "statistics of the quantized tensors (underflows, overflows, scale_inv range, "
        "MSE), also for recipes the tensor does not use";
    spec_.selects_tensors = true;
    spec_.tensors = {kOperands.begin(), kOperands.end()};
    spec_.keys = cadence_keys();
    spec_.keys.push_back({"stats", KeyType::Stats, {}, "the statistics to log", true});
    spec_.check_stat = check_quant_stat;
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route inspect_tensor_enabled(const CallContext& c, TensorKind, int64_t it) const override {
    return c.settings.cadence().route(it);
  }

 private:
  FeatureSpec spec_;
};

// DisableFP8GEMM and DisableQuantizationGEMM (TE's newer name): the listed GEMMs in high precision.
class DisableGemm final : public Feature {
 public:
  explicit DisableGemm(std::string name) {
    spec_.name = std::move(name);
    spec_.doc = "the listed GEMMs run in high precision";
    spec_.selects_gemms = true;
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route fp8_gemm_enabled(const CallContext&, GemmRole, int64_t) const override {
    return {false, kNever};
  }

 private:
  FeatureSpec spec_;
};

// DisableFP8Layer and DisableQuantizationLayer: every GEMM of the layer in high precision.
class DisableLayer final : public Feature {
 public:
  explicit DisableLayer(std::string name) {
    spec_.name = std::move(name);
    spec_.doc = "every GEMM of the layer runs in high precision";
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route fp8_gemm_enabled(const CallContext&, GemmRole, int64_t) const override {
    return {false, kNever};
  }

 private:
  FeatureSpec spec_;
};

// Quantize-dequantize with per-tensor current scaling; the GEMM then runs in high precision on
// the result (both operands of a GEMM must be of one kind).
class FakeQuant final : public Feature {
 public:
  FakeQuant() {
    spec_.name = "FakeQuant";
    spec_.doc =
        "quantize-dequantize the listed tensors (per-tensor current scaling) and run "
        "their GEMMs in high precision";
    spec_.selects_gemms = true;
    spec_.selects_tensors = true;
    spec_.tensors = {kOperands.begin(), kOperands.end()};
    spec_.keys.push_back(
        {"quant_format", KeyType::Choice, {"FP8E4M3", "FP8E5M2"}, "the FP8 format", true});
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route modify_tensor_enabled(const CallContext&, GemmRole, TensorKind, int64_t) const override {
    return {true, kNever};
  }
  Route fp8_gemm_enabled(const CallContext&, GemmRole, int64_t) const override {
    return {false, kNever};
  }

 private:
  FeatureSpec spec_;
};

// Casts the listed tensors with per-tensor current scaling inside any recipe; the GEMM stays FP8.
class PerTensorScaling final : public Feature {
 public:
  PerTensorScaling() {
    spec_.name = "PerTensorScaling";
    spec_.doc = "cast the listed tensors with per-tensor current scaling; the GEMM stays FP8";
    spec_.selects_gemms = true;
    spec_.selects_tensors = true;
    spec_.tensors = {kOperands.begin(), kOperands.end()};
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route modify_tensor_enabled(const CallContext&, GemmRole, TensorKind, int64_t) const override {
    return {true, kNever};
  }

 private:
  FeatureSpec spec_;
};

class DumpTensors final : public Feature {
 public:
  DumpTensors() {
    spec_.name = "DumpTensors";
    spec_.doc =
        "write the listed tensors to .npy files (high precision and/or quantized with its "
        "scales)";
    spec_.selects_tensors = true;
    spec_.keys = cadence_keys();
    spec_.keys.push_back({"high_precision_tensor",
                          KeyType::Bool,
                          {},
                          "dump the high-precision tensor (default true)"});
    spec_.keys.push_back({"quantized_tensor",
                          KeyType::Bool,
                          {},
                          "dump the quantized tensor and its scale_inv (default false)"});
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route inspect_tensor_enabled(const CallContext& c, TensorKind, int64_t it) const override {
    return c.settings.cadence().route(it);
  }

 private:
  FeatureSpec spec_;
};

}  // namespace

FeatureRegistry FeatureRegistry::with_builtins() {
  FeatureRegistry r;
  r.add(std::make_shared<LogTensorStats>());
  r.add(std::make_shared<LogFp8TensorStats>());
  r.add(std::make_shared<DisableGemm>("DisableFP8GEMM"));
  r.add(std::make_shared<DisableGemm>("DisableQuantizationGEMM"));
  r.add(std::make_shared<DisableLayer>("DisableFP8Layer"));
  r.add(std::make_shared<DisableLayer>("DisableQuantizationLayer"));
  r.add(std::make_shared<FakeQuant>());
  r.add(std::make_shared<PerTensorScaling>());
  r.add(std::make_shared<DumpTensors>());
  return r;
}

}  // namespace opfuse::debug
