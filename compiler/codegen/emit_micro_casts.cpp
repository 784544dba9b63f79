// MXFP8 / NVFP4 copies on Hopper (note "Emulated micro-scaling" in docs/architecture.md): a
// linear operand's copy quantized and decoded in one pass, a quantized output's copy stored as
// codes and block scales, and a quantized input's copy decoded for the GEMMs (note "Quantized
// boundaries").

#include <fmt/format.h>

#include <optional>

#include "codegen/emit_groups.h"
#include "codegen/kernel_templates.h"
#include "ir/pointwise_ops.h"
#include "support/assert.h"

namespace opfuse::codegen::emitters {

int micro_format(DType format) {
  return rules::micro_scale_format(format == DType::E2M1, format == DType::E5M2);
}

namespace {

// A copy whose blocks run along the rows needs the row width to be a multiple of the block (a
// CodegenError at `op` otherwise; blocks down the columns are checked at bind: rows_multiple).
void require_block_width(const SequenceBuilder& b, const ir::Operation& op,
                         const plan::QuantSpec& spec, int64_t cols, int block) {
  if (cols % block == 0) return;
  b.fail(op,
         fmt::format("'{}': the row width {} is not a multiple of {}, which the blocks of {} need",
                     op.instance, cols, block, plan::quant_spec_string(spec)),
         fmt::format("pad the width to a multiple of {}", block));
}

// NVFP4's per-tensor scale of a Hadamard-transformed copy: the amax of the transformed values,
// measured by a kernel of its own whose last block derives S_enc (no producer can measure it).
// `copy`: the copy's buffer when only backward reads it (else -1): an inference forward, which
// does not make the copy, does not measure for it either (an empty grid).
void emit_rht_amax(SequenceBuilder& b, const Group& g, const ir::Operation& op, ValueId x,
                   const SymExpr& rows, int64_t cols, int copy) {
  if (b.measured_amax(x) == op.quantizer) return;
  const DType in = b.value(x).type.dtype;
  const std::string what = fmt::format(
      "amax of the Hadamard-transformed columns of {} and the tensor scale of quantizer {} "
      "(NVFP4)",
      name_of(in), op.instance);
  const std::vector<std::pair<std::string, SymExpr>> dims = {
      {"rows", rows}, {"cols", cols}, {"rows_multiple", 16}};
  std::optional<WithoutTranspose> none;
  if (copy >= 0) {
    none = WithoutTranspose{"no " + what,
                            GridRule{"micro_scale_rht_amax", 0, 0, dims},
                            rules::kMicroScaleThreads,
                            0,
                            {copy}};
  }
  b.add_launch(g, what, "micro_scale_rht_amax", {spell(in)},
               GridRule{"micro_scale_rht_amax", rules::micro_scale_rht_amax_grid_x(cols),
                        min_of(ceil_div(ceil_div(rows, 16), rules::kMicroScaleWarps),
                               rules::kMicroScaleMaxGridY),
                        dims},
               rules::kMicroScaleThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_null("codes"), bind_null("scales"),
                bind_null("y"), bind_null("tensor_scale"), bind_null("step"),
                bind_quantizer("amax", op.quantizer, QuantizerValue::RunningAmax),
                bind_scale_record(op.quantizer), bind_int64("seed", 0), bind_int("stream", 0),
                bind_int("rows", rows), bind_int("cols", cols)},
               std::move(none));
  b.mark_amax_measured(x, op.quantizer);
}

}  // namespace

