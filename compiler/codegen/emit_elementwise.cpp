// The elementwise and normalization group emitters: cast, dbias, bias/add, norm forward and
// backward, activation forward and backward, aliases, constant_scale and quantize (the shared
// helpers are in emit_groups.h; note "Kernels by parts" and note "Current scaling" in
// docs/codegen.md).

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "codegen/emit_groups.h"
#include "codegen/kernel_templates.h"
#include "ir/pointwise_ops.h"
#include "support/assert.h"

namespace opfuse::codegen::emitters {

void emit_emulated_cast(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::EmulatedCast});
  const ir::Operation& op = *g.parts.front();
  const bool columnwise = ir::attr_bool(op.attrs, "columnwise");
  if (b.seq().quantizers.at(size_t(op.quantizer)).spec.block_scaled()) {
    return emit_emulated_block_cast(b, g, op, op.operands.at(0), b.buffer(op.results.at(0), op),
                                    columnwise);
  }
  // Note "Quantized boundaries": a quantized input's codes decoded, or a quantized output's
  // codes and block scales written instead of decoded values.
  if (b.value(op.operands.at(0)).quantizer >= 0) return emit_micro_decode(b, g, op, columnwise);
  const bool codes = b.value(op.results.at(0)).quantizer >= 0;
  const int y = b.buffer(op.results.at(0), op);
  emit_micro_cast(b, g, op, op.operands.at(0), codes ? -1 : y, columnwise, columnwise,
                  codes ? y : -1);
}

void emit_cast(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::CastFp8, OpKind::BiasGrad, OpKind::TensorStats});
  const ir::Operation& cast = *g.find({OpKind::CastFp8});
  if (!b.seq().quantizers.at(size_t(cast.quantizer)).spec.per_tensor())
    return emit_block_cast(b, g, cast);
  const ir::Operation* dbias = g.find({OpKind::BiasGrad});
  const ValueId x = cast.operands.at(0);
  if (dbias && dbias->operands.at(0) != x) no_kernel(b, g);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype, out = quantizer_format(b, cast);
  const int64_t cols = width_of(b, cast, xv);
  require_vector_width(b, cast, cols, in, "cast_transpose");
  const SymExpr rows = rows_of(xv);
  const CastOutputs y = cast_outputs(b, cast);
  const bool transpose = y.columnwise >= 0;
  int amax_quantizer = cast.quantizer;
  if (current_scaling(b, cast.quantizer)) {
    emit_current_amax(b, g, cast, x, cast.quantizer);
    amax_quantizer = -1;  // measured already
  }
  const FusedStats stats =
      fused_stats(b, g, x, ir::kNoValue, tile_grid(rows, cols),
                  TileKernelShape{plan::dtype_bytes(in), 1, transpose, dbias != nullptr});
  GridRule grid = stats.grid;
  const SymExpr partial_rows = grid.y;
  const int partial =
      dbias ? b.add_workspace(dbias->instance + ".dbias_partial", DType::FP32, {partial_rows, cols})
            : -1;
  auto what = [&](bool with_copy) {
    return fmt::format("cast {} -> {}{}{}", name_of(in), fp8_output_text(out, with_copy),
                       dbias ? " + dbias partial sums" : "", stats.text());
  };
  std::vector<std::string> args = {spell(in), spell(out), spell(transpose),
                                   spell(dbias != nullptr)};
  stats.append_args(args, out, false);
  WithoutTranspose plain{what(false), grid, rules::kTileThreads, 0};  // tiles launch alike
  b.add_launch(
      g, what(transpose), "cast_transpose", args, std::move(grid), rules::kTileThreads, 0,
      {bind_in("x", b.buffer(x, cast)), bind_out("y", y.rowwise), bind_copy("y_t", y.columnwise),
       bind_quantizer("scale", cast.quantizer, QuantizerValue::Scale),
       bind_quantizer("amax", amax_quantizer, QuantizerValue::Amax),
       bind_out("dbias_partial", partial), bind_int("rows", rows), bind_int("cols", cols),
       bind_out("in_stats", stats.input.partials)},
      std::move(plain));
  emit_fused_stats_merge(b, g, stats);
  if (dbias) {
    const ValueId db = dbias->results.at(0);
    emit_column_reduce(b, g, "dbias = column sums of the partials", {partial},
                       {b.buffer(db, *dbias)}, partial_rows, cols, b.value(db).type.dtype);
  }
}

