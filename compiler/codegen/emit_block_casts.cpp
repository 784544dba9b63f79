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
  if (!backward) plain = WithoutTranspose{what(false), grid, rules::kBlockCastThreads, smem};
  b.add_launch(g, what(transpose), kernel, args, std::move(grid), rules::kBlockCastThreads, smem,
               std::move(params), std::move(plain));
  if (dbias) {
    const ValueId db = dbias->results.at(0);
    emit_column_reduce(b, g, "dbias = column sums of the partials", {partial},
                       {b.buffer(db, *dbias)}, partial_rows, planes * cols, b.value(db).type.dtype);
  }
}

}  // namespace opfuse::codegen::emitters
