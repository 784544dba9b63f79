#include "ir/op_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>

#include "ir/backward_rules.h"
#include "ir/op_shape_rules.h"
#include "ir/pointwise_ops.h"
#include "support/assert.h"
#include "support/spelling.h"

namespace opfuse::ir {

namespace {

constexpr double kMaxDim = double(1ll << 40);  // far past any real tensor, well inside int64

// ---- attribute specs, one array per op -----------------------------------------------------

constexpr AttrSpec kNormAttrs[] = {
    {"size", AttrType::Int, true, 0, 1, kMaxDim, "the normalized (last) dimension"},
    {"eps", AttrType::Float, false, 1e-5, 0, 1, "added to the variance before the square root"},
    {"zero_centered_gamma", AttrType::Bool, false, 0, 0, 1,
     "weights are stored minus one (y = x_hat * (1 + gamma))"},
};
constexpr AttrSpec kLinearAttrs[] = {
    {"in", AttrType::Int, true, 0, 1, kMaxDim, "input features (the incoming last dimension)"},
    {"out", AttrType::Int, true, 0, 1, kMaxDim, "output features"},
    {"bias", AttrType::Bool, false, 1, 0, 1, "add a learned bias of size out"},
    {"parallel", AttrType::Name, false, 0, 0, 0,
     "tensor parallelism: column (weight split on out) or row (split on in); unset: none"},
    {"precision", AttrType::Name, false, 0, 0, 0,
     "high: its GEMMs run in the sequence's dtype under any recipe (a layer TE runs outside "
     "fp8_autocast); unset: as the recipe says"},
};
constexpr AttrSpec kCollectiveDimAttrs[] = {
    {"dim", AttrType::Int, false, 0, 0, 7, "the dimension gathered or scattered (0: the tokens)"},
};
constexpr AttrSpec kBiasAttrs[] = {
    {"size", AttrType::Int, true, 0, 1, kMaxDim, "the last dimension"},
};
constexpr AttrSpec kExtraAttrs[] = {
    {"name", AttrType::Name, true, 0, 0, 0,
     "the sequence input (add) or output (make) it refers to"},
};
constexpr AttrSpec kQuantizeAttrs[] = {
    {"forward", AttrType::Bool, false, 1, 0, 1, "quantize the forward activation"},
    {"backward", AttrType::Bool, false, 0, 0, 1, "quantize the gradient in backward"},
};
constexpr AttrSpec kConstantScaleAttrs[] = {
    {"scale", AttrType::Float, true, 0, -3.4e38, 3.4e38, "the constant factor"},
};
// p's range is closed at 1 here so `p = 1` reaches the shape rule, whose message says why.
constexpr AttrSpec kDropoutAttrs[] = {
    {"p", AttrType::Float, false, 0.1, 0, 1, "the probability of zeroing an element, below 1"},
    {"seed", AttrType::Int, false, 0, 0, 9007199254740992.0,
     "the Philox key (note \"Dropout\" in docs/language.md)"},
};
constexpr AttrSpec kReshapeAttrs[] = {
    {"shape", AttrType::Shape, true, 0, 0, 0, "the new shape; one entry may be -1 (inferred)"},
};

constexpr AttrSpec kCastFp8Attrs[] = {
    {"rowwise", AttrType::Bool, false, 1, 0, 1, "write the row-major FP8 copy"},
    {"columnwise", AttrType::Bool, false, 0, 0, 1, "write the transposed FP8 copy (for TN GEMMs)"},
};
constexpr AttrSpec kEmulatedCastAttrs[] = {
    {"columnwise", AttrType::Bool, false, 0, 0, 1,
     "blocks down the columns (the copy wgrad or dgrad reads) instead of along the rows"},
};
constexpr AttrSpec kTensorStatsAttrs[] = {
    {"slot", AttrType::Int, true, 0, 0, 1 << 20, "the statistics record (Sequence::inspections)"},
};
constexpr AttrSpec kTensorCaptureAttrs[] = {
    {"slot", AttrType::Int, true, 0, 0, 1 << 20, "the capture (Sequence::captures)"},
};
constexpr AttrSpec kModifyTensorAttrs[] = {
    {"feature", AttrType::Name, true, 0, 0, 0, "the debug feature that modifies the operand"},
    {"expression", AttrType::Name, true, 0, 0, 0,
     "y = f(x), compiler/ir/scalar_code.h; empty: fake quantization through the op's quantizer"},
};
constexpr AttrSpec kFusedAttrs[] = {
    {"pattern", AttrType::Name, true, 0, 0, 0, "the fusion pattern that formed the op"},
};

using shape_rules::add_extra_input_shape;
using shape_rules::all_gather_shape;
using shape_rules::bias_shape;
using shape_rules::dropout_shape;
using shape_rules::gated_shape;
using shape_rules::layernorm_shape;
using shape_rules::linear_shape;
using shape_rules::make_extra_output_shape;
using shape_rules::reduce_scatter_shape;
using shape_rules::reshape_shape;
using shape_rules::rmsnorm_shape;
using shape_rules::same_shape;
using shape_rules::user_gated_shape;
using shape_rules::user_norm_shape;
using shape_rules::user_plain_shape;

// ---- the table ----------------------------------------------------------------------------------

constexpr std::span<const AttrSpec> kNoAttrs{};

// The carrier of norm-like user-defined ops (compiler/ir/row_expr.h, ir::user_row_attrs).
constexpr AttrSpec kUserNormAttrs[] = {
    {"op", AttrType::Name, true, 0, 0, 0, "the user-defined op's name"},
    {"expression", AttrType::Name, true, 0, 0, 0,
     "its forward and backward row programs (compiler/ir/row_expr.h)"},
    {"stages", AttrType::Name, true, 0, 0, 0,
     "its reductions in order: s (sum_last), m (mean_last), x (max_last)"},
    {"params", AttrType::Name, false, 0, 0, 0,
     "its learned parameters, name:dtype:size:init joined by ',' (ir::encode_user_params)"},
};

const std::array<OpInfo, kNumOpKinds> kOps = {{
    // ---- user ops (kNumUserOpKinds) ----
    {OpKind::LayerNorm, "layernorm", KernelFamily::Norm, kNormAttrs, layernorm_shape,
     "[..., size] -> [..., size]", "LayerNorm over the last dimension, learned weight and bias",
     backward::layernorm},
    {OpKind::RMSNorm, "rmsnorm", KernelFamily::Norm, kNormAttrs, rmsnorm_shape,
     "[..., size] -> [..., size]", "RMSNorm over the last dimension, learned weight",
     backward::rmsnorm},
    {OpKind::Linear, "linear", KernelFamily::Gemm, kLinearAttrs, linear_shape,
     "[..., in] -> [..., out]", "y = x W^T (+ b); W is [out, in]", backward::linear},
    {OpKind::Bias, "bias", KernelFamily::Bias, kBiasAttrs, bias_shape, "[..., size] -> [..., size]",
     "adds a learned bias over the last dimension", backward::bias},
    {OpKind::AddExtraInput, "add_extra_input", KernelFamily::Residual, kExtraAttrs,
     add_extra_input_shape, "[...] -> [...]",
     "adds the named extra sequence input (a residual) to the tensor", backward::add_extra_input},
    {OpKind::MakeExtraOutput, "make_extra_output", KernelFamily::Alias, kExtraAttrs,
     make_extra_output_shape, "[...] -> [...]",
     "exposes the tensor at this point as the named extra sequence output (no copy)",
     backward::pass_through},
    {OpKind::Quantize, "quantize", KernelFamily::Cast, kQuantizeAttrs, same_shape, "[...] -> [...]",
     "quantizes the tensor with the sequence's recipe (forward and/or backward)",
     backward::quantize},
    {OpKind::ConstantScale, "constant_scale", KernelFamily::Scale, kConstantScaleAttrs, same_shape,
     "[...] -> [...]", "multiplies by a constant", backward::constant_scale},
    {OpKind::Identity, "identity", KernelFamily::Alias, kNoAttrs, same_shape, "[...] -> [...]",
     "passes the tensor through", backward::pass_through},
    {OpKind::UserNorm, "user_norm_op", KernelFamily::Norm, kUserNormAttrs, user_norm_shape,
     "[..., n] -> [..., n]",
     "a user-defined op with last-dimension reductions (its row programs are attributes)",
     backward::user_norm},
    {OpKind::Reshape, "reshape", KernelFamily::Alias, kReshapeAttrs, reshape_shape,
     "[...] -> shape", "views the tensor with a new shape of the same element count",
     backward::reshape},
    {OpKind::AllReduce, "all_reduce", KernelFamily::Collective, kNoAttrs, same_shape,
     "[...] -> [...]",
     "sums the ranks' partial tensors (a row-parallel linear's output); its backward passes the "
     "gradient through",
     backward::all_reduce},
    {OpKind::AllGather, "all_gather", KernelFamily::Collective, kCollectiveDimAttrs,
     all_gather_shape, "[n / tp, ...] -> [n, ...]",
     "concatenates the ranks' shares of dim 0 in rank order; its backward is reduce_scatter",
     backward::all_gather},
    {OpKind::ReduceScatter, "reduce_scatter", KernelFamily::Collective, kCollectiveDimAttrs,
     reduce_scatter_shape, "[n, ...] -> [n / tp, ...]",
     "sums the ranks' partial tensors and keeps this rank's share of dim 0; its backward is "
     "all_gather",
     backward::reduce_scatter},
    {OpKind::Dropout, "dropout", KernelFamily::Dropout, kDropoutAttrs, dropout_shape,
     "[..., n] -> [..., n]",
     "zeroes each element with probability p (a Philox draw per element and step) and scales "
     "the rest by 1 / (1 - p) in training; the identity in inference",
     backward::dropout},
    // ---- internal ops: made by passes (docs/architecture.md, "Training graph"); no backward ----
    {OpKind::CastFp8, "cast_fp8", KernelFamily::Cast, kCastFp8Attrs, nullptr,
     "[..., k] -> e4m3|e5m2[..., k] and/or [k, ...]", "FP8 cast with the op's quantizer"},
    {OpKind::Fp8Transpose, "fp8_transpose", KernelFamily::Cast, kNoAttrs, nullptr,
     "e4m3|e5m2[..., k] -> [k, ...]",
     "the transposed (column-wise) copy of an FP8 tensor: the same codes under the same "
     "quantizer, no rescaling"},
    {OpKind::EmulatedCast, "emulated_cast", KernelFamily::Cast, kEmulatedCastAttrs, nullptr,
     "[..., k] -> [..., k]",
     "quantizes to the quantizer's micro-scaled format (MXFP8, NVFP4), or with its Float8 "
     "blocks where the target has no block-scale GEMM, and decodes back: the values a GEMM of "
     "that format reads, for the high-precision GEMMs that run instead"},
    {OpKind::LayerNormBackward, "layernorm_backward", KernelFamily::Norm, kNormAttrs, nullptr,
     "(dy, x, gamma, mean, rstd) -> (dx, dgamma, dbeta)", "LayerNorm backward"},
    {OpKind::RMSNormBackward, "rmsnorm_backward", KernelFamily::Norm, kNormAttrs, nullptr,
     "(dy, x, gamma, rstd) -> (dx, dgamma)", "RMSNorm backward"},
    {OpKind::UserNormBackward, "user_norm_backward", KernelFamily::Norm, kUserNormAttrs, nullptr,
     "(dy, x, params...) -> (dx, dparams...)",
     "a norm-like user op's backward: recomputes its reductions, then the adjoints"},
    {OpKind::LinearDgrad, "linear_dgrad", KernelFamily::Gemm, kLinearAttrs, nullptr,
     "(dy[..., out], W[out, in] or W^T[in, out]) -> dx[..., in]", "dx = dy W"},
    {OpKind::LinearWgrad, "linear_wgrad", KernelFamily::Gemm, kLinearAttrs, nullptr,
     "(dy or dy^T, x or x^T) -> dW[out, in]", "dW = dy^T x"},
    {OpKind::BiasGrad, "bias_grad", KernelFamily::Bias, kBiasAttrs, nullptr,
     "[..., size] -> [size]", "column sums of the gradient"},
    {OpKind::GradAdd, "grad_add", KernelFamily::Residual, kNoAttrs, nullptr, "(a, b) -> a + b",
     "sums two gradients of one value"},
    {OpKind::TensorStats, "tensor_stats", KernelFamily::Stats, kTensorStatsAttrs, nullptr,
     "(x) -> ()", "statistics of x into a record the executor logs (precision-debug features)"},
    {OpKind::TensorCapture, "tensor_capture", KernelFamily::Stats, kTensorCaptureAttrs, nullptr,
     "(x) -> ()", "a float32 copy of x the executor keeps (DumpTensors, inspect_tensor)"},
    {OpKind::ModifyTensor, "modify_tensor", KernelFamily::Cast, kModifyTensorAttrs, nullptr,
     "[...] -> [...]",
     "a GEMM operand as a precision-debug feature replaces it: fake quantization (current "
     "scaling) through the op's quantizer, or y = f(x) elementwise"},
    {OpKind::DropoutBackward, "dropout_backward", KernelFamily::Dropout, kDropoutAttrs, nullptr,
     "(dy[..., n], mask fp32[..., ceil(n / 32)]) -> dx[..., n]",
     "dx = dy * keep / (1 - p), keep read from the forward's saved mask bits"},
    {OpKind::Fused, "fused", KernelFamily::Alias, kFusedAttrs, nullptr, "parts",
     "a fusion; its meaning is its parts run in order"},
}};

// The pointwise ops' entries, made once from their definitions (compiler/ir/pointwise_defs.cpp).
struct PointwiseTables {
  std::vector<OpInfo> forward, backward;
  std::vector<OpInfo> user;  // all_ops(): the fixed user ops with the pointwise ones after bias
};

const PointwiseTables& pointwise_tables() {
  static const PointwiseTables tables = [] {
    PointwiseTables t;
    const auto defs = all_pointwise_defs();
    OPFUSE_ASSERT(kFirstPointwise + defs.size() <= kFirstPointwiseBackward &&
                      kFirstPointwiseBackward + defs.size() <= 256,
                  "{} pointwise ops do not fit the OpKind ranges", defs.size());
    for (size_t i = 0; i < defs.size(); ++i) {
      const PointwiseDef& d = *defs[i];
      const KernelFamily family =
          d.gated ? KernelFamily::GatedActivation : KernelFamily::Activation;
      t.forward.push_back({OpKind(kFirstPointwise + i), d.name, family, d.attrs,
                           d.user_defined ? (d.gated ? user_gated_shape : user_plain_shape)
                                          : (d.gated ? gated_shape : same_shape),
                           d.gated ? "[..., 2n] -> [..., n]" : "[...] -> [...]", d.doc,
                           backward::pointwise, &d});
      t.backward.push_back(
          {OpKind(kFirstPointwiseBackward + i),
           d.gated ? "gated_activation_backward" : "activation_backward", family, d.attrs, nullptr,
           d.gated ? "(dy[..., n], x[..., 2n]) -> dx[..., 2n]" : "(dy, x) -> dx",
           d.gated ? "gradient of both halves" : "dx = dy * act'(x)", nullptr, &d});
    }
    const auto fixed = std::span(kOps).first(kNumUserOpKinds);
    for (const OpInfo& op : fixed) {
      if (op.kind == OpKind::UserNorm) continue;  // a carrier too, not written by name
      t.user.push_back(op);
      // The carriers of user-defined ops are not written by name (compiler/ir/pointwise_ops.h).
      if (op.kind == OpKind::Bias)
        t.user.insert(t.user.end(), t.forward.begin(),
                      t.forward.begin() + std::ptrdiff_t(pointwise_defs().size()));
    }
    return t;
  }();
  return tables;
}

template <typename T>
const T& get_attr(const AttrList& attrs, std::string_view name) {
  for (const Attr& a : attrs) {
    if (a.name == name) {
      OPFUSE_ASSERT(std::holds_alternative<T>(a.value), "attribute '{}' has another type", name);
      return std::get<T>(a.value);
    }
  }
  internal_failure(__FILE__, __LINE__, fmt::format("attribute '{}' is missing", name));
}

}  // namespace

std::string_view attr_type_name(AttrType t) {
  switch (t) {
    case AttrType::Int:
      return "integer";
    case AttrType::Float:
      return "number";
    case AttrType::Bool:
      return "bool";
    case AttrType::Name:
      return "name";
    case AttrType::Shape:
      return "shape";
  }
  return "?";
}

std::string_view kernel_family_name(KernelFamily f) {
  switch (f) {
    case KernelFamily::Norm:
      return "norm";
    case KernelFamily::Activation:
      return "activation";
    case KernelFamily::GatedActivation:
      return "gated_activation";
    case KernelFamily::Gemm:
      return "gemm";
    case KernelFamily::Bias:
      return "bias";
    case KernelFamily::Residual:
      return "residual";
    case KernelFamily::Alias:
      return "alias";
    case KernelFamily::Stats:
      return "stats";
    case KernelFamily::Cast:
      return "cast";
    case KernelFamily::Scale:
      return "scale";
    case KernelFamily::Collective:
      return "collective";
    case KernelFamily::Dropout:
      return "dropout";
  }
  return "?";
}

int64_t attr_int(const AttrList& attrs, std::string_view name) {
  return get_attr<int64_t>(attrs, name);
}
double attr_float(const AttrList& attrs, std::string_view name) {
  return get_attr<double>(attrs, name);
}
bool attr_bool(const AttrList& attrs, std::string_view name) { return get_attr<bool>(attrs, name); }
const std::string& attr_name(const AttrList& attrs, std::string_view name) {
  return get_attr<std::string>(attrs, name);
}
const Shape& attr_shape(const AttrList& attrs, std::string_view name) {
  return get_attr<Shape>(attrs, name);
}

LinearParallel linear_parallel(const AttrList& attrs) {
  const std::string& mode = attr_name(attrs, "parallel");
  if (mode.empty() || mode == "none") return LinearParallel::None;
  if (mode == "column") return LinearParallel::Column;
  if (mode == "row") return LinearParallel::Row;
  return LinearParallel::Invalid;
}

bool linear_high_precision(const AttrList& attrs) {
  return attr_name(attrs, "precision") == "high";
}

bool is_collective(OpKind kind) {
  return kind == OpKind::AllReduce || kind == OpKind::AllGather || kind == OpKind::ReduceScatter;
}

std::string attr_value_string(const AttrValue& v) {
  struct Visitor {
    std::string operator()(int64_t i) const { return fmt::format("{}", i); }
    std::string operator()(double d) const { return fmt::format("{}", d); }
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const Shape& s) const { return shape_string(s); }
  };
  return std::visit(Visitor{}, v);
}