// The transposed copy of FP8 codes made elsewhere (gather-fp8: gathered from the ranks): no
// scale, no amax; the quantizer's scale_inv serves both copies.
void emit_fp8_transpose(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::Fp8Transpose});
  const ir::Operation& op = *g.parts.front();
  const ValueId x = op.operands.at(0);
  const ir::Value& xv = b.value(x);
  const int64_t cols = width_of(b, op, xv);
  require_vector_width(b, op, cols, xv.type.dtype, "fp8_transpose");
  const SymExpr rows = rows_of(xv);
  const std::string what = fmt::format("transposed copy of {}", name_of(xv.type.dtype));
  // Only backward reads the copy: an inference forward makes none (an empty grid).
  WithoutTranspose none{"no " + what, GridRule{"tile", 0, 0, {{"rows", rows}, {"cols", cols}}},
                        rules::kTileThreads, 0};
  b.add_launch(g, what, "fp8_transpose", {spell(xv.type.dtype), spell(true)}, tile_grid(rows, cols),
               rules::kTileThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_copy("y_t", b.buffer(op.results.at(0), op)),
                bind_int("rows", rows), bind_int("cols", cols)},
               std::move(none));
}

void emit_dbias(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::BiasGrad});
  const ir::Operation& op = *g.parts.front();
  const ValueId dy = op.operands.at(0);
  const ir::Value& dyv = b.value(dy);
  const int64_t cols = width_of(b, op, dyv);
  require_vector_width(b, op, cols, dyv.type.dtype, "dbias_partial");
  const SymExpr rows = rows_of(dyv);
  GridRule grid = tile_grid(rows, cols);
  const SymExpr partial_rows = grid.y;
  const int partial =
      b.add_workspace(op.instance + ".dbias_partial", DType::FP32, {partial_rows, cols});
  b.add_launch(g, fmt::format("dbias partial sums of {}", name_of(dyv.type.dtype)), "dbias_partial",
               {spell(dyv.type.dtype)}, std::move(grid), rules::kTileThreads, 0,
               {bind_in("dy", b.buffer(dy, op)), bind_out("dbias_partial", partial),
                bind_int("rows", rows), bind_int("cols", cols)});
  const ValueId db = op.results.at(0);
  emit_column_reduce(b, g, "dbias = column sums of the partials", {partial}, {b.buffer(db, op)},
                     partial_rows, cols, b.value(db).type.dtype);
}

