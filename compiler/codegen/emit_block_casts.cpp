// The float8_block_scaling cast emitters: the 1x128 / 128x128 block cast of a tensor, and the
// activation whose output's block cast folds into it (patterns activation_block_cast,
// dact_block_cast). Split from emit_elementwise.cpp, which calls them.

#include <fmt/format.h>

#include <optional>

#include "codegen/emit_groups.h"
#include "codegen/kernel_templates.h"
#include "ir/pointwise_ops.h"

namespace opfuse::codegen::emitters {

namespace {

// block_cast.cuh's grid, shared by block_activation.cuh: a 128 x 128 tile per block, row tiles
// strided beyond kBlockCastMaxGridY.
GridRule block_cast_grid(const SymExpr& rows, int64_t cols) {
  return {"block_cast",
          rules::block_cast_grid_x(int(cols)),
          rows.value() ? SymExpr(rules::block_cast_grid_y(*rows.value()))
                       : min_of(ceil_div(rows, rules::kBlockCastTile), rules::kBlockCastMaxGridY),
          {{"rows", rows}, {"cols", cols}}};
}

// The saved statistics of a norm forward (mean for LayerNorm, rstd): their buffers, -1 where
// nothing keeps them.
struct NormSaved {
  int mean = -1;
  int rstd = -1;
};
NormSaved norm_saved(SequenceBuilder& b, const ir::Operation& norm) {
  const bool rms = norm.kind == OpKind::RMSNorm;
  const size_t rstd_at = rms ? 1 : 2;
  return {!rms && norm.results.size() > 1 ? b.buffer(norm.results[1], norm) : -1,
          norm.results.size() > rstd_at ? b.buffer(norm.results[rstd_at], norm) : -1};
}

// The launch of a norm forward without the transposed copy (norm_fwd's plain geometry, which the
// block-scaled and MXFP8 variants share): one wave of resident blocks at most.
struct NormFwdLaunch {
  GridRule grid;
  int block = 0;
};
NormFwdLaunch plain_norm_fwd_launch(bool rms, int64_t hidden, DType in, const SymExpr& rows) {
  const int bytes = ir::dtype_bytes(in);
  const int block = rules::norm_fwd_block_threads(int(hidden), bytes, false);
  const int rows_per_block = rules::norm_fwd_rows_per_block(int(hidden), bytes, false);
  const int resident = rules::min_blocks(block, rules::norm_fwd_register_budget(rms, false));
  return {
      GridRule{"norm_fwd",
               min_of(ceil_div(rows, rows_per_block), SymExpr::symbol(kNumSmsSymbol) * resident),
               1,
               {{"rows", rows}, {"rows_per_block", rows_per_block}, {"blocks_per_sm", resident}}},
      block};
}

}  // namespace

// A block-scaled cast (note "Block scale grids" in runtime/cpu/block_quantization.h): one kernel
// per 128 x 128 tile computes each block's amax and scale and writes the row-wise copy, the
// column-wise (transposed) copy and their scale_inv grids; no quantizer state is read or written.
void emit_block_cast(SequenceBuilder& b, const Group& g, const ir::Operation& cast) {
  if (g.parts.size() != 1) no_kernel(b, g);  // nothing fuses with a block cast yet
  const ValueId x = cast.operands.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype, out = quantizer_format(b, cast);
  const int64_t cols = width_of(b, cast, xv);
  require_vector_width(b, cast, cols, in, "block_cast_transpose");
  const SymExpr rows = rows_of(xv);
  const CastOutputs y = cast_outputs(b, cast);
  const bool transpose = y.columnwise >= 0;
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(cast.quantizer)).spec;
  const bool two_d = spec.scaling == plan::ScalingKind::Block2D;
  auto grid_of = [&](int copy) { return copy >= 0 ? b.plan_buffer(copy).scale_inv.buffer : -1; };
  auto what = [&](bool with_copy) {
    return fmt::format("block cast {} -> {} ({} blocks{})", name_of(in),
                       fp8_output_text(out, with_copy), two_d ? "128x128" : "1x128",
                       spec.power_of_2_scale ? ", power-of-2 scales" : "");
  };
  GridRule grid = block_cast_grid(rows, cols);
  WithoutTranspose plain{what(false), grid, rules::kBlockCastThreads, 0};
  b.add_launch(
      g, what(transpose), "block_cast_transpose",
      {spell(in), spell(out), spell(two_d), spell(transpose)}, std::move(grid),
      rules::kBlockCastThreads, 0,
      {bind_in("x", b.buffer(x, cast)), bind_out("y", y.rowwise),
       bind_out("y_scale_inv", grid_of(y.rowwise)), bind_copy("y_t", y.columnwise),
       bind_copy("y_t_scale_inv", grid_of(y.columnwise)), bind_float("epsilon", spec.epsilon),
       bind_int("power_of_2_scale", spec.power_of_2_scale ? 1 : 0), bind_int("rows", rows),
       bind_int("cols", cols)},
      std::move(plain));
}

