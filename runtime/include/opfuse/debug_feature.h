// Precision-debug features written by the application (docs/debugging.md, "C++ features"): a
// class derived from DebugFeature, given to CompileOptions::debug_features, is usable from the
// debug config by its name next to TE's built-in features. It declares the keys its config
// section takes (checked, with located errors, when the config is read) and answers TE's calls:
// the four routing calls, asked when a plan variant is chosen (never per step), and the two GEMM
// calls: modify_tensor, which describes how a GEMM operand is replaced (compiled into the variant,
// computed on the device and in the CPU reference), and inspect_tensor, which gets the tensor on
// the host after each run of an iteration where it is inspected and returns statistics to log.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace opfuse {

// TE's names: the tensors around a layer's GEMMs and the GEMMs.
enum class DebugTensor : std::uint8_t { Activation, Weight, Gradient, Output, Dgrad, Wgrad };
enum class DebugGemm : std::uint8_t { Fprop, Dgrad, Wgrad };
std::string_view debug_tensor_name(DebugTensor tensor);  // "activation", ...
std::string_view debug_gemm_name(DebugGemm gemm);        // "fprop", ...

// A routing answer: enabled or not, and the first later iteration at which the answer may differ
// (kDebugNever: it holds from now on). TE's bare bool is {enabled, iteration + 1}.
inline constexpr std::int64_t kDebugNever = std::numeric_limits<std::int64_t>::max();
struct DebugRoute {
  bool enabled = false;
  std::int64_t next = kDebugNever;
};

// A key the feature's config entry takes (besides `enabled`, and `tensors`/`gemms` and their
// struct forms for features that select tensors or GEMMs).
struct DebugKey {
  enum class Type : std::uint8_t {
    Bool,
    Int,          // integer >= 0
    PositiveInt,  // integer >= 1
    Number,       // a finite number
    Choice,       // one of `choices`
  };
  std::string name;
  Type type = Type::Bool;
  std::vector<std::string> choices = {};
  std::string doc = {};
  bool required = false;  // every tensor/GEMM the feature selects must have it
};

// The keys that apply to the GEMM/tensor a call asks about: the feature's flat keys overridden by
// the struct entries selecting it. Values were checked against the DebugKey types when the config
// was read; a missing key gives the fallback.
class DebugSettings {
 public:
  virtual ~DebugSettings() = default;
  virtual bool has(std::string_view key) const = 0;
  virtual bool get_bool(std::string_view key, bool fallback) const = 0;
  virtual std::int64_t get_int(std::string_view key, std::int64_t fallback) const = 0;
  virtual double get_number(std::string_view key, double fallback) const = 0;
  virtual std::string get_string(std::string_view key, std::string_view fallback) const = 0;
};

// y = f(x) for one element x of a tensor, as modify_tensor's pointwise replacement: built from
// x(), constants and the operations below, evaluated in fp32 on the device and the CPU.
class DebugExpr {
 public:
  enum class Op : std::uint8_t {
    X,
    Const,
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    Exp,
    Tanh,
    Sigmoid,
    Min,
    Max,
    SelectGt
  };
  struct Node {
    Op op = Op::X;
    double value = 0;                               // Const
    std::vector<std::shared_ptr<const Node>> args;  // SelectGt: a, b, then, otherwise
  };

  static DebugExpr x();
  DebugExpr(double constant);  // NOLINT(google-explicit-constructor): 2.0 * x() reads as math
  const Node& node() const { return *node_; }

  friend DebugExpr operator+(const DebugExpr& a, const DebugExpr& b);
  friend DebugExpr operator-(const DebugExpr& a, const DebugExpr& b);
  friend DebugExpr operator*(const DebugExpr& a, const DebugExpr& b);
  friend DebugExpr operator/(const DebugExpr& a, const DebugExpr& b);
  friend DebugExpr operator-(const DebugExpr& a);
  friend DebugExpr exp(const DebugExpr& a);
  friend DebugExpr tanh(const DebugExpr& a);
  friend DebugExpr sigmoid(const DebugExpr& a);
  friend DebugExpr min(const DebugExpr& a, const DebugExpr& b);
  friend DebugExpr max(const DebugExpr& a, const DebugExpr& b);
  // a > b ? then : otherwise (NaN compares false).
  friend DebugExpr select_gt(const DebugExpr& a, const DebugExpr& b, const DebugExpr& then,
                             const DebugExpr& otherwise);

 private:
  explicit DebugExpr(std::shared_ptr<const Node> node) : node_(std::move(node)) {}
  static DebugExpr make(Op op, std::vector<std::shared_ptr<const Node>> args);
  std::shared_ptr<const Node> node_;
};

