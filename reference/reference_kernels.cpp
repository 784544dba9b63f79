#include "reference_kernels.h"

#include <algorithm>
#include <array>
#include <limits>
#include <span>
#include <type_traits>

#include "dropout.h"
#include "ir/scalar_code.h"
#include "numerics.h"
#include "quant_stats.h"
#include "reference_ops.h"
#include "row_ops.h"
#include "support/assert.h"

namespace opfuse::cpu {

void round_as_stored(std::span<float> values, ir::DType dtype) {
  if (dtype == ir::DType::BF16) round_to_bf16(values);
  if (dtype == ir::DType::FP16) round_to_fp16(values);
}

namespace {

using ir::OpKind;

template <typename T>
void fake_quantize_values(Quantizer& quantizer, std::span<T> values, int64_t cols) {
  if constexpr (std::is_same_v<T, float>) {
    fake_quantize(quantizer, values, cols);
  } else {
    std::vector<float> f(values.begin(), values.end());
    fake_quantize(quantizer, f, cols);
    std::copy(f.begin(), f.end(), values.begin());
  }
}

// The largest finite value of a block cast's source dtype: what an infinite block scale becomes
// (runtime/cpu/block_quantization.h).
float value_for_inf(ir::DType source) {
  switch (source) {
    case ir::DType::BF16:
      return bf16_max_finite();
    case ir::DType::FP16:
      return fp16_max_finite();
    default:
      return std::numeric_limits<float>::max();
  }
}

Fp8Format fp8_format_of(ir::DType d) {
  return d == ir::DType::E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
}

// A GEMM whose FP8 operands carry block scales: cuBLASLt's block scale modes, as TE's reference
// defines them (block_scaled_gemm). Both operands are stored K contiguous: a [m, k], b [n, k].
// Returns false (nothing done) for a GEMM of per-tensor or high-precision operands.
template <typename T>
bool block_gemm(ReferenceContext<T>& ctx, const ir::Operation& op, Tensor<T>& d) {
  const auto a = ctx.block_scaled.find(op.operands.at(0));
  const auto b = ctx.block_scaled.find(op.operands.at(1));
  const auto none = ctx.block_scaled.end();
  if (a == none && b == none) return false;
  OPFUSE_ASSERT(a != none && b != none, "GEMM '{}' mixes block-scaled and other operands",
                op.instance);
  const std::vector<float> result =
      block_scaled_gemm(a->second.copy, a->second.two_d, b->second.copy, b->second.two_d,
                        fp8_format_of(ctx.seq.value(a->first).type.dtype),
                        fp8_format_of(ctx.seq.value(b->first).type.dtype));
  OPFUSE_ASSERT(result.size() == d.data.size(), "block GEMM '{}' makes {} values for {}",
                op.instance, result.size(), d.data.size());
  std::copy(result.begin(), result.end(), d.data.begin());
  return true;
}

// [rows, cols] row-major -> [cols, rows].
template <typename T>
std::vector<T> transpose(std::span<const T> x, int64_t rows, int64_t cols) {
  std::vector<T> out(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return out;
}

template <typename T>
void scale_result(Tensor<T>& y, T factor) {
  if (factor != T(1))
    for (T& v : y.data) v *= factor;
}

// ---- the kernels, one per kind (or per group of kinds with one meaning)
// --------------------------

template <typename T>
void layernorm(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& x = ctx.in(op, 0);
  std::vector<T> mean(size_t(x.rows())), rstd(size_t(x.rows()));
  Tensor<T>& y = ctx.out(op, 0);
  ops::layernorm_forward<T>(x.data, ctx.in(op, 1).data, ctx.in(op, 2).data, x.cols(),
                            ir::attr_float(op.attrs, "eps"),
                            ir::attr_bool(op.attrs, "zero_centered_gamma"), y.data, mean, rstd);
  if (op.results.size() == 3) {  // build-backward saved the statistics
    ctx.out(op, 1).data = mean;
    ctx.out(op, 2).data = rstd;
  }
}

template <typename T>
void rmsnorm(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& x = ctx.in(op, 0);
  std::vector<T> rstd(size_t(x.rows()));
  Tensor<T>& y = ctx.out(op, 0);
  ops::rmsnorm_forward<T>(x.data, ctx.in(op, 1).data, x.cols(), ir::attr_float(op.attrs, "eps"),
                          ir::attr_bool(op.attrs, "zero_centered_gamma"), y.data, rstd);
  if (op.results.size() == 2) ctx.out(op, 1).data = rstd;  // saved for backward
}

template <typename T>
void layernorm_backward(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& dy = ctx.in(op, 0);
  const Tensor<T>& x = ctx.in(op, 1);
  Tensor<T>& dx = ctx.out(op, 0);
  Tensor<T>& dgamma = ctx.out(op, 1);
  ops::layernorm_backward<T>(
      x.data, ctx.in(op, 2).data, dy.data, ctx.in(op, 3).data, ctx.in(op, 4).data, x.cols(),
      ir::attr_bool(op.attrs, "zero_centered_gamma"), dx.data, dgamma.data, ctx.out(op, 2).data);
}

template <typename T>
void rmsnorm_backward(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& dy = ctx.in(op, 0);
  const Tensor<T>& x = ctx.in(op, 1);
  Tensor<T>& dx = ctx.out(op, 0);
  Tensor<T>& dgamma = ctx.out(op, 1);
  ops::rmsnorm_backward<T>(x.data, ctx.in(op, 2).data, dy.data, ctx.in(op, 3).data, x.cols(),
                           ir::attr_bool(op.attrs, "zero_centered_gamma"), dx.data, dgamma.data);
}

// GEMMs apply their FP8 operands' scale_inv to the product, as cuBLASLt does.
template <typename T>
void linear(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& x = ctx.in(op, 0);
  Tensor<T>& y = ctx.out(op, 0);
  const int64_t n = y.cols(), k = x.cols();
  if (!block_gemm(ctx, op, y)) {
    ops::linear_forward<T>(x.data, ctx.in(op, 1).data, x.rows(), n, k, y.data);
    scale_result(y, ctx.operand_scale(op, 0) * ctx.operand_scale(op, 1));
  }
  if (ir::attr_bool(op.attrs, "bias")) ops::add_bias<T>(y.data, ctx.in(op, 2).data, n);
}

template <typename T>
void linear_dgrad(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& dy = ctx.in(op, 0);
  const Tensor<T>& w = ctx.in(op, 1);
  Tensor<T>& dx = ctx.out(op, 0);
  const int64_t m = dy.rows(), n = dy.cols(), k = dx.cols();
  if (block_gemm(ctx, op, dx)) return;
  if (ctx.transposed[op.operands[1]]) {
    ops::linear_forward<T>(dy.data, w.data, m, k, n, dx.data);  // dx = dy (W^T)^T
  } else {
    ops::linear_dgrad<T>(dy.data, w.data, m, n, k, dx.data);
  }
  scale_result(dx, ctx.operand_scale(op, 0) * ctx.operand_scale(op, 1));
}

template <typename T>
void linear_wgrad(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& dy = ctx.in(op, 0);
  const Tensor<T>& x = ctx.in(op, 1);
  Tensor<T>& dw = ctx.out(op, 0);
  const int64_t n = dw.rows(), k = dw.cols();
  const bool dy_t = ctx.transposed[op.operands[0]], x_t = ctx.transposed[op.operands[1]];
  if (block_gemm(ctx, op, dw)) return;
  if (dy_t && x_t) {
    // dy^T [N, M], x^T [K, M]; M counts every token (a [batch, seq] input too).
    ops::linear_forward<T>(dy.data, x.data, n, k, dy.numel() / n, dw.data);
  } else {
    OPFUSE_ASSERT(!dy_t && !x_t, "wgrad of '{}' mixes transposed and row-wise operands",
                  op.instance);
    ops::linear_wgrad<T>(dy.data, x.data, dy.rows(), n, k, dw.data);
  }
  scale_result(dw, ctx.operand_scale(op, 0) * ctx.operand_scale(op, 1));
}

template <typename T>
void bias(ReferenceContext<T>& ctx, const ir::Operation& op) {
  Tensor<T>& y = ctx.out(op, 0);
  y.data = ctx.in(op, 0).data;
  ops::add_bias<T>(y.data, ctx.in(op, 1).data, y.cols());
}

template <typename T>
void bias_grad(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& dy = ctx.in(op, 0);
  ops::bias_grad<T>(dy.data, dy.cols(), ctx.out(op, 0).data);
}

// add_extra_input (the extra input is the last operand) and grad_add.
template <typename T>
void add(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& a = ctx.in(op, 0);
  const Tensor<T>& b = ctx.values[op.operands.back()];
  Tensor<T>& y = ctx.out(op, 0);
  for (size_t i = 0; i < y.data.size(); ++i) y.data[i] = a.data[i] + b.data[i];
}

template <typename T>
void constant_scale(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const T scale = T(ir::attr_float(op.attrs, "scale"));
  const Tensor<T>& x = ctx.in(op, 0);
  Tensor<T>& y = ctx.out(op, 0);
  for (size_t i = 0; i < y.data.size(); ++i) y.data[i] = x.data[i] * scale;
}

// Fake quantization through the op's quantizer; the identity without one.
template <typename T>
void quantize_op(ReferenceContext<T>& ctx, const ir::Operation& op) {
  Tensor<T>& y = ctx.out(op, 0);
  y.data = ctx.in(op, 0).data;
  if (op.quantizer >= 0) {
    Quantizer& q = ctx.quantizers.at(size_t(op.quantizer));
    q.block.value_for_inf = value_for_inf(ctx.seq.value(op.operands[0]).type.dtype);
    fake_quantize_values<T>(q, y.data, y.cols());
  }
}

// Note "Block summaries" (runtime/cpu/block_summary.h): the summary of the copy the cast `op`
// just made, replacing its quantizer's earlier one of that copy.
template <typename T>
void record_summary(ReferenceContext<T>& ctx, const ir::Operation& op, bool columnwise,
                    const BlockSummary& summary) {
  const Quantizer& q = ctx.quantizers.at(size_t(op.quantizer));
  const plan::QuantSpec& spec = ctx.seq.quantizers.at(size_t(op.quantizer)).spec;
  BlockCopySummary& s = ctx.block_summaries[{op.quantizer, columnwise}];
  s.quantizer = q.name;
  s.columnwise = columnwise;
  s.format_name = std::string(plan::dtype_name(spec.format));
  // The spec's block is the row-wise copy's; the column-wise copy's runs down the columns.
  s.block_rows = columnwise ? spec.block.cols : spec.block.rows;
  s.block_cols = columnwise ? spec.block.rows : spec.block.cols;
  s.summary = summary;
  s.has_tensor_scale = spec.nvfp4();
  s.tensor_scale = spec.nvfp4() ? q.state.scale : 0.0f;
}

// A block-scaled cast (runtime/cpu/block_quantization.h): each copy quantized with its own
// blocks, the codes in the results and each copy's scale grid kept for the GEMMs that read it.
template <typename T>
void block_cast(ReferenceContext<T>& ctx, const ir::Operation& op, Quantizer& q) {
  const ir::ValueId source = op.operands[0];
  const Tensor<T>& x = ctx.values[source];
  // fp8_weights: the weight as it was when the parameters last changed (reference_executor.cpp).
  const auto weight = ctx.weight_codes.find(source);
  std::vector<float> as_float = weight != ctx.weight_codes.end()
                                    ? weight->second.first
                                    : std::vector<float>(x.data.begin(), x.data.end());
  // Folded into an activation (activation_block_cast, dact_block_cast), the source is the
  // activation's unrounded value: the fused kernel quantizes it as stored in its dtype, as the
  // unfused pair does (templates/block_activation.cuh; rounding is idempotent).
  round_as_stored(as_float, ctx.seq.value(source).type.dtype);
  BlockQuantParams params = q.block;
  params.value_for_inf = value_for_inf(ctx.seq.value(source).type.dtype);
  const bool transposed_layout =
      ctx.seq.quantizers.at(size_t(op.quantizer)).columnwise_layout == plan::CopyLayout::Transposed;
  OPFUSE_ASSERT(transposed_layout || !ir::attr_bool(op.attrs, "columnwise"),
                "block cast '{}' makes a column-wise copy that is not transposed", op.instance);
  size_t r = 0;
  auto keep = [&](BlockQuantizedCopy copy, bool columnwise) {
    Tensor<T>& y = ctx.out(op, r);
    for (size_t i = 0; i < copy.data.size(); ++i)
      y.data[i] = T(fp8_to_float(copy.data[i], q.format));
    record_summary(ctx, op, columnwise, summarize_block_copy(copy, q.format, params.two_d));
    ctx.block_scaled[op.results[r]] = {std::move(copy), params.two_d};
    ++r;
  };
  if (ir::attr_bool(op.attrs, "rowwise"))
    keep(block_quantize_rowwise(as_float, x.rows(), x.cols(), params), false);
  if (ir::attr_bool(op.attrs, "columnwise"))
    keep(block_quantize_columnwise(as_float, x.rows(), x.cols(), params), true);
}

// Real FP8 values: the results hold the codes, their scale_inv is kept per value for the GEMMs.
template <typename T>
void cast_fp8(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const ir::ValueId source = op.operands[0];
  Quantizer& q = ctx.quantizers.at(size_t(op.quantizer));
  const Tensor<T>& x = ctx.values[source];
  if (q.block_scaled) return block_cast(ctx, op, q);
  std::vector<float> codes(x.data.size());
  float inv = 0.0f;
  if (auto it = ctx.weight_codes.find(source); it != ctx.weight_codes.end()) {
    codes = it->second.first;  // fp8_weights: the stored FP8 weight, cast when it last changed
    inv = it->second.second;
  } else {
    const std::vector<float> as_float(x.data.begin(), x.data.end());
    inv = quantize(q, as_float, codes);
  }
  size_t r = 0;
  if (ir::attr_bool(op.attrs, "rowwise")) {
    Tensor<T>& y = ctx.out(op, r++);
    std::copy(codes.begin(), codes.end(), y.data.begin());
    ctx.scale_inv[op.results[r - 1]] = inv;
  }
  if (ir::attr_bool(op.attrs, "columnwise")) {
    Tensor<T>& y = ctx.out(op, r++);
    // The column-wise copy holds the same codes (per-tensor scale); stored transposed for
    // TN-only GEMMs (QuantizerDecl::columnwise_layout).
    const std::vector<float> t = ctx.seq.quantizers.at(size_t(op.quantizer)).columnwise_layout ==
                                         plan::CopyLayout::Transposed
                                     ? transpose<float>(codes, x.rows(), x.cols())
                                     : codes;
    std::copy(t.begin(), t.end(), y.data.begin());
    ctx.scale_inv[op.results[r - 1]] = inv;
  }
}

// The column-wise copy of FP8 codes another op made (gather_fp8: after the all_gather): the same
// codes transposed, under the same scale_inv; the quantizer's amax is not touched.
template <typename T>
void fp8_transpose(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& x = ctx.in(op, 0);
  Tensor<T>& y = ctx.out(op, 0);
  y.data = transpose<T>(x.data, x.rows(), x.cols());
  ctx.scale_inv[op.results[0]] = ctx.scale_inv[op.operands[0]];
}

// An MXFP8 / NVFP4 copy decoded to the source's dtype (cpu::micro_cast). A quantizer's two
// copies of one tensor are made one after the other, the row-wise first: only the first measures
// NVFP4's tensor scale (a Hadamard-transformed column-wise copy has a quantizer of its own).
// A Float8 block-scaled copy where block scaling is emulated (note "Emulated block scaling" in
// docs/architecture.md): cpu::block_fake_quantize with the quantizer's blocks, in x's layout.
// Note "Quantized boundaries": a quantized input's MXFP8 / NVFP4 codes are decoded (in x's
// orientation), and a quantized output's copies keep their codes and scales (the value holds the
// decoded values as stored, for printing; the output is read from the codes).
template <typename T>
void emulated_cast(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& x = ctx.in(op, 0);
  Quantizer& q = ctx.quantizers.at(size_t(op.quantizer));
  const bool columnwise = ir::attr_bool(op.attrs, "columnwise");
  if (ctx.seq.value(op.operands[0]).quantizer >= 0) {
    const std::vector<float> y = micro_decode(ctx.micro_codes.at(op.operands[0]));
    Tensor<T>& out = ctx.out(op, 0);
    std::copy(y.begin(), y.end(), out.data.begin());
    return;
  }
  std::vector<float> as_float(x.data.begin(), x.data.end());
  // Folded into a norm (norm_micro_cast), the source is the norm's unrounded value: the fused
  // kernel quantizes it as stored in its dtype, as the unfused pair does (templates/norm.cuh;
  // rounding is idempotent).
  round_as_stored(as_float, ctx.seq.value(op.operands[0]).type.dtype);
  std::vector<float> y;
  if (q.micro_scaled && ctx.seq.value(op.results[0]).quantizer >= 0) {
    const bool measure = !columnwise || !ctx.seq.quantizers.at(size_t(op.quantizer)).usages.rowwise;
    MicroCopy copy = micro_quantize(q, as_float, x.rows(), x.cols(), columnwise, measure);
    y = micro_decode(copy);
    if (copy.nvfp4 && columnwise) y = transpose<float>(y, x.rows(), x.cols());
    ctx.micro_codes[op.results[0]] = std::move(copy);
  } else if (q.micro_scaled) {
    const bool measure = !columnwise || !ctx.seq.quantizers.at(size_t(op.quantizer)).usages.rowwise;
    OPFUSE_ASSERT(q.index == uint32_t(op.quantizer), "quantizer '{}' has index {}, not {}", q.name,
                  q.index, op.quantizer);
    BlockSummary summary;
    y = micro_cast(q, as_float, x.rows(), x.cols(), columnwise, measure, &summary);
    record_summary(ctx, op, columnwise, summary);
  } else {
    // float8_block_scaling emulated (no block-scale GEMM on the target): no summary (the block
    // summaries cover the recipes' native copies and MXFP8/NVFP4; docs/architecture.md).
    OPFUSE_ASSERT(q.block_scaled, "emulated cast '{}' of quantizer '{}' that is not block-scaled",
                  op.instance, q.name);
    BlockQuantParams params = q.block;
    params.value_for_inf = value_for_inf(ctx.seq.value(op.operands[0]).type.dtype);
    y = block_fake_quantize(as_float, x.rows(), x.cols(), params, columnwise);
  }
  Tensor<T>& out = ctx.out(op, 0);
  std::copy(y.begin(), y.end(), out.data.begin());
}

// make_extra_output, identity, reshape: a copy here, an alias on the GPU.
template <typename T>
void copy(ReferenceContext<T>& ctx, const ir::Operation& op) {
  ctx.out(op, 0).data = ctx.in(op, 0).data;
}

// Pointwise ops and their backward: evaluated from the kind's definition
// (compiler/ir/pointwise_ops.h) with the op's attributes.
// A user-defined op's learned parameters follow its input: forward (x, params...), backward
// (dy, x, params...) -> (dx, dparams...) (ir::backward::pointwise).
template <typename T>
void pointwise(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const ir::PointwiseExpr expr(*ir::pointwise_def(op.kind), op.attrs, /*device=*/false);
  std::vector<std::span<const T>> params;
  for (size_t i = 1; i <= size_t(expr.params()); ++i) params.emplace_back(ctx.in(op, i).data);
  Tensor<T>& y = ctx.out(op, 0);
  ops::pointwise_forward<T>(expr, ctx.in(op, 0).data, params, y.cols(), y.data);
}

template <typename T>
void pointwise_backward(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const ir::PointwiseExpr expr(*ir::pointwise_def(op.kind), op.attrs, /*device=*/false);
  const Tensor<T>& dy = ctx.in(op, 0);
  std::vector<std::span<const T>> params;
  for (size_t i = 2; i < 2 + size_t(expr.params()); ++i) params.emplace_back(ctx.in(op, i).data);
  Tensor<T>& dx = ctx.out(op, 0);
  std::vector<std::span<T>> dparams;
  for (size_t k = 1; k <= size_t(expr.params()); ++k) dparams.emplace_back(ctx.out(op, k).data);
  ops::pointwise_backward<T>(expr, ctx.in(op, 1).data, params, dy.data, dy.cols(), dx.data,
                             dparams);
}

// ---- the table: every fixed kind, in OpKind order
// ------------------------------------------------

// The statistics a debug config asked for (compiler/passes/debug_instrument.h), of the tensor as
// the run holds it (rounded to its dtype, as the device reads it), into the slot's record.
// A Quantized slot (LogFp8TensorStats): the cast its slot describes (reference/quant_stats.h), with
// the layer's quantizer of the tensor ("<layer>.input" / ".weight" / ".grad_output") for
// QuantStatCast::Quantizer (with blocks: its block cast).
template <typename T>
debug::QuantizedMoments quantized_record(const ReferenceContext<T>& ctx, const plan::StatSlot& s,
                                         std::span<const float> x, int64_t rows, int64_t cols,
                                         debug::ExponentHistogram* histogram) {
  QuantStatsCast c;
  c.cast = s.cast;
  c.format = s.format == plan::DType::E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  c.block_size = s.block_size;
  c.dims = s.dims;
  c.columnwise = s.columnwise;
  if (s.cast == plan::QuantStatCast::Quantizer) {
    const std::string role =
        s.tensor == "activation" ? "input" : (s.tensor == "weight" ? "weight" : "grad_output");
    const std::string name = s.layer + "." + role;
    size_t i = 0;
    while (i < ctx.seq.quantizers.size() && ctx.seq.quantizers[i].name != name) ++i;
    OPFUSE_ASSERT(i < ctx.seq.quantizers.size(), "no quantizer {} for its statistics", name);
    const Quantizer& q = ctx.quantizers.at(i);
    c.format = q.format;
    c.delayed = !q.current_scaling;
    c.scale = q.state.scale;
    c.scale_inv = q.state.scale_inv;
    c.epsilon = q.amax_epsilon;
    c.power_of_2 = q.power_of_2_scale;
    if (s.block_size > 0) {  // a block-scaled quantizer: its own block cast (plan/stat_slot.h)
      c.cast = plan::QuantStatCast::Float8Block;
      c.block_epsilon = q.block.epsilon;
      c.block_power_of_2 = q.block.power_of_2_scale;
    }
  }
  return quantized_stats(x, rows, cols, c, histogram);
}

template <typename T>
void tensor_stats(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& x = ctx.in(op, 0);
  const auto slot = size_t(ir::attr_int(op.attrs, "slot"));
  const plan::StatSlot& s = ctx.seq.inspections.at(slot);
  std::vector<float> values(x.data.begin(), x.data.end());
  // Inside a fused group the tensor may be one the kernel never stores (the high-precision input
  // of a folded FP8 cast, docs/debugging.md "Statistics fused into kernels"): its statistics are
  // those of the tensor in its dtype, as an unfused run holds it (rounding is idempotent).
  round_as_stored(values, ctx.seq.value(op.operands.at(0)).type.dtype);
  ctx.stat_records.resize(ctx.seq.inspections.size());
  if (s.record == plan::StatRecordKind::Quantized) {
    const int64_t cols = x.shape.empty() ? 1 : x.shape.back();
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    debug::ExponentHistogram histogram;
    ctx.stat_records[slot] = debug::as_record(
        quantized_record(ctx, s, values, rows, cols, s.exponent_histogram ? &histogram : nullptr));
    // Its parts follow it (plan::StatSlot::exponent_histogram).
    if (s.exponent_histogram) {
      OPFUSE_ASSERT(slot + size_t(debug::kExponentHistogramRecords) < ctx.stat_records.size(),
                    "the exponent histogram of record {} has no parts", slot);
      debug::histogram_to_records(
          histogram,
          std::span(ctx.stat_records).subspan(slot + 1, size_t(debug::kExponentHistogramRecords)));
    }
    return;
  }
  debug::TensorMoments m = debug::moments_of(values);
  if (s.block_size > 0) {
    const int64_t cols = x.shape.empty() ? 1 : x.shape.back();
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    m.max_blockwise_dynamic_range =
        debug::max_blockwise_dynamic_range(values, rows, cols, s.block_size, s.dims);
  }
  ctx.stat_records.resize(ctx.seq.inspections.size());
  ctx.stat_records[slot] = m;
}

// A copy of the tensor as the run holds it (rounded to its dtype) into the slot's capture.
template <typename T>
void tensor_capture(ReferenceContext<T>& ctx, const ir::Operation& op) {
  const Tensor<T>& x = ctx.in(op, 0);
  const auto slot = size_t(ir::attr_int(op.attrs, "slot"));
  ctx.captures.resize(ctx.seq.captures.size());
  debug::CapturedTensor& c = ctx.captures.at(slot);
  c.shape = x.shape;
  c.values.assign(x.data.begin(), x.data.end());
  // The FP8 copy a GEMM reads: its values are the codes, its scale_inv kept beside it (cast_fp8):
  // a scalar, or a block copy's grid without padding in the order plan::CaptureSlot gives.
  c.scale_inv.clear();
  const plan::CaptureSlot& s = ctx.seq.captures.at(slot);
  if (!s.quantized) return;
  const ir::ValueId copy = op.operands.at(0);
  if (s.block.rows == 0) {
    OPFUSE_ASSERT(copy < ctx.scale_inv.size(), "capture {} reads no per-tensor FP8 copy", slot);
    c.scale_inv = {ctx.scale_inv[copy]};
    return;
  }
  const auto scaled = ctx.block_scaled.find(copy);
  OPFUSE_ASSERT(scaled != ctx.block_scaled.end(), "capture {} reads no block-scaled copy", slot);
  const BlockQuantizedCopy& q = scaled->second.copy;
  const bool two_d = scaled->second.two_d;
  const int64_t block = s.block.cols;
  const int64_t col_blocks = (q.cols + block - 1) / block;
  if (two_d) {
    for (int64_t rb = 0; rb * block < q.rows; ++rb)
      for (int64_t cb = 0; cb < col_blocks; ++cb)
        c.scale_inv.push_back(q.scale_inv_at(rb * block, cb * block, true));
  } else {
    for (int64_t cb = 0; cb < col_blocks; ++cb)
      for (int64_t r = 0; r < q.rows; ++r)
        c.scale_inv.push_back(q.scale_inv_at(r, cb * block, false));
  }
}

// A GEMM operand as a debug feature replaces it (compiler/passes/debug_modify.h): fake
// quantization through the op's current-scaling quantizer, or y = f(x) with f decoded from the
// op's expression and evaluated in fp32 (as the generated kernel does).
template <typename T>
void modify_tensor(ReferenceContext<T>& ctx, const ir::Operation& op) {
  Tensor<T>& y = ctx.out(op, 0);
  y.data = ctx.in(op, 0).data;
  if (op.quantizer >= 0) {
    fake_quantize_values<T>(ctx.quantizers.at(size_t(op.quantizer)), y.data, y.cols());
    return;
  }
  const std::string& text = ir::attr_name(op.attrs, "expression");
  const auto f = ir::scalar::decode(text);
  OPFUSE_ASSERT(f.has_value(), "modify_tensor '{}' has a malformed expression '{}'", op.instance,
                text);
  const ir::scalar::NodeId roots[] = {f->value};
  const std::vector<ir::scalar::NodeId> order = f->graph.schedule(roots);
  std::vector<float> scratch(f->graph.size());
  for (T& v : y.data) {
    const float x[] = {float(v)};
    f->graph.evaluate<float>(order, x, scratch);
    v = T(scratch[f->value]);
  }
}

// ---- collectives: the rank's group (reference/collectives.h); without one (tp = 1) each is a
// copy, as NCCL's are over one rank.

template <typename T>
std::vector<double> as_doubles(const Tensor<T>& x) {
  return {x.data.begin(), x.data.end()};
}

template <typename T>
void all_reduce(ReferenceContext<T>& ctx, const ir::Operation& op) {
  Tensor<T>& y = ctx.out(op, 0);
  std::vector<double> v = as_doubles(ctx.in(op, 0));
  if (ctx.group) ctx.group->all_reduce(v, ReduceKind::Sum);
  std::copy(v.begin(), v.end(), y.data.begin());
}

template <typename T>
void all_gather(ReferenceContext<T>& ctx, const ir::Operation& op) {
  Tensor<T>& y = ctx.out(op, 0);
  const std::vector<double> local = as_doubles(ctx.in(op, 0));
  const std::vector<double> v = ctx.group ? ctx.group->all_gather(local) : local;
  OPFUSE_ASSERT(v.size() == y.data.size(), "all_gather '{}': {} values for {}", op.instance,
                v.size(), y.data.size());
  std::copy(v.begin(), v.end(), y.data.begin());
  // FP8 codes (gather_fp8): every rank cast its share with the one scale of the whole tensor.
  ctx.scale_inv[op.results[0]] = ctx.scale_inv[op.operands[0]];
}

template <typename T>
void reduce_scatter(ReferenceContext<T>& ctx, const ir::Operation& op) {
  Tensor<T>& y = ctx.out(op, 0);
  std::vector<double> v = as_doubles(ctx.in(op, 0));
  const size_t rank = ctx.group ? size_t(ctx.group->rank()) : 0;
  if (ctx.group) ctx.group->all_reduce(v, ReduceKind::Sum);
  OPFUSE_ASSERT(v.size() == y.data.size() * (ctx.group ? size_t(ctx.group->size()) : 1),
                "reduce_scatter '{}': {} values for {}", op.instance, v.size(), y.data.size());
  const auto first = v.begin() + std::ptrdiff_t(rank * y.data.size());
  std::copy(first, first + std::ptrdiff_t(y.data.size()), y.data.begin());
}

template <typename T>
struct KernelEntry {
  OpKind kind;
  ReferenceKernel<T> kernel;
};

template <typename T>
constexpr std::array<KernelEntry<T>, ir::kNumOpKinds> kKernels = {{
    {OpKind::LayerNorm, layernorm<T>},
    {OpKind::RMSNorm, rmsnorm<T>},
    {OpKind::Linear, linear<T>},
    {OpKind::Bias, bias<T>},
    {OpKind::AddExtraInput, add<T>},
    {OpKind::MakeExtraOutput, copy<T>},
    {OpKind::Quantize, quantize_op<T>},
    {OpKind::ConstantScale, constant_scale<T>},
    {OpKind::Identity, copy<T>},
    {OpKind::UserNorm, user_norm<T>},
    {OpKind::Reshape, copy<T>},
    {OpKind::AllReduce, all_reduce<T>},
    {OpKind::AllGather, all_gather<T>},
    {OpKind::ReduceScatter, reduce_scatter<T>},
    {OpKind::Dropout, dropout_forward<T>},
    {OpKind::CastFp8, cast_fp8<T>},
    {OpKind::Fp8Transpose, fp8_transpose<T>},
    {OpKind::EmulatedCast, emulated_cast<T>},
    {OpKind::LayerNormBackward, layernorm_backward<T>},
    {OpKind::RMSNormBackward, rmsnorm_backward<T>},
    {OpKind::UserNormBackward, user_norm_backward<T>},
    {OpKind::LinearDgrad, linear_dgrad<T>},
    {OpKind::LinearWgrad, linear_wgrad<T>},
    {OpKind::BiasGrad, bias_grad<T>},
    {OpKind::GradAdd, add<T>},
    {OpKind::TensorStats, tensor_stats<T>},
    {OpKind::TensorCapture, tensor_capture<T>},
    {OpKind::ModifyTensor, modify_tensor<T>},
    {OpKind::DropoutBackward, dropout_backward<T>},
    {OpKind::Fused, nullptr},  // the executor runs its parts
}};

template <typename T>
constexpr bool in_kind_order(const std::array<KernelEntry<T>, ir::kNumOpKinds>& table) {
  for (size_t k = 0; k < table.size(); ++k)
    if (table[k].kind != OpKind(k)) return false;
  return true;
}
static_assert(in_kind_order(kKernels<float>) && in_kind_order(kKernels<double>),
              "kKernels must list every fixed OpKind in enum order");

}  // namespace

template <typename T>
ReferenceKernel<T> reference_kernel(ir::OpKind kind) {
  if (ir::is_pointwise(kind)) return pointwise<T>;
  if (ir::is_pointwise_backward(kind)) return pointwise_backward<T>;
  const auto k = static_cast<size_t>(kind);
  return k < kKernels<T>.size() ? kKernels<T>[k].kernel : nullptr;
}

template ReferenceKernel<float> reference_kernel<float>(ir::OpKind);
template ReferenceKernel<double> reference_kernel<double>(ir::OpKind);

}  // namespace opfuse::cpu