// An activation (forward, or backward with its bias gradient) whose output only feeds a
// 1 x 128 block cast (patterns activation_block_cast and dact_block_cast): one kernel computes the
// values, rounds them to the activation's output dtype and writes the cast's copies and grids
// (templates/block_activation.cuh), bit for bit what the activation kernel and the cast would.
void emit_block_activation(SequenceBuilder& b, const Group& g, const ir::Operation& act,
                           const ir::Operation& cast, const ir::Operation* dbias) {
  const bool backward = ir::is_pointwise_backward(act.kind);
  const ir::PointwiseDef& def = *ir::pointwise_def(act.kind);
  const ValueId x = act.operands.at(backward ? 1 : 0), value = act.results.at(0);
  const ValueId dy = backward ? act.operands.at(0) : ir::kNoValue;
  const DType in = b.value(x).type.dtype, out = quantizer_format(b, cast);
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(cast.quantizer)).spec;
  const int planes = backward && def.gated ? 2 : 1;
  const int loads = (def.gated ? 2 : 1) + (backward ? 1 : 0);  // input vectors per element
  // The plane width n: dy's (backward) or the output's (forward).
  const int64_t cols = width_of(b, act, b.value(backward ? dy : value));
  if (cast.operands.at(0) != value || spec.scaling != plan::ScalingKind::Block1D ||
      plan::dtype_bytes(in) != 2 || b.value(value).type.dtype != in ||
      (backward && b.value(dy).type.dtype != in) ||
      (planes == 2 && cols % rules::kBlockCastTile != 0) ||
      (dbias && dbias->operands.at(0) != value)) {
    no_kernel(b, g);  // the patterns' conditions (compiler/passes/fusion/engine.cpp)
  }
  require_vector_width(b, act, cols, in, name_of(act.kind));
  const SymExpr rows = rows_of(b.value(x));
  const CastOutputs y = cast_outputs(b, cast);
  const bool transpose = y.columnwise >= 0;
  auto grid_of = [&](int copy) { return copy >= 0 ? b.plan_buffer(copy).scale_inv.buffer : -1; };
  GridRule grid = block_cast_grid(rows, cols);
  const SymExpr partial_rows = grid.y;
  const int partial = dbias ? b.add_workspace(dbias->instance + ".dbias_partial", DType::FP32,
                                              {partial_rows, planes * cols})
                            : -1;
  auto what = [&](bool with_copy) {
    return fmt::format("{}{} {} -> {} ({} blocks{}){}", ir::pointwise_op_name(def, act.attrs),
                       backward ? " backward" : "", name_of(in), fp8_output_text(out, with_copy),
                       "1x128", spec.power_of_2_scale ? ", power-of-2 scales" : "",
                       dbias ? " + dbias partial sums" : "");
  };
  std::vector<std::string> args = {ir::pointwise_functor_name(def, act.attrs), spell(in),
                                   spell(out), spell(transpose)};
  if (backward) args.push_back(spell(dbias != nullptr));
  const std::string kernel =
      fmt::format("block_{}activation_{}", def.gated ? "gated_" : "", backward ? "bwd" : "fwd");
  std::vector<ParamBinding> params = {backward ? bind_in("dy", b.buffer(dy, act)) : bind_null("dy"),
                                      bind_in("x", b.buffer(x, act)),
                                      bind_out("y", y.rowwise),
                                      bind_out("y_scale_inv", grid_of(y.rowwise)),
                                      bind_copy("y_t", y.columnwise),
                                      bind_copy("y_t_scale_inv", grid_of(y.columnwise)),
                                      bind_out("dbias_partial", partial),
                                      bind_float("epsilon", spec.epsilon),
                                      bind_int("power_of_2_scale", spec.power_of_2_scale ? 1 : 0),
                                      bind_int("rows", rows),
                                      bind_int("cols", cols)};
  const int smem = rules::block_activation_smem_bytes(loads, planes, dbias != nullptr);
  // Backward never runs in an inference forward: no variant without the column-wise copy.
  std::optional<WithoutTranspose> plain;
  const int threads = rules::block_activation_threads(planes);
  if (!backward) plain = WithoutTranspose{what(false), grid, threads, smem};
  b.add_launch(g, what(transpose), kernel, args, std::move(grid), threads, smem, std::move(params),
               std::move(plain));
  if (dbias) {
    const ValueId db = dbias->results.at(0);
    emit_column_reduce(b, g, "dbias = column sums of the partials", {partial},
                       {b.buffer(db, *dbias)}, partial_rows, planes * cols, b.value(db).type.dtype);
  }
}