// What modify_tensor returns: how the GEMM operand is replaced.
struct DebugModification {
  enum class Kind : std::uint8_t {
    FakeQuant,         // quantize-dequantize through `format` ("e4m3"/"e5m2"), current scaling
    PerTensorScaling,  // the GEMM's FP8 cast of this operand uses per-tensor current scaling
    Pointwise,         // y = expr(x)
  };
  Kind kind = Kind::Pointwise;
  std::string format = "e4m3";
  DebugExpr expr = DebugExpr::x();
  std::string description = {};  // Pointwise: what it does, for the dry run and the debug log
};

// An FP8 copy of an inspected tensor as a GEMM reads it (TE's rowwise_quantized_tensor and
// columnwise_quantized_tensor): host memory valid during the call; empty where there is none.
struct DebugQuantizedTensor {
  // As stored: the tensor's shape for the row-wise copy, [cols, rows] for the column-wise one.
  std::span<const std::int64_t> shape;
  std::span<const float> values;  // the FP8 numbers (unscaled) as fp32, row-major in `shape`
  // dequantized[r][c] = values[r][c] * scale_inv[r / block_rows][c / block_cols]: one value for a
  // per-tensor scale (block_rows = block_cols = 0), else the block grid, row-major
  // [ceil(rows / block_rows)][ceil(cols / block_cols)] of `shape` (1 x 128 or 128 x 128).
  std::span<const float> scale_inv;
  std::string_view format;  // "e4m3" or "e5m2"
  int block_rows = 0;
  int block_cols = 0;
  bool empty() const { return values.empty(); }
};

// The tensor inspect_tensor is given: host memory valid during the call.
struct DebugInspectedTensor {
  std::span<const std::int64_t> shape;  // row-major
  std::span<const float> values;        // the high-precision tensor as the run held it, as fp32
  // For a GEMM operand quantized in that iteration: the copy its first GEMM reads (fprop's for
  // the activation and the weight, dgrad's for the gradient), and the column-wise copy its other
  // GEMM reads where that is a quantization of its own (1 x 128 block scaling; per-tensor scaling
  // and 128 x 128 blocks read the row-wise copy transposed, and `columnwise` is empty).
  DebugQuantizedTensor rowwise;
  DebugQuantizedTensor columnwise;
};

struct DebugFeatureStat {
  std::string name;  // logged as {layer}_{tensor}_{name}
  double value = 0;
};

class DebugFeature {
 public:
  virtual ~DebugFeature() = default;
  // The name the config uses (`transformer_engine: {NAME: {...}}`); must differ from the
  // built-ins'.
  virtual std::string name() const = 0;
  virtual std::string doc() const { return {}; }
  virtual bool selects_tensors() const { return false; }  // takes tensors / tensors_struct
  virtual bool selects_gemms() const { return false; }    // takes gemms / gemms_struct
  virtual bool modifies() const { return false; }         // answers modify_tensor_enabled
  virtual std::vector<DebugTensor> tensors() const {
    return {};
  }  // those it may select; empty: all
  virtual std::vector<DebugKey> keys() const { return {}; }

  // The routing calls (TE's defaults). Called only for the GEMMs/tensors the config selects.
  virtual DebugRoute inspect_tensor_enabled(std::string_view /*layer*/, const DebugSettings&,
                                            DebugTensor, std::int64_t /*iteration*/) const {
    return {};
  }
  virtual DebugRoute modify_tensor_enabled(std::string_view /*layer*/, const DebugSettings&,
                                           DebugGemm, DebugTensor, std::int64_t) const {
    return {};
  }
  virtual DebugRoute fp8_gemm_enabled(std::string_view /*layer*/, const DebugSettings&, DebugGemm,
                                      std::int64_t) const {
    return {true, kDebugNever};
  }
  // The GEMM calls. modify_tensor is asked where modify_tensor_enabled said yes; its answer must
  // depend only on the settings, GEMM and tensor (a variant is compiled once for the iterations
  // its routing holds). inspect_tensor runs after each forward/backward where the tensor is
  // inspected; what it returns is logged for the iteration.
  virtual std::optional<DebugModification> modify_tensor(std::string_view /*layer*/,
                                                         const DebugSettings&, DebugGemm,
                                                         DebugTensor, std::int64_t) const {
    return std::nullopt;
  }
  virtual std::vector<DebugFeatureStat> inspect_tensor(std::string_view /*layer*/,
                                                       const DebugSettings&, DebugTensor,
                                                       const DebugInspectedTensor&,
                                                       std::int64_t /*iteration*/) const {
    return {};
  }
};

}  // namespace opfuse