// bias, add_extra_input and grad_add (y = x + bias + residual), with an optional FP8 cast.
void emit_bias_add(SequenceBuilder& b, const Group& g) {
  require_only(b, g,
               {OpKind::ConstantScale, OpKind::Bias, OpKind::AddExtraInput, OpKind::GradAdd,
                OpKind::CastFp8});
  const ir::Operation& first = *g.parts.front();
  const ValueId x = first.operands.at(0);
  ValueId chain = x, bias = ir::kNoValue, residual = ir::kNoValue;
  const ir::Operation* cast = nullptr;
  double factor = 1;  // a constant_scale first (a declared axpy fusion)
  for (const ir::Operation* p : g.parts) {
    const bool reads_chain =
        std::find(p->operands.begin(), p->operands.end(), chain) != p->operands.end();
    if (!reads_chain) no_kernel(b, g);
    if (p->kind == OpKind::ConstantScale) {
      if (p != &first || b.value(p->results.at(0)).type.dtype != b.value(x).type.dtype)
        no_kernel(b, g);
      factor = ir::attr_float(p->attrs, "scale");
      chain = p->results.at(0);
      continue;
    }
    if (p->kind == OpKind::CastFp8) {
      if (cast) no_kernel(b, g);
      cast = p;
      continue;
    }
    if (cast) no_kernel(b, g);  // the cast ends the chain
    ValueId& slot = p->kind == OpKind::Bias ? bias : residual;
    if (slot != ir::kNoValue) no_kernel(b, g);
    slot = p->kind == OpKind::Bias
               ? p->operands.at(1)
               : (p->operands.at(0) == chain ? p->operands.at(1) : p->operands.at(0));
    chain = p->results.at(0);
  }
  // Nothing to add: a lone cast goes to emit_cast, a lone scale to emit_constant_scale.
  if (bias == ir::kNoValue && residual == ir::kNoValue) no_kernel(b, g);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const int64_t cols = width_of(b, first, xv);
  require_vector_width(b, first, cols, in, "bias_add");
  const SymExpr rows = rows_of(xv);
  // Named members, not a structured binding: clang 14 cannot capture bindings in lambdas.
  const KernelOutputs outputs = kernel_outputs(b, g, cast, chain, *g.parts.back());
  const int quantizer = outputs.quantizer;
  const DType out = outputs.dtype;
  const CastOutputs& y = outputs.copies;
  const bool transpose = y.columnwise >= 0;
  const int measured = cast ? -1 : measure_for_cast(b, g, chain);
  std::string what = factor != 1 ? fmt::format("y = {} * x", factor) : "y = x";
  if (bias != ir::kNoValue) what += " + bias";
  if (residual != ir::kNoValue) what += " + residual";
  auto text = [&](bool with_copy) {
    return fmt::format("{} ({} -> {})", what, name_of(in), fp8_output_text(out, with_copy));
  };
  b.add_launch(g, text(transpose), "bias_add",
               {spell(in), spell(out), spell(bias != ir::kNoValue), spell(residual != ir::kNoValue),
                spell(transpose)},
               tile_grid(rows, cols), rules::kTileThreads, 0,
               {bind_in("x", b.buffer(x, first)),
                bind_in("bias", bias == ir::kNoValue ? -1 : b.buffer(bias, first)),
                bind_in("residual", residual == ir::kNoValue ? -1 : b.buffer(residual, first)),
                bind_out("y", y.rowwise), bind_copy("y_t", y.columnwise),
                bind_quantizer("scale", quantizer, QuantizerValue::Scale),
                bind_amax(quantizer, measured), bind_scale_record(measured),
                bind_float("factor", factor), bind_int("rows", rows), bind_int("cols", cols)},
               WithoutTranspose{text(false), tile_grid(rows, cols), rules::kTileThreads, 0});
}

