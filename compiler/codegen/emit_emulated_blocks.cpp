// Float8 block scaling emulated (note "Emulated block scaling" in docs/architecture.md): one
// block_fake_quantize launch per decoded copy, for the BF16 GEMMs of a target without cuBLASLt's
// block-scale modes.

#include <fmt/format.h>

#include <optional>

#include "codegen/emit_groups.h"
#include "support/assert.h"

namespace opfuse::codegen::emitters {

void emit_emulated_block_cast(SequenceBuilder& b, const Group& g, const ir::Operation& op,
                              ValueId x, int y, bool columnwise) {
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(op.quantizer)).spec;
  OPFUSE_ASSERT(spec.block_scaled(), "'{}' is not block-scaled", op.instance);
  const int64_t cols = width_of(b, op, xv);
  const SymExpr rows = rows_of(xv);
  // 128 x 128 blocks are the same blocks in both copies (one copy serves both GEMMs).
  const int blocks = spec.scaling == plan::ScalingKind::Block2D ? rules::kBlockTiles
                     : columnwise                               ? rules::kBlockColumns
                                                                : rules::kBlockRows;
  // The row blocks' lanes load 4 consecutive elements of one row.
  if (blocks == rules::kBlockRows) require_vector_width(b, op, cols, in, "block_fake_quantize");
  GridRule grid{"block_fake_quantize", 1, 1, {{"rows", rows}, {"cols", cols}}};
  if (blocks == rules::kBlockRows) {
    grid.x = ceil_div(rows * rules::block_row_count(cols), rules::kBlockFakeQuantizeWarps);
  } else if (blocks == rules::kBlockColumns) {
    grid.x =
        ceil_div(ceil_div(rows, rules::kBlockScaleLength) * cols, rules::kBlockFakeQuantizeThreads);
  } else {
    grid.x = rules::block_fake_quantize_grid_x(0, cols, blocks);
    grid.y = rows.value()
                 ? SymExpr(rules::block_fake_quantize_grid_y(*rows.value(), blocks))
                 : min_of(ceil_div(rows, rules::kBlockScaleLength), rules::kBlockCastMaxGridY);
  }
  const std::string what = fmt::format(
      "{} copy of {} ({} blocks of {}{}), decoded to {} (float8_block_scaling emulated)",
      columnwise ? "column-wise" : "row-wise", name_of(in),
      blocks == rules::kBlockTiles     ? "128x128"
      : blocks == rules::kBlockColumns ? "128x1"
                                       : "1x128",
      name_of(spec.format), spec.power_of_2_scale ? ", power-of-2 scales" : "", name_of(in));
  // A copy only backward reads: an inference forward neither makes nor allocates it (the
  // template has no kWriteTranspose flag, so its variant is an empty grid: no launch).
  std::optional<WithoutTranspose> none;
  if (columnwise) {
    none = WithoutTranspose{"no " + what, GridRule{"block_fake_quantize", 0, 0, grid.dims},
                            rules::kBlockFakeQuantizeThreads, 0};
  }
  // Row blocks are the template's default: the quantize op's kernel serves these copies too.
  std::vector<std::string> args = {spell(in), spell(spec.format)};
  if (blocks != rules::kBlockRows) args.push_back(std::to_string(blocks));
  b.add_launch(g, what, "block_fake_quantize", args, std::move(grid),
               rules::kBlockFakeQuantizeThreads, 0,
               {bind_in("x", b.buffer(x, op)), columnwise ? bind_copy("y", y) : bind_out("y", y),
                bind_float("epsilon", spec.epsilon),
                bind_int("power_of_2_scale", spec.power_of_2_scale ? 1 : 0), bind_int("rows", rows),
                bind_int("cols", cols)},
               std::move(none));
}

}  // namespace opfuse::codegen::emitters
