// A precision-debug feature (docs/debugging.md, "Features"): what a config's
// `transformer_engine:` block names, e.g. LogTensorStats or DisableFP8GEMM. A feature declares the
// keys it accepts (FeatureSpec, checked when the config is read) and answers TE's routing calls
// for one layer from its settings. The routing calls are asked when the program is built (and again
// only at the iterations a previous answer named), never per step: their answers select the plan
// variant each iteration runs.
//
// Built-in features (builtin_features.cpp) and C++ features of an application are the same kind of
// object, registered by name in a FeatureRegistry.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "debug/names.h"
#include "debug_config/config_node.h"
#include "debug_config/modification.h"

namespace opfuse::debug {

// "Never again": the next-iteration part of a routing answer that will not change.
inline constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// A routing answer: enabled or not, and the first later iteration at which the answer may be
// different (kNever: it holds for every later iteration). TE's features answer (enabled, next
// *enabled* iteration), which for a disabled answer is the same thing and for an enabled one is
// made precise here; TE's bare bool ("ask again next iteration") is {enabled, iteration + 1}.
struct Route {
  bool enabled = false;
  int64_t next = kNever;
  friend bool operator==(const Route&, const Route&) = default;
};

// When a feature runs (TE's freq, start_step, end_step, start_end_list): at iterations that are
// multiples of freq inside [start, end] (inclusive), or inside any interval of the list, which
// replaces start/end when given.
struct Cadence {
  int64_t freq = 1;
  int64_t start_step = 0;
  int64_t end_step = kNever;
  std::vector<std::pair<int64_t, int64_t>> start_end_list;

  bool runs_at(int64_t iteration) const;
  // The first iteration after `iteration` at which it runs; kNever if none.
  int64_t next_after(int64_t iteration) const;
  // The first iteration after `iteration` at which it does not run; kNever if none.
  int64_t stops_after(int64_t iteration) const;
  // The routing answer at `iteration`: whether it runs, and until when that holds.
  Route route(int64_t iteration) const;
};

// The value types a feature key can have; the reader checks them and points at the value.
enum class KeyType : uint8_t {
  Bool,
  Int,           // non-negative integer
  PositiveInt,   // integer >= 1
  Choice,        // one of KeySpec::choices
  Stats,         // a list of statistics, checked by FeatureSpec::check_stat
  IntervalList,  // [[start, end], ...], start <= end
  Number,        // a finite number (integer or decimal)
};

struct KeySpec {
  std::string_view name;
  KeyType type;
  std::vector<std::string> choices = {};  // Choice
  std::string_view doc = {};
  bool required = false;  // every GEMM/tensor the feature selects must have it
};

// What a feature accepts. Keys common to every feature (`enabled`, and `tensors`, `tensors_struct`,
// `gemms`, `gemms_struct` for features that select tensors or GEMMs) are not listed.
struct FeatureSpec {
  std::string name;
  std::string doc;               // one sentence (docs/debugging.md's table of features says more)
  bool selects_gemms = false;    // takes gemms / gemms_struct (else the whole layer)
  bool selects_tensors = false;  // takes tensors / tensors_struct
  // Answers modify_tensor_enabled: two such features of one section may not select the same GEMM
  // operand (a tensor is replaced by one feature).
  bool modifies = false;
  std::vector<TensorKind> tensors = {};  // the tensors it may select (empty: all six)
  std::vector<KeySpec> keys = {};
  // Stats keys: checks one entry of the list; returns an error message (empty: accepted) and may
  // set `hint`. Entries are a name or a one-key map (a statistic with parameters).
  std::function<std::string(const ConfigNode& entry, std::string& hint)> check_stat = {};
};

// The keys that apply to one (GEMM, tensor) of a layer: the feature's flat keys overridden by the
// keys of the gemms_struct / tensors_struct entries that select it. Values were checked against
// the spec when the config was read, so the accessors only convert.
class Settings {
 public:
  void set(std::string key, const ConfigNode* value) { values_[std::move(key)] = value; }
  const ConfigNode* find(std::string_view key) const;
  bool get_bool(std::string_view key, bool fallback) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_number(std::string_view key, double fallback) const;
  std::string get_string(std::string_view key, std::string_view fallback) const;
  // freq, start_step, end_step, start_end_list.
  Cadence cadence() const;
  // The Stats key's entries, in file order.
  std::vector<const ConfigNode*> stats(std::string_view key = "stats") const;
  const std::map<std::string, const ConfigNode*, std::less<>>& values() const { return values_; }