// Note "Emulated micro-scaling" (docs/architecture.md): one MXFP8 / NVFP4 copy of x quantized
// and decoded to y (x's dtype and layout) in one pass, or (`codes` >= 0, y -1) stored as codes
// with the block scales of their buffer's scale grid (a quantized output's; note "Quantized
// boundaries"); NVFP4 first measures its tensor scale (the producer, an amax_reduce, or the
// Hadamard amax kernel). `columnwise_copy`: the copy is one only backward reads (or the
// consumer's backward), which an inference forward neither makes nor allocates.
void emit_micro_cast(SequenceBuilder& b, const Group& g, const ir::Operation& op, ValueId x, int y,
                     bool columnwise, bool columnwise_copy, int codes) {
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(op.quantizer)).spec;
  OPFUSE_ASSERT(spec.micro_scaled(), "'{}' is not micro-scaled", op.instance);
  const int64_t cols = width_of(b, op, xv);
  require_vector_width(b, op, cols, in, "micro_scale_cast");
  const SymExpr rows = rows_of(xv);
  const int format = micro_format(spec.format);
  const int block = rules::micro_scale_block_size(format);
  const bool two_d = spec.block.rows > 1;
  const bool rht = spec.rht && columnwise;
  if (!columnwise || two_d) require_block_width(b, op, spec, cols, block);
  if (spec.nvfp4()) {
    if (rht) {
      emit_rht_amax(b, g, op, x, rows, cols, columnwise_copy ? (codes >= 0 ? codes : y) : -1);
    } else {
      emit_current_amax(b, g, op, x, op.quantizer);
      // The quantizer's other copy of x reuses this measurement (the CPU reference counts one
      // measurement for both copies: stochastic rounding's step).
      b.mark_amax_measured(x, op.quantizer);
    }
  }
  const bool patches = rules::micro_scale_uses_patches(columnwise, two_d);
  const SymExpr grid_x =
      patches ? SymExpr(rules::micro_scale_grid_x(0, cols, format, columnwise, two_d))
              : min_of(ceil_div(rows * (cols / block), rules::kMicroScaleThreads),
                       rules::kMicroScaleMaxGridX);
  const SymExpr grid_y = patches ? min_of(ceil_div(ceil_div(rows, block), rules::kMicroScaleWarps),
                                          rules::kMicroScaleMaxGridY)
                                 : SymExpr(1);
  std::vector<std::pair<std::string, SymExpr>> dims = {{"rows", rows}, {"cols", cols}};
  if (columnwise || two_d) dims.emplace_back("rows_multiple", block);  // checked at bind
  const std::string what = fmt::format(
      "{} {} copy of {} ({} blocks of {}{}{}{}), {}{}", spec.nvfp4() ? "NVFP4" : "MXFP8",
      columnwise ? "column-wise" : "row-wise", name_of(in),
      two_d        ? "16x16"
      : columnwise ? fmt::format("{}x1", block)
                   : fmt::format("1x{}", block),
      name_of(spec.format), rht ? ", Hadamard-transformed" : "",
      spec.stochastic_rounding ? ", stochastic rounding" : "", spec.nvfp4() ? ", tensor scale" : "",
      codes >= 0 ? "stored as codes and block scales" : "decoded to ",
      codes >= 0 ? std::string_view() : name_of(in));
  std::optional<WithoutTranspose> none;
  if (columnwise_copy) {
    none = WithoutTranspose{"no " + what, GridRule{"micro_scale", 0, 0, dims},
                            rules::kMicroScaleThreads, 0};
  }
  // The codes and their block scales (a quantized output's; note "Quantized boundaries"), or the
  // decoded values; a column-wise copy only backward (or the consumer's backward) reads.
  const int scales = codes >= 0 ? b.plan_buffer(codes).scale_inv.buffer : -1;
  auto written = [&](const char* field, int buffer) {
    if (buffer < 0) return bind_null(field);
    return columnwise_copy ? bind_copy(field, buffer) : bind_out(field, buffer);
  };
  b.add_launch(
      g, what, "micro_scale_cast",
      {spell(in), spell(in), std::to_string(format), spell(columnwise), spell(two_d), spell(rht),
       spell(spec.stochastic_rounding), spell(codes >= 0)},
      GridRule{"micro_scale", grid_x, grid_y, std::move(dims)}, rules::kMicroScaleThreads, 0,
      {bind_in("x", b.buffer(x, op)), written("codes", codes), written("scales", scales),
       written("y", y),
       spec.nvfp4() ? bind_quantizer("tensor_scale", op.quantizer, QuantizerValue::Scale)
                    : bind_null("tensor_scale"),
       spec.stochastic_rounding ? bind_quantizer("step", op.quantizer, QuantizerValue::Measurements)
                                : bind_null("step"),
       bind_null("amax"), bind_null("scale_record"), bind_int64("seed", int64_t(spec.seed)),
       bind_int("stream", 2 * op.quantizer + (columnwise ? 1 : 0)), bind_int("rows", rows),
       bind_int("cols", cols)},
      std::move(none));
}