// Pattern norm_block_cast (templates/norm.cuh, layernorm_block_fwd): the norm kernel rounds its
// output to the input dtype and writes the 1 x 128 row-wise copy and grid from it, the bytes the
// unfused norm and block cast write. In training the column-wise copy needs 128 rows per block,
// more than one norm block holds: the norm also writes the rounded output to a workspace, which
// block_cast_transpose (row-wise copy off) reads for the 128 x 1 copy, the same bytes moved as
// unfused. An inference forward, which needs no column-wise copy, runs the norm alone with
// kWriteColumnwiseSource = false: one read of x and the FP8 codes written, where the unfused pair
// wrote and read the 16-bit output (note "Inference variants" in plan_variants.cpp).
void emit_norm_block_cast(SequenceBuilder& b, const Group& g, const ir::Operation& norm,
                          const ir::Operation& cast) {
  require_only(b, g, {OpKind::LayerNorm, OpKind::RMSNorm, OpKind::CastFp8});
  const bool rms = norm.kind == OpKind::RMSNorm;
  const ValueId x = norm.operands.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype, out = quantizer_format(b, cast);
  const int64_t hidden = ir::attr_int(norm.attrs, "size");
  if (cast.operands.at(0) != norm.results.at(0) || b.value(norm.results.at(0)).type.dtype != in ||
      hidden % rules::kBlockScaleLength != 0) {
    no_kernel(b, g);  // the pattern's conditions (compiler/passes/fusion/norm_cast.cpp)
  }
  require_vector_width(b, norm, hidden, in, name_of(norm.kind));
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(cast.quantizer)).spec;
  const CastOutputs y = cast_outputs(b, cast);
  const bool columnwise = y.columnwise >= 0;
  auto grid_of = [&](int copy) { return copy >= 0 ? b.plan_buffer(copy).scale_inv.buffer : -1; };
  const SymExpr rows = rows_of(xv);
  const int source =
      columnwise ? b.add_workspace(cast.instance + ".source", in, {rows, hidden}) : -1;
  const NormSaved saved = norm_saved(b, norm);
  const NormFwdLaunch shape = plain_norm_fwd_launch(rms, hidden, in, rows);
  const GridRule& grid = shape.grid;
  const int block = shape.block;
  const std::string_view pow2 = spec.power_of_2_scale ? ", power-of-2 scales" : "";
  auto what = [&](bool with_source) {
    return fmt::format("{} {} -> {} (1x128 blocks{}){}", name_of(norm.kind), name_of(in),
                       name_of(out), pow2,
                       with_source ? " + the output for the column-wise cast" : "");
  };
  std::optional<WithoutTranspose> plain;
  if (columnwise)
    plain = WithoutTranspose{what(false), grid, block, 0, {y.columnwise, grid_of(y.columnwise)}};
  const bool zero_centered = ir::attr_bool(norm.attrs, "zero_centered_gamma");
  b.add_launch(
      g, what(columnwise), rms ? "rmsnorm_block_fwd" : "layernorm_block_fwd",
      {spell(in), spell(out), std::to_string(hidden), spell(zero_centered), spell(columnwise)},
      grid, block, 0,
      {bind_in("x", b.buffer(x, norm)), bind_in("gamma", b.buffer(norm.operands.at(1), norm)),
       bind_in("beta", rms ? -1 : b.buffer(norm.operands.at(2), norm)), bind_out("y", y.rowwise),
       bind_out("y_scale_inv", grid_of(y.rowwise)), bind_copy("y_hp", source),
       bind_out("mean", saved.mean), bind_out("rstd", saved.rstd),
       bind_float("epsilon", ir::attr_float(norm.attrs, "eps")),
       bind_float("block_epsilon", spec.epsilon),
       bind_int("power_of_2_scale", spec.power_of_2_scale ? 1 : 0), bind_int("rows", rows)},
      std::move(plain));
  if (!columnwise) return;
  // Only backward reads the column-wise copy: an inference forward runs nothing here.
  GridRule cast_grid = block_cast_grid(rows, hidden);
  const std::string cast_what =
      fmt::format("block cast {} -> {} (column-wise copy only, 128x1 blocks{})", name_of(in),
                  name_of(out), pow2);
  WithoutTranspose none{"no " + cast_what, GridRule{"block_cast", 0, 0, cast_grid.dims},
                        rules::kBlockCastThreads, 0};
  b.add_launch(g, cast_what, "block_cast_transpose",
               {spell(in), spell(out), spell(false), spell(true)}, std::move(cast_grid),
               rules::kBlockCastThreads, 0,
               {bind_in("x", source), bind_null("y"), bind_null("y_scale_inv"),
                bind_copy("y_t", y.columnwise), bind_copy("y_t_scale_inv", grid_of(y.columnwise)),
                bind_float("epsilon", spec.epsilon),
                bind_int("power_of_2_scale", spec.power_of_2_scale ? 1 : 0), bind_int("rows", rows),
                bind_int("cols", hidden)},
               std::move(none));
}