void emit_norm_fwd(SequenceBuilder& b, const Group& g) {
  const ir::Operation& norm = *g.find({OpKind::LayerNorm, OpKind::RMSNorm});
  if (const ir::Operation* emulated = g.find({OpKind::EmulatedCast}))
    return emit_norm_micro_cast(b, g, norm, *emulated);
  require_only(b, g, {OpKind::LayerNorm, OpKind::RMSNorm, OpKind::CastFp8});
  const ir::Operation* cast = g.find({OpKind::CastFp8});
  if (g.parts.front() != &norm) no_kernel(b, g);
  if (cast &&
      b.seq().quantizers.at(size_t(cast->quantizer)).spec.scaling == plan::ScalingKind::Block1D) {
    return emit_norm_block_cast(b, g, norm, *cast);
  }
  const bool rms = norm.kind == OpKind::RMSNorm;
  const ValueId x = norm.operands.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const int64_t hidden = ir::attr_int(norm.attrs, "size");
  require_vector_width(b, norm, hidden, in, name_of(norm.kind));
  const ValueId y_value = norm.results.at(0);
  const KernelOutputs outputs = kernel_outputs(b, g, cast, y_value, norm);
  const int quantizer = outputs.quantizer;
  const DType out = outputs.dtype;
  const CastOutputs& y = outputs.copies;
  const bool transpose = y.columnwise >= 0;
  const int bytes = ir::dtype_bytes(in);
  if (transpose &&
      rules::norm_fwd_dynamic_smem_bytes(int(hidden), true) > rules::kMaxDynamicSharedBytes) {
    b.fail(norm, fmt::format("'{}' ({}): rows of {} elements are too wide to write the transposed "
                             "FP8 copy from the norm kernel (shared memory)",
                             name_of(norm.kind), norm.instance, hidden));
  }
  // Saved statistics are extra results: layernorm (y, mean, rstd), rmsnorm (y, rstd).
  const size_t rstd_at = rms ? 1 : 2;
  const int mean = !rms && norm.results.size() > 1 ? b.buffer(norm.results[1], norm) : -1;
  const int rstd = norm.results.size() > rstd_at ? b.buffer(norm.results[rstd_at], norm) : -1;
  const SymExpr rows = rows_of(xv);
  struct Shape {
    GridRule grid;
    int block = 0;
    int smem = 0;
  };
  auto shape = [&](bool with_copy) {
    Shape out_shape;
    out_shape.block = rules::norm_fwd_block_threads(int(hidden), bytes, with_copy);
    out_shape.smem = rules::norm_fwd_dynamic_smem_bytes(int(hidden), with_copy);
    if (with_copy) {
      // One block per SM: its staged tile fills shared memory.
      const int tile_rows = rules::norm_transpose_tile_rows(int(hidden));
      out_shape.grid = {"norm_fwd_transpose",
                        min_of(ceil_div(rows, tile_rows), SymExpr::symbol(kNumSmsSymbol)),
                        1,
                        {{"rows", rows}, {"tile_rows", tile_rows}}};
    } else {
      const int rows_per_block = rules::norm_fwd_rows_per_block(int(hidden), bytes, false);
      const int resident =
          rules::min_blocks(out_shape.block, rules::norm_fwd_register_budget(rms, false));
      out_shape.grid = {
          "norm_fwd",
          min_of(ceil_div(rows, rows_per_block), SymExpr::symbol(kNumSmsSymbol) * resident),
          1,
          {{"rows", rows}, {"rows_per_block", rows_per_block}, {"blocks_per_sm", resident}}};
    }
    return out_shape;
  };
  auto what = [&](bool with_copy) {
    return fmt::format("{} {} -> {}", name_of(norm.kind), name_of(in),
                       fp8_output_text(out, with_copy));
  };
  Shape launch = shape(transpose), plain = shape(false);
  const int measured = cast ? -1 : measure_for_cast(b, g, y_value);
  const std::string family = rms ? "rmsnorm_fwd" : "layernorm_fwd";
  const bool zero_centered = ir::attr_bool(norm.attrs, "zero_centered_gamma");
  b.add_launch(
      g, what(transpose), family,
      {spell(in), spell(out), std::to_string(hidden), spell(zero_centered), spell(transpose)},
      std::move(launch.grid), launch.block, launch.smem,
      {bind_in("x", b.buffer(x, norm)), bind_in("gamma", b.buffer(norm.operands.at(1), norm)),
       bind_in("beta", rms ? -1 : b.buffer(norm.operands.at(2), norm)), bind_out("y", y.rowwise),
       bind_copy("y_t", y.columnwise), bind_quantizer("scale", quantizer, QuantizerValue::Scale),
       bind_amax(quantizer, measured), bind_scale_record(measured), bind_out("mean", mean),
       bind_out("rstd", rstd), bind_float("epsilon", ir::attr_float(norm.attrs, "eps")),
       bind_int("rows", rows)},
      WithoutTranspose{what(false), std::move(plain.grid), plain.block, plain.smem});
}