const OpInfo& op_info(OpKind kind) {
  const auto k = static_cast<size_t>(kind);
  const PointwiseTables& pointwise = pointwise_tables();
  const OpInfo* info = nullptr;
  if (k < kNumOpKinds) {
    info = &kOps[k];
  } else if (k >= kFirstPointwiseBackward &&
             k - kFirstPointwiseBackward < pointwise.backward.size()) {
    info = &pointwise.backward[k - kFirstPointwiseBackward];
  } else if (k >= kFirstPointwise && k - kFirstPointwise < pointwise.forward.size()) {
    info = &pointwise.forward[k - kFirstPointwise];
  }
  OPFUSE_ASSERT(info != nullptr, "no op kind {}", k);
  OPFUSE_ASSERT(info->kind == kind, "op table out of order at {}", k);
  return *info;
}

bool is_internal(OpKind kind) {
  return static_cast<size_t>(kind) >= kNumUserOpKinds && !is_pointwise(kind);
}

OpKind pointwise_kind(const PointwiseDef& def) {
  const auto defs = all_pointwise_defs();
  const auto it = std::ranges::find(defs, &def);
  OPFUSE_ASSERT(it != defs.end(), "'{}' is not in all_pointwise_defs()", def.name);
  return OpKind(kFirstPointwise + size_t(it - defs.begin()));
}

