// The tensor_stats op (compiler/passes/debug_instrument.h): two launches of
// templates/tensor_stats.cuh, partial records over row ranges into a workspace, then one block
// merging them in a fixed order into the executor's record of the op's slot.
#include <fmt/format.h>

#include "codegen/emit_groups.h"

namespace opfuse::codegen::emitters {

void emit_tensor_stats(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::TensorStats});
  const ir::Operation& op = *g.parts.front();
  const ValueId x = op.operands.at(0);
  const ir::Value& xv = b.value(x);
  const int64_t cols = width_of(b, op, xv);
  const SymExpr rows = rows_of(xv);
  const int slot = int(ir::attr_int(op.attrs, "slot"));
  const plan::StatSlot& s = b.seq().inspections.at(size_t(slot));
  constexpr int64_t kMaxBlocks = rules::kTensorStatsMaxBlocks;
  // Every block takes the same number of rows; square tiles never straddle two blocks.
  SymExpr per_block = ceil_div(rows, kMaxBlocks);
  if (s.block_size > 0 && s.dims == 2) {
    per_block = ceil_div(per_block, s.block_size) * SymExpr(int64_t(s.block_size));
  }
  const SymExpr blocks = min_of(rows, SymExpr(kMaxBlocks));
  // One record (11 eight-byte fields) per block, at most kMaxBlocks.
  const int partials =
      b.add_workspace(op.instance + ".partials", DType::FP32, {SymExpr(kMaxBlocks * 22)});
  const std::string what = fmt::format(
      "statistics of {}'s {} ({}){} into record {}", s.layer, s.tensor, name_of(xv.type.dtype),
      s.block_size > 0 ? fmt::format(", blocks of {} in {}-D", s.block_size, s.dims) : "", slot);
  b.add_launch(g, what, "tensor_stats_partial", {spell(xv.type.dtype)},
               GridRule{"tensor_stats", blocks, 1, {{"rows", rows}}}, rules::kTensorStatsThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_int64("rows", rows), bind_int("cols", cols),
                bind_int("block_size", s.block_size), bind_int("dims", s.dims),
                bind_int("rows_per_block", per_block), bind_out("partials", partials)});
  b.add_launch(
      g, fmt::format("merge the partial records into record {}", slot), "tensor_stats_final",
      {std::to_string(rules::kTensorStatsThreads)}, GridRule{"single", 1, 1, {}},
      rules::kTensorStatsThreads, 0,
      {bind_in("partials", partials), bind_int("count", blocks), bind_stat_record("record", slot)});
}

}  // namespace opfuse::codegen::emitters