void emit_norm_bwd(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::LayerNormBackward, OpKind::RMSNormBackward, OpKind::GradAdd});
  const ir::Operation& norm = *g.find({OpKind::LayerNormBackward, OpKind::RMSNormBackward});
  const ir::Operation* add = g.find({OpKind::GradAdd});
  const bool rms = norm.kind == OpKind::RMSNormBackward;
  // Operands: (dy, x, gamma, mean, rstd) for LayerNorm, (dy, x, gamma, rstd) for RMSNorm.
  const ValueId dy = norm.operands.at(0), x = norm.operands.at(1), gamma = norm.operands.at(2);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const int64_t hidden = ir::attr_int(norm.attrs, "size");
  require_vector_width(b, norm, hidden, in, name_of(norm.kind));
  ValueId dx = norm.results.at(0), dresidual = ir::kNoValue;
  if (add) {
    if (add->operands.size() != 2 || (add->operands[0] != dx && add->operands[1] != dx))
      no_kernel(b, g);
    dresidual = add->operands[0] == dx ? add->operands[1] : add->operands[0];
    dx = add->results.at(0);
  }
  const int bytes = ir::dtype_bytes(in);
  const int block = rules::norm_bwd_block_threads(int(hidden), bytes);
  const int rows_per_block = rules::norm_bwd_rows_per_block(int(hidden), bytes);
  const int resident = rules::min_blocks(block, rules::kNormBwdRegisterBudget);
  const SymExpr grid_x = SymExpr::symbol(kNumSmsSymbol) * resident;
  const SymExpr partial_rows = grid_x * rows_per_block;
  const int dgamma_partial =
      b.add_workspace(norm.instance + ".dgamma_partial", DType::FP32, {partial_rows, hidden});
  const int dbeta_partial =
      rms ? -1
          : b.add_workspace(norm.instance + ".dbeta_partial", DType::FP32, {partial_rows, hidden});
  const SymExpr rows = rows_of(xv);
  GridRule grid{"norm_bwd",
                grid_x,
                1,
                {{"rows", rows}, {"rows_per_block", rows_per_block}, {"blocks_per_sm", resident}}};
  const bool zero_centered = ir::attr_bool(norm.attrs, "zero_centered_gamma");
  b.add_launch(
      g,
      fmt::format("{} {}{} + dgamma{} partial sums", name_of(norm.kind), name_of(in),
                  add ? " + residual gradient" : "", rms ? "" : "/dbeta"),
      rms ? "rmsnorm_bwd" : "layernorm_bwd",
      {spell(in), std::to_string(hidden), spell(zero_centered)}, std::move(grid), block, 0,
      {bind_in("dy", b.buffer(dy, norm)), bind_in("x", b.buffer(x, norm)),
       bind_in("gamma", b.buffer(gamma, norm)),
       bind_in("mean", rms ? -1 : b.buffer(norm.operands.at(3), norm)),
       bind_in("rstd", b.buffer(norm.operands.at(rms ? 3 : 4), norm)),
       bind_in("dresidual", dresidual == ir::kNoValue ? -1 : b.buffer(dresidual, *add)),
       bind_out("dx", b.buffer(dx, add ? *add : norm)), bind_out("dgamma_partial", dgamma_partial),
       bind_out("dbeta_partial", dbeta_partial), bind_int("rows", rows)});
  std::vector<int> outputs = {b.buffer(norm.results.at(1), norm)};
  std::vector<int> partials = {dgamma_partial};
  if (!rms) {
    outputs.push_back(b.buffer(norm.results.at(2), norm));
    partials.push_back(dbeta_partial);
  }
  emit_column_reduce(
      b, g,
      rms ? "dgamma = column sums of the partials" : "dgamma, dbeta = column sums of the partials",
      std::move(partials), std::move(outputs), partial_rows, hidden, b.value(gamma).type.dtype);
}

// A user-defined op's learned parameters (templates/activation.cuh, the `learned` array, as long
// as ir::kMaxUserParams): the operands from `first`, one pointer each, nullptr past them.
ParamBinding bind_learned(SequenceBuilder& b, const ir::Operation& act, size_t first) {
  std::vector<int> buffers(ir::kMaxUserParams, -1);
  for (size_t k = 0; first + k < act.operands.size() && k < buffers.size(); ++k)
    buffers[k] = b.buffer(act.operands[first + k], act);
  return bind_buffers("learned", std::move(buffers), false);
}