OpKind pointwise_backward_kind(const PointwiseDef& def) {
  return OpKind(static_cast<size_t>(pointwise_kind(def)) - kFirstPointwise +
                kFirstPointwiseBackward);
}

bool is_pointwise(OpKind kind) {
  const auto k = static_cast<size_t>(kind);
  return k >= kFirstPointwise && k - kFirstPointwise < all_pointwise_defs().size();
}

bool is_pointwise_backward(OpKind kind) {
  const auto k = static_cast<size_t>(kind);
  return k >= kFirstPointwiseBackward && k - kFirstPointwiseBackward < all_pointwise_defs().size();
}

const PointwiseDef* pointwise_def(OpKind kind) {
  return is_pointwise(kind) || is_pointwise_backward(kind) ? op_info(kind).pointwise : nullptr;
}

const OpInfo* find_op(std::string_view name) {
  for (const OpInfo& op : all_ops())
    if (op.name == name) return &op;
  return nullptr;
}

std::span<const OpInfo> all_ops() { return pointwise_tables().user; }

std::string suggest_op(std::string_view name) {
  std::vector<std::string> names;
  names.reserve(all_ops().size());
  for (const OpInfo& op : all_ops()) names.emplace_back(op.name);
  return closest_spelling(name, names);
}

}  // namespace opfuse::ir