// Note "Quantized boundaries" (docs/architecture.md): an MXFP8 / NVFP4 quantized input's copy
// (codes, the caller's block scales and, NVFP4, S_enc) decoded in x's orientation for Hopper's
// GEMMs, as the emulated casts decode theirs. The column-wise copy is one only backward reads.
void emit_micro_decode(SequenceBuilder& b, const Group& g, const ir::Operation& op,
                       bool columnwise) {
  const ValueId codes = op.operands.at(0);
  const ir::Value& yv = b.value(op.results.at(0));
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(op.quantizer)).spec;
  const int code_buffer = b.buffer(codes, op);
  const int scales = b.plan_buffer(code_buffer).scale_inv.buffer;
  const int tensor_scale = b.tensor_scale_buffer(codes);
  OPFUSE_ASSERT(scales >= 0 && (!spec.nvfp4() || tensor_scale >= 0),
                "quantized input copy {} has no scales", b.plan_buffer(code_buffer).name);
  const int64_t cols = width_of(b, op, yv);
  const SymExpr rows = rows_of(yv);
  const int format = micro_format(spec.format);
  const int block = rules::micro_scale_block_size(format);
  if (!columnwise) require_block_width(b, op, spec, cols, block);
  std::vector<std::pair<std::string, SymExpr>> dims = {{"rows", rows}, {"cols", cols}};
  if (columnwise) dims.emplace_back("rows_multiple", block);  // checked at bind
  const int y = b.buffer(op.results.at(0), op);
  const std::string what =
      fmt::format("decode the {} {} copy of quantized input {} to {}",
                  spec.nvfp4() ? "NVFP4" : "MXFP8", columnwise ? "column-wise" : "row-wise",
                  b.plan_buffer(code_buffer).name, name_of(yv.type.dtype));
  std::optional<WithoutTranspose> none;
  if (columnwise) {
    none = WithoutTranspose{"no " + what, GridRule{"micro_dequantize", 0, 0, dims},
                            rules::kDequantizeThreads, 0};
  }
  b.add_launch(
      g, what, "micro_dequantize",
      {spell(yv.type.dtype), std::to_string(format), spell(columnwise)},
      GridRule{"micro_dequantize",
               max_of(1, min_of(ceil_div(rows * cols, rules::kDequantizeThreads),
                                rules::kDequantizeMaxGrid)),
               1, std::move(dims)},
      rules::kDequantizeThreads, 0,
      {bind_in("codes", code_buffer), bind_in("scales", scales),
       tensor_scale >= 0 ? bind_in("tensor_scale", tensor_scale) : bind_null("tensor_scale"),
       columnwise ? bind_copy("y", y) : bind_out("y", y), bind_int("rows", rows),
       bind_int("cols", cols)},
      std::move(none));
}

bool decoded_mxfp8_rows(const SequenceBuilder& b, const ir::Operation& cast, ValueId source,
                        DType dtype, int64_t width) {
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(cast.quantizer)).spec;
  return cast.operands.at(0) == source && spec.micro_scaled() && !spec.nvfp4() &&
         !ir::attr_bool(cast.attrs, "columnwise") && b.value(cast.results.at(0)).quantizer < 0 &&
         b.value(source).type.dtype == dtype && b.value(cast.results.at(0)).type.dtype == dtype &&
         width % rules::micro_scale_block_size(micro_format(spec.format)) == 0;
}