void emit_activation_fwd(SequenceBuilder& b, const Group& g) {
  const ir::Operation& act = *find_part(g, ir::is_pointwise);
  if (const ir::Operation* emulated = g.find({OpKind::EmulatedCast}))
    return emit_activation_micro_cast(b, g, act, *emulated);
  require_only(b, g, ir::is_pointwise, {OpKind::CastFp8, OpKind::TensorStats});
  const ir::Operation* cast = g.find({OpKind::CastFp8});
  if (g.parts.front() != &act) no_kernel(b, g);
  if (cast && !b.seq().quantizers.at(size_t(cast->quantizer)).spec.per_tensor()) {
    if (g.find({OpKind::TensorStats})) no_kernel(b, g);  // no statistics in a block kernel
    return emit_block_activation(b, g, act, *cast, nullptr);
  }
  const ir::PointwiseDef& def = *ir::pointwise_def(act.kind);
  const bool gated = def.gated;
  const ValueId x = act.operands.at(0), y_value = act.results.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const int64_t cols = width_of(b, act, b.value(y_value));  // the output width n
  require_vector_width(b, act, cols, in, name_of(act.kind));
  const KernelOutputs outputs = kernel_outputs(b, g, cast, y_value, act);
  const int quantizer = outputs.quantizer;
  const DType out = outputs.dtype;
  const CastOutputs& y = outputs.copies;
  const bool transpose = y.columnwise >= 0;
  const SymExpr rows = rows_of(xv);
  const int measured = cast ? -1 : measure_for_cast(b, g, y_value);
  const FusedStats stats =
      fused_stats(b, g, x, y_value, tile_grid(rows, cols),
                  TileKernelShape{plan::dtype_bytes(in), gated ? 2 : 1, transpose, false});
  auto what = [&](bool with_copy) {
    return fmt::format("{} {} -> {}{}", ir::written_op_name(act.kind, act.attrs), name_of(in),
                       fp8_output_text(out, with_copy), stats.text());
  };
  std::vector<std::string> args = {ir::pointwise_functor_name(def, act.attrs), spell(in),
                                   spell(out), spell(transpose)};
  stats.append_args(args, b.value(y_value).type.dtype, true);
  b.add_launch(
      g, what(transpose), gated ? "gated_activation_fwd" : "activation_fwd", args, stats.grid,
      rules::kTileThreads, 0,
      {bind_in("x", b.buffer(x, act)), bind_out("y", y.rowwise), bind_copy("y_t", y.columnwise),
       bind_quantizer("scale", quantizer, QuantizerValue::Scale), bind_amax(quantizer, measured),
       bind_scale_record(measured), bind_int("rows", rows), bind_int("cols", cols),
       bind_out("in_stats", stats.input.partials), bind_out("out_stats", stats.output.partials),
       bind_learned(b, act, 1)},
      WithoutTranspose{what(false), stats.grid, rules::kTileThreads, 0});
  emit_fused_stats_merge(b, g, stats);
}

void emit_activation_bwd(SequenceBuilder& b, const Group& g) {
  const ir::Operation& act = *find_part(g, ir::is_pointwise_backward);
  if (const ir::Operation* emulated = g.find({OpKind::EmulatedCast}))
    return emit_dact_micro_cast(b, g, act, *emulated);
  require_only(b, g, ir::is_pointwise_backward,
               {OpKind::BiasGrad, OpKind::CastFp8, OpKind::TensorStats});
  const ir::Operation* dbias = g.find({OpKind::BiasGrad});
  const ir::Operation* cast = g.find({OpKind::CastFp8});
  if (g.parts.front() != &act) no_kernel(b, g);
  if (cast && !b.seq().quantizers.at(size_t(cast->quantizer)).spec.per_tensor()) {
    if (g.find({OpKind::TensorStats})) no_kernel(b, g);  // no statistics in a block kernel
    return emit_block_activation(b, g, act, *cast, dbias);
  }
  const ir::PointwiseDef& forward = *ir::pointwise_def(act.kind);
  const bool gated = forward.gated;
  const ValueId dy = act.operands.at(0), x = act.operands.at(1), dx_value = act.results.at(0);
  const ir::Value& dyv = b.value(dy);
  const DType in = dyv.type.dtype;
  const int64_t cols = width_of(b, act, dyv);  // n, dy's width
  const int64_t dx_cols = gated ? 2 * cols : cols;
  require_vector_width(b, act, cols, in, name_of(act.kind));
  if (dbias && dbias->operands.at(0) != dx_value) no_kernel(b, g);
  // With a cast, the dbias sum reads dx inside the kernel, so only the cast's copies leave it.
  const KernelOutputs outputs = kernel_outputs(b, g, cast, dx_value, act);
  const int quantizer = outputs.quantizer;
  const DType out = outputs.dtype;
  const CastOutputs& dx = outputs.copies;
  const bool transpose = dx.columnwise >= 0;
  const SymExpr rows = rows_of(dyv);
  // A user-defined op's learned parameters (operands after dy and x) and their gradients (the
  // results after dx): column sums per row block, like dbias's, so the same grid (no flat
  // schedule: a thread's columns stay fixed).
  const std::vector<ir::UserParam> learned = ir::user_params(forward, act.attrs);
  const FusedStats stats = fused_stats(
      b, g, dy, dx_value, tile_grid(rows, cols),
      TileKernelShape{plan::dtype_bytes(in), gated ? 3 : 2, transpose, dbias || !learned.empty()});
  GridRule grid = stats.grid;
  const SymExpr partial_rows = grid.y;
  const int partial = dbias ? b.add_workspace(dbias->instance + ".dbias_partial", DType::FP32,
                                              {partial_rows, dx_cols})
                            : -1;
  std::vector<int> learned_partials(ir::kMaxUserParams, -1);
  for (size_t k = 0; k < learned.size(); ++k)
    learned_partials[k] =
        b.add_workspace(fmt::format("{}.{}.grad_partial", act.instance, learned[k].name),
                        DType::FP32, {partial_rows, cols});
  const int measured = cast ? -1 : measure_for_cast(b, g, dx_value);
  std::vector<std::string> args = {ir::pointwise_functor_name(forward, act.attrs), spell(in),
                                   spell(out), spell(transpose), spell(dbias != nullptr)};
  stats.append_args(args, b.value(dx_value).type.dtype, true);
  b.add_launch(
      g,
      fmt::format("{} backward {} -> {}{}{}", ir::pointwise_op_name(forward, act.attrs),
                  name_of(in), fp8_output_text(out, transpose),
                  dbias ? " + dbias partial sums" : "", stats.text()),
      gated ? "gated_activation_bwd" : "activation_bwd", args, std::move(grid), rules::kTileThreads,
      0,
      {bind_in("dy", b.buffer(dy, act)), bind_in("x", b.buffer(x, act)), bind_out("dx", dx.rowwise),
       bind_copy("dx_t", dx.columnwise), bind_quantizer("scale", quantizer, QuantizerValue::Scale),
       bind_amax(quantizer, measured), bind_scale_record(measured),
       bind_out("dbias_partial", partial), bind_int("rows", rows), bind_int("cols", cols),
       bind_out("in_stats", stats.input.partials), bind_out("out_stats", stats.output.partials),
       bind_learned(b, act, 2), bind_buffers("learned_partial", learned_partials, true)});
  emit_fused_stats_merge(b, g, stats);
  emit_learned_gradients(b, g, act, learned, learned_partials, partial_rows, cols);
  if (dbias) {
    const ValueId db = dbias->results.at(0);
    emit_column_reduce(b, g, "dbias = column sums of the partials", {partial},
                       {b.buffer(db, *dbias)}, partial_rows, dx_cols, b.value(db).type.dtype);
  }
}

