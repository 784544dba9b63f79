// TE's built-in precision-debug features (docs/debugging.md, "Features"), as Feature objects. What
// each one computes or changes at run time is compiled from the routing answers given here.
#include <algorithm>
#include <array>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "debug_config/feature.h"
#include "debug_config/stat_request.h"

namespace opfuse::debug {

namespace {

std::string check_stat(const ConfigNode& entry, StatFamily family, std::string& hint) {
  std::string error;
  parse_stat_request(entry, family, error, hint);
  return error;
}

std::string check_tensor_stat(const ConfigNode& entry, std::string& hint) {
  return check_stat(entry, StatFamily::Tensor, hint);
}

std::string check_quant_stat(const ConfigNode& entry, std::string& hint) {
  return check_stat(entry, StatFamily::Quantized, hint);
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
    spec_.modifies = true;
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
  std::optional<Modification> modify_tensor(const CallContext& c, GemmRole, TensorKind,
                                            int64_t) const override {
    return Modification::fake_quant(c.settings.get_string("quant_format", "FP8E4M3") == "FP8E5M2"
                                        ? plan::DType::E5M2
                                        : plan::DType::E4M3);
  }

 private:
  FeatureSpec spec_;
};

// Casts the listed tensors with per-tensor current scaling inside any recipe; the GEMM stays FP8.
class PerTensorScaling final : public Feature {
 public:
  PerTensorScaling() {
    spec_.name = "PerTensorScaling";
    spec_.modifies = true;
    spec_.doc = "cast the listed tensors with per-tensor current scaling; the GEMM stays FP8";
    spec_.selects_gemms = true;
    spec_.selects_tensors = true;
    spec_.tensors = {kOperands.begin(), kOperands.end()};
  }
  const FeatureSpec& spec() const override { return spec_; }
  Route modify_tensor_enabled(const CallContext&, GemmRole, TensorKind, int64_t) const override {
    return {true, kNever};
  }
  std::optional<Modification> modify_tensor(const CallContext&, GemmRole, TensorKind,
                                            int64_t) const override {
    return Modification::per_tensor_scaling();
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