// Pattern norm_micro_cast (templates/norm.cuh, layernorm_micro_fwd): the norm kernel rounds its
// output to the input dtype, quantizes it in 1 x 32 MXFP8 blocks and writes the decoded copy, the
// values micro_scale_cast writes from the unfused norm's output (note "Emulated micro-scaling" in
// docs/architecture.md). Where another op reads the norm's output (the column-wise copy's cast,
// in training) the kernel writes it too (kWriteColumnwiseSource); an inference forward, whose
// column-wise cast runs nothing, runs the variant without it, so the output is never written
// there.
void emit_norm_micro_cast(SequenceBuilder& b, const Group& g, const ir::Operation& norm,
                          const ir::Operation& cast) {
  require_only(b, g, {OpKind::LayerNorm, OpKind::RMSNorm, OpKind::EmulatedCast});
  const bool rms = norm.kind == OpKind::RMSNorm;
  const ValueId x = norm.operands.at(0), out = norm.results.at(0);
  const DType in = b.value(x).type.dtype;
  const int64_t hidden = ir::attr_int(norm.attrs, "size");
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(cast.quantizer)).spec;
  if (g.parts.front() != &norm || !decoded_mxfp8_rows(b, cast, out, in, hidden))
    no_kernel(b, g);  // the pattern's conditions (compiler/passes/fusion/norm_cast.cpp)
  require_vector_width(b, norm, hidden, in, name_of(norm.kind));
  const int format = micro_format(spec.format);
  const int y = b.buffer(cast.results.at(0), cast);
  const int source = b.existing_buffer(out);  // -1: only the fused copy reads the output
  const NormSaved saved = norm_saved(b, norm);
  const SymExpr rows = rows_of(b.value(x));
  NormFwdLaunch shape = plain_norm_fwd_launch(rms, hidden, in, rows);
  auto what = [&](bool with_source) {
    return fmt::format("{} {} -> MXFP8 {} row-wise copy (1x32 blocks), decoded to {}{}",
                       name_of(norm.kind), name_of(in), name_of(spec.format), name_of(in),
                       with_source ? " + the output" : "");
  };
  std::optional<WithoutTranspose> plain;
  if (source >= 0) plain = WithoutTranspose{what(false), shape.grid, shape.block, 0};
  const bool zero_centered = ir::attr_bool(norm.attrs, "zero_centered_gamma");
  b.add_launch(
      g, what(source >= 0), rms ? "rmsnorm_micro_fwd" : "layernorm_micro_fwd",
      {spell(in), std::to_string(format), std::to_string(hidden), spell(zero_centered),
       spell(source >= 0)},
      std::move(shape.grid), shape.block, 0,
      {bind_in("x", b.buffer(x, norm)), bind_in("gamma", b.buffer(norm.operands.at(1), norm)),
       bind_in("beta", rms ? -1 : b.buffer(norm.operands.at(2), norm)), bind_out("y", y),
       bind_copy("y_hp", source), bind_out("mean", saved.mean), bind_out("rstd", saved.rstd),
       bind_float("epsilon", ir::attr_float(norm.attrs, "eps")), bind_int("rows", rows)},
      std::move(plain));
}

}  // namespace opfuse::codegen::emitters