void emit_learned_gradients(SequenceBuilder& b, const Group& g, const ir::Operation& act,
                            std::span<const ir::UserParam> learned,
                            const std::vector<int>& learned_partials, const SymExpr& partial_rows,
                            int64_t cols) {
  for (size_t k = 0; k < learned.size(); ++k) {
    const ValueId grad = act.results.at(1 + k);
    const DType grad_dtype = b.value(grad).type.dtype;
    if (learned[k].size > 0) {
      emit_column_reduce(b, g, fmt::format("d{} = column sums of the partials", learned[k].name),
                         {learned_partials[k]}, {b.buffer(grad, act)}, partial_rows, cols,
                         grad_dtype);
      continue;
    }
    // A scalar: its column sums, then their sum (one block, a fixed order).
    const int columns = b.add_workspace(
        fmt::format("{}.{}.grad_columns", act.instance, learned[k].name), DType::FP32, {cols});
    emit_column_reduce(b, g,
                       fmt::format("d{} per column = column sums of the partials", learned[k].name),
                       {learned_partials[k]}, {columns}, partial_rows, cols, DType::FP32);
    b.add_launch(g, fmt::format("d{} = sum of its column sums", learned[k].name),
                 "learned_scalar_sum", {spell(grad_dtype)},
                 GridRule{"learned_scalar_sum", 1, 1, {{"cols", cols}}}, rules::kTileThreads, 0,
                 {bind_in("values", columns), bind_out("out", b.buffer(grad, act)),
                  bind_int("count", cols)});
  }
}

void emit_alias(SequenceBuilder& b, const Group& g) {
  // make_extra_output, identity and reshape view their operand's memory: no step.
  for (const ir::Operation* p : g.parts) b.make_alias(p->results.at(0), p->operands.at(0));
}