 private:
  std::map<std::string, const ConfigNode*, std::less<>> values_;
};

// The keys common to the features that run on a cadence.
std::vector<KeySpec> cadence_keys();

// What every call is told: the layer and the settings that apply to the GEMM/tensor asked about.
struct CallContext {
  std::string_view layer;
  const Settings& settings;
};

// An FP8 copy of an inspected tensor as a GEMM reads it (TE's rowwise_quantized_tensor and
// columnwise_quantized_tensor): host memory, valid during the call. Empty where there is none.
struct QuantizedView {
  // As stored: the tensor's shape for the row-wise copy, [cols, rows] (transposed) for the
  // column-wise one.
  std::span<const int64_t> shape;
  std::span<const float> values;  // the FP8 numbers (unscaled) as float32, row-major in `shape`
  // dequantized[r][c] = values[r][c] * scale_inv[r / block_rows][c / block_cols]: one value for a
  // per-tensor scale (block_rows = block_cols = 0), else the block grid, row-major
  // [ceil(rows / block_rows)][ceil(cols / block_cols)] of `shape` (1 x 128 or 128 x 128 blocks).
  std::span<const float> scale_inv;
  plan::DType format = plan::DType::E4M3;
  int block_rows = 0;
  int block_cols = 0;
  bool empty() const { return values.empty(); }
  // The value at (r, c) of `shape` times its scale_inv.
  float dequantized(int64_t r, int64_t c) const;
};

// A captured tensor as inspect_tensor sees it: host memory, valid during the call.
struct InspectedTensor {
  std::span<const int64_t> shape;  // row-major
  std::span<const float> values;   // the high-precision tensor as the run held it, as float32
  // For a GEMM operand quantized in that iteration, the FP8 copies its GEMMs read: `rowwise`, read
  // by its first GEMM (fprop's for the activation and the weight, dgrad's for the gradient), and
  // `columnwise`, read by its other GEMM (wgrad's, or dgrad's for the weight) where it is a
  // quantization of its own: under 1 x 128 block scaling (quantized again down the columns).
  // Under per-tensor scaling and 128 x 128 blocks the column-wise copy is the row-wise one
  // transposed (scales included) and `columnwise` is empty. Both empty where the GEMMs run in
  // high precision, and for the other tensors.
  QuantizedView rowwise;
  QuantizedView columnwise;
};

// One statistic inspect_tensor returns: logged as `{layer}_{tensor}_{name}` like a built-in one.
struct FeatureStat {
  std::string name;
  double value = 0;
};

// The base class of every feature. Routing calls have TE's defaults (inspect: no; modify: no;
// quantized GEMM: yes, never changing). A feature overrides those it answers. Called only for
// (GEMM, tensor) pairs its config selects.
class Feature {
 public:
  virtual ~Feature() = default;
  virtual const FeatureSpec& spec() const = 0;

  // Is `tensor` inspected at `iteration` (statistics, dumps)?
  virtual Route inspect_tensor_enabled(const CallContext&, TensorKind, int64_t) const {
    return {false, kNever};
  }
  // Is the quantized form of `tensor`, as `gemm` reads it, inspected? (TE marks it deprecated;
  // kept so that features written against it work.)
  virtual Route inspect_tensor_postquantize_enabled(const CallContext&, GemmRole, TensorKind,
                                                    int64_t) const {
    return {false, kNever};
  }
  // Does this feature replace `tensor` as `gemm` reads it? (One feature per GEMM and tensor.)
  virtual Route modify_tensor_enabled(const CallContext&, GemmRole, TensorKind, int64_t) const {
    return {false, kNever};
  }
  // Does `gemm` run quantized? A modified tensor's GEMM follows modify_tensor_enabled instead.
  virtual Route fp8_gemm_enabled(const CallContext&, GemmRole, int64_t) const {
    return {true, kNever};
  }

  // TE's inspect_tensor, a GEMM call: after each run (forward and backward of one micro-batch)
  // of an iteration where inspect_tensor_enabled answered yes for `tensor`, the tensor as that
  // run held it. The statistics it returns are logged for the iteration (TE's log line and the
  // JSON lines). Built-in features do their work elsewhere and keep this default.
  virtual std::vector<FeatureStat> inspect_tensor(const CallContext&, TensorKind,
                                                  const InspectedTensor&, int64_t) const {
    return {};
  }

  // TE's GEMM call modify_tensor, compiled: how `tensor` is replaced as `gemm` reads it, asked
  // where modify_tensor_enabled answered yes (with the same settings and iteration). Unlike TE's
  // call it sees no tensor: it returns a description (a built-in modification, or y = f(x) as a
  // scalar expression) that the plan variant computes on the device and in the CPU reference.
  // The answer must depend only on the settings, GEMM and tensor while the routing holds (the
  // variant is compiled once for all those iterations). nullopt (the default) is an error when
  // modify_tensor_enabled said yes.
  virtual std::optional<Modification> modify_tensor(const CallContext&, GemmRole, TensorKind,
                                                    int64_t) const {
    return std::nullopt;
  }
};

// Features by name: the built-in ones, then any an application registers.
class FeatureRegistry {
 public:
  // With TE's built-in features (builtin_features.cpp).
  static FeatureRegistry with_builtins();
  // Registers `feature` under its spec's name; a name registered already is an error
  // (std::invalid_argument naming it).
  void add(std::shared_ptr<const Feature> feature);
  const Feature* find(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted

 private:
  std::map<std::string, std::shared_ptr<const Feature>, std::less<>> features_;
};

}  // namespace opfuse::debug