// Pattern activation_micro_cast (templates/activation.cuh, activation_micro_fwd): the activation
// kernel quantizes its output, as rounded to its dtype, in 1 x 32 MXFP8 blocks and writes the
// decoded copy, the values micro_scale_cast writes from the unfused activation's output. Where
// another op reads the output (the column-wise copy's cast, in training) the kernel writes it too;
// an inference forward runs the variant without it.
void emit_activation_micro_cast(SequenceBuilder& b, const Group& g, const ir::Operation& act,
                                const ir::Operation& cast) {
  require_only(b, g, ir::is_pointwise, {OpKind::EmulatedCast});
  const ir::PointwiseDef& def = *ir::pointwise_def(act.kind);
  const ValueId x = act.operands.at(0), out = act.results.at(0);
  const DType in = b.value(x).type.dtype;
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(cast.quantizer)).spec;
  const int64_t cols = width_of(b, act, b.value(out));  // the output width n
  const int format = micro_format(spec.format);
  if (g.parts.front() != &act || !decoded_mxfp8_rows(b, cast, out, in, cols))
    no_kernel(b, g);  // the pattern's conditions (compiler/passes/fusion/activation_cast.cpp)
  require_vector_width(b, act, cols, in, name_of(act.kind));
  const int y = b.buffer(cast.results.at(0), cast);
  const int source = b.existing_buffer(out);  // -1: only the fused copy reads the output
  const SymExpr rows = rows_of(b.value(x));
  auto what = [&](bool with_source) {
    return fmt::format("{} {} -> MXFP8 {} row-wise copy (1x32 blocks), decoded to {}{}",
                       ir::written_op_name(act.kind, act.attrs), name_of(in), name_of(spec.format),
                       name_of(in), with_source ? " + the output" : "");
  };
  std::optional<WithoutTranspose> plain;
  if (source >= 0)
    plain = WithoutTranspose{what(false), tile_grid(rows, cols), rules::kTileThreads, 0};
  b.add_launch(g, what(source >= 0),
               def.gated ? "gated_activation_micro_fwd" : "activation_micro_fwd",
               {ir::pointwise_functor_name(def, act.attrs), spell(in), std::to_string(format),
                spell(source >= 0)},
               tile_grid(rows, cols), rules::kTileThreads, 0,
               {bind_in("x", b.buffer(x, act)), bind_out("y", y), bind_copy("y_hp", source),
                bind_int("rows", rows), bind_int("cols", cols), bind_learned(b, act, 1)},
               std::move(plain));
}

// Pattern dact_micro_cast (templates/activation.cuh, activation_micro_bwd): the activation's
// backward writes its gradient's decoded 1 x 32 row-wise MXFP8 copy (both planes of a gated one),
// and the gradient where another op reads it (the column-wise copy's cast, a bias gradient).
void emit_dact_micro_cast(SequenceBuilder& b, const Group& g, const ir::Operation& act,
                          const ir::Operation& cast) {
  require_only(b, g, ir::is_pointwise_backward, {OpKind::EmulatedCast});
  const ir::PointwiseDef& forward = *ir::pointwise_def(act.kind);
  const ValueId dy = act.operands.at(0), x = act.operands.at(1), dx = act.results.at(0);
  const DType in = b.value(dy).type.dtype;
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(cast.quantizer)).spec;
  const int64_t cols = width_of(b, act, b.value(dy));  // n, dy's width (a plane of dx)
  const int format = micro_format(spec.format);
  if (g.parts.front() != &act || !decoded_mxfp8_rows(b, cast, dx, in, cols) ||
      b.value(x).type.dtype != in || !ir::user_params(forward, act.attrs).empty()) {
    no_kernel(b, g);  // the pattern's conditions (compiler/passes/fusion/dact_cast.cpp)
  }
  require_vector_width(b, act, cols, in, name_of(act.kind));
  const int y = b.buffer(cast.results.at(0), cast);
  const int source = b.existing_buffer(dx);  // -1: only the fused copy reads the gradient
  const SymExpr rows = rows_of(b.value(dy));
  b.add_launch(
      g,
      fmt::format("{} backward {} -> MXFP8 {} row-wise copy (1x32 blocks), decoded to {}{}",
                  ir::pointwise_op_name(forward, act.attrs), name_of(in), name_of(spec.format),
                  name_of(in), source >= 0 ? " + the gradient" : ""),
      forward.gated ? "gated_activation_micro_bwd" : "activation_micro_bwd",
      {ir::pointwise_functor_name(forward, act.attrs), spell(in), std::to_string(format),
       spell(source >= 0)},
      tile_grid(rows, cols), rules::kTileThreads, 0,
      {bind_in("dy", b.buffer(dy, act)), bind_in("x", b.buffer(x, act)), bind_out("dx", y),
       bind_out("dx_hp", source), bind_int("rows", rows), bind_int("cols", cols),
       bind_learned(b, act, 2)});
}

}  // namespace opfuse::codegen::emitters