// constant_scale, forward and backward alike (its backward is a constant_scale of dy).
void emit_constant_scale(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::ConstantScale});
  const ir::Operation& op = *g.parts.front();
  const ValueId x = op.operands.at(0), y = op.results.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype, out = b.value(y).type.dtype;
  const int64_t cols = width_of(b, op, xv);
  require_vector_width(b, op, cols, in, "constant_scale");
  const SymExpr rows = rows_of(xv);
  const double factor = ir::attr_float(op.attrs, "scale");
  const bool backward = op.phase == ir::Phase::Backward;
  b.add_launch(g,
               fmt::format("{} = {} * {} ({} -> {})", backward ? "dx" : "y", factor,
                           backward ? "dy" : "x", name_of(in), name_of(out)),
               "constant_scale", {spell(in), spell(out), spell(false)}, tile_grid(rows, cols),
               rules::kTileThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_out("y", b.buffer(y, op)), bind_copy("y_t", -1),
                bind_null("scale"), bind_null("amax"), bind_float("factor", factor),
                bind_int("rows", rows), bind_int("cols", cols)});
}

// The user quantize op: fake quantization with the quantizer plan-quantization gave it (forward:
// the output quantizer; backward = true: the grad_input one). Without a quantizer (bf16 recipes,
// forward = false) it is the identity, an alias like make_extra_output.
void emit_quantize(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::Quantize});
  const ir::Operation& op = *g.parts.front();
  if (op.quantizer < 0) {
    b.make_alias(op.results.at(0), op.operands.at(0));
    return;
  }
  emit_fake_quantize(b, g, op);
}

void emit_fake_quantize(SequenceBuilder& b, const Group& g, const ir::Operation& op) {
  const ValueId x = op.operands.at(0), y = op.results.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(op.quantizer)).spec;
  const DType format = spec.format;
  if (spec.micro_scaled()) return emit_micro_cast(b, g, op, x, b.buffer(y, op), false, false);
  const int64_t cols = width_of(b, op, xv);
  if (spec.scaling == plan::ScalingKind::Block1D) {
    // One warp per 1 x 128 block: its amax, scale, cast and decode in registers.
    require_vector_width(b, op, cols, in, "block_fake_quantize");
    const SymExpr rows = rows_of(xv);
    const SymExpr blocks = rows * rules::block_row_count(int(cols));
    b.add_launch(g,
                 fmt::format("fake-quantize {} through {} with 1x128 block scales "
                             "(y = dequantize(quantize(x)))",
                             name_of(in), name_of(format)),
                 "block_fake_quantize", {spell(in), spell(format)},
                 GridRule{"block_rows",
                          ceil_div(blocks, rules::kBlockFakeQuantizeWarps),
                          1,
                          {{"rows", rows}, {"cols", cols}}},
                 rules::kBlockFakeQuantizeWarps * 32, 0,
                 {bind_in("x", b.buffer(x, op)), bind_out("y", b.buffer(y, op)),
                  bind_float("epsilon", spec.epsilon),
                  bind_int("power_of_2_scale", spec.power_of_2_scale ? 1 : 0),
                  bind_int("rows", rows), bind_int("cols", cols)});
    return;
  }
  if (!spec.per_tensor()) {
    b.fail(op, fmt::format("codegen: no kernel fake-quantizes with {} scales",
                           plan::quant_spec_string(spec)));
  }
  require_vector_width(b, op, cols, in, "fake_quantize");
  const SymExpr rows = rows_of(xv);
  int amax_quantizer = op.quantizer;
  if (current_scaling(b, op.quantizer)) {
    emit_current_amax(b, g, op, x, op.quantizer);
    amax_quantizer = -1;  // measured already
  }
  b.add_launch(g,
               fmt::format("fake-quantize {} through {} (y = dequantize(quantize(x)))", name_of(in),
                           name_of(format)),
               "fake_quantize", {spell(in), spell(format)}, tile_grid(rows, cols),
               rules::kTileThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_out("y", b.buffer(y, op)),
                bind_quantizer("scale", op.quantizer, QuantizerValue::Scale),
                bind_quantizer("scale_inv", op.quantizer, QuantizerValue::ScaleInv),
                bind_quantizer("amax", amax_quantizer, QuantizerValue::Amax),
                bind_int("rows", rows), bind_int("cols", cols)});
}

}  // namespace opfuse::codegen::emitters
