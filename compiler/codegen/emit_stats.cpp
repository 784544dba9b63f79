// The tensor_stats op (compiler/passes/debug_instrument.h): two launches of
// templates/tensor_stats.cuh (a Moments slot) or templates/quant_stats.cuh (a Quantized slot),
// partial records over row ranges into a workspace, then one block merging them in a fixed order
// into the executor's record of the op's slot.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "codegen/emit_groups.h"
#include "debug/stats.h"
#include "support/assert.h"

namespace opfuse::codegen::emitters {

namespace {

// The slot's index in the plan of the Moments record of the same tensor (placed before it).
int moments_slot(const ir::Sequence& seq, const plan::StatSlot& s) {
  for (size_t i = 0; i < seq.inspections.size(); ++i) {
    const plan::StatSlot& m = seq.inspections[i];
    if (m.layer == s.layer && m.tensor == s.tensor && m.record == plan::StatRecordKind::Moments &&
        m.block_size == 0)
      return int(i);
  }
  return -1;
}

// The quantizer "<layer>.<role>" of a slot's tensor; -1 when the plan has none.
int own_quantizer(const ir::Sequence& seq, const plan::StatSlot& s) {
  const std::string role =
      s.tensor == "activation" ? "input" : (s.tensor == "weight" ? "weight" : "grad_output");
  for (size_t i = 0; i < seq.quantizers.size(); ++i)
    if (seq.quantizers[i].name == s.layer + "." + role) return int(i);
  return -1;
}

// A Quantized slot (LogFp8TensorStats): templates/quant_stats.cuh.
void emit_quant_stats(SequenceBuilder& b, const Group& g, const ir::Operation& op, int slot,
                      const plan::StatSlot& s) {
  const ValueId x = op.operands.at(0);
  const ir::Value& xv = b.value(x);
  const int64_t cols = width_of(b, op, xv);
  const SymExpr rows = rows_of(xv);
  // The layer's own block-scaled quantizer (a Quantizer cast with blocks) casts as a Float8Block
  // what-if with its spec's power of 2 and epsilon.
  const bool own_blocks = s.cast == plan::QuantStatCast::Quantizer && s.block_size > 0;
  const bool blocked = own_blocks || s.cast == plan::QuantStatCast::Float8Block ||
                       s.cast == plan::QuantStatCast::Mxfp8;
  const int block_rows = blocked && (s.dims == 2 || s.columnwise) ? s.block_size : 1;
  const int block_cols = blocked && (s.dims == 2 || !s.columnwise) ? s.block_size : 1;
  int quantizer = -1;
  DType format = s.format;
  plan::QuantStatCast cast = s.cast;
  double block_epsilon = 0.0;  // the what-if's: TE's Float8BlockScaling defaults
  bool block_power_of_2 = true;
  if (s.cast == plan::QuantStatCast::Quantizer) {
    quantizer = own_quantizer(b.seq(), s);
    OPFUSE_ASSERT(quantizer >= 0, "no quantizer for the statistics of {}.{}", s.layer, s.tensor);
    const plan::QuantSpec& spec = b.seq().quantizers[size_t(quantizer)].spec;
    format = spec.format;
    if (own_blocks) {
      cast = plan::QuantStatCast::Float8Block;
      block_epsilon = spec.epsilon;
      block_power_of_2 = spec.power_of_2_scale;
    }
  }
  const int moments = blocked ? -1 : moments_slot(b.seq(), s);
  OPFUSE_ASSERT(blocked || (moments >= 0 && moments < slot), "no moments record before slot {}",
                slot);
  constexpr int64_t kMaxBlocks = rules::kTensorStatsMaxBlocks;
  // Every block takes the same number of rows, a multiple of the scale block's.
  const SymExpr per_block =
      ceil_div(ceil_div(rows, kMaxBlocks), block_rows) * SymExpr(int64_t(block_rows));
  const SymExpr blocks = min_of(rows, SymExpr(kMaxBlocks));
  // One record (11 eight-byte fields) per block, at most kMaxBlocks.
  const int partials =
      b.add_workspace(op.instance + ".partials", DType::FP32, {SymExpr(kMaxBlocks * 22)});
  // The scale-exponent histogram (plan::StatSlot::exponent_histogram): 256 four-byte counts per
  // block, added up by the final launch into the records after the slot's.
  const int histogram = s.exponent_histogram
                            ? b.add_workspace(op.instance + ".histogram", DType::FP32,
                                              {SymExpr(kMaxBlocks * int64_t(debug::kExponentBins))})
                            : -1;
  const std::string what =
      fmt::format("{} statistics of {}'s {} ({}) cast to {}{}{} into record {}{}",
                  plan::name(s.cast), s.layer, s.tensor, name_of(xv.type.dtype), name_of(format),
                  blocked ? fmt::format(" in {}x{} blocks", block_rows, block_cols) : "",
                  s.cast == plan::QuantStatCast::Quantizer ? " by its quantizer" : "", slot,
                  histogram >= 0 ? fmt::format(", its scale-exponent histogram into records {}-{}",
                                               slot + 1, slot + debug::kExponentHistogramRecords)
                                 : "");
  b.add_launch(g, what, "quant_stats_partial", {spell(xv.type.dtype), spell(format)},
               GridRule{"tensor_stats", blocks, 1, {{"rows", rows}}}, rules::kTensorStatsThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_int64("rows", rows), bind_int("cols", cols),
                bind_int("cast", int64_t(cast)), bind_int("block_rows", block_rows),
                bind_int("block_cols", block_cols), bind_int("rows_per_block", per_block),
                bind_float("block_epsilon", block_epsilon),
                bind_int("block_power_of_2", block_power_of_2 ? 1 : 0),
                quantizer >= 0 ? bind_records("quantizer", {quantizer}) : bind_null("quantizer"),
                moments >= 0 ? bind_stat_record("moments", moments) : bind_null("moments"),
                bind_out("partials", partials),
                histogram >= 0 ? bind_out("histogram", histogram) : bind_null("histogram")});
  b.add_launch(
      g, fmt::format("merge the partial records into record {}", slot), "quant_stats_final", {"32"},
      GridRule{"single", 1, 1, {}}, 32, 0,
      {bind_in("partials", partials), bind_int("count", blocks), bind_stat_record("record", slot),
       histogram >= 0 ? bind_in("histogram_partials", histogram)
                      : bind_null("histogram_partials")});
}

}  // namespace

void emit_tensor_stats(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::TensorStats});
  const ir::Operation& op = *g.parts.front();
  {
    const int slot = int(ir::attr_int(op.attrs, "slot"));
    const plan::StatSlot& s = b.seq().inspections.at(size_t(slot));
    if (s.record == plan::StatRecordKind::Quantized) return emit_quant_stats(b, g, op, slot, s);
  }
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

int FusedStats::bits() const {
  return (input.slot >= 0 ? rules::kStatsOfInput : 0) |
         (output.slot >= 0 ? rules::kStatsOfOutput : 0);
}

void FusedStats::append_args(std::vector<std::string>& args, DType output, bool with_type) const {
  if (bits() == 0) return;
  args.push_back(std::to_string(bits()));
  if (with_type) args.push_back(spell(output));
}

std::string FusedStats::text() const {
  std::string out;
  if (input.slot >= 0) out += fmt::format(" + statistics of its input into record {}", input.slot);
  if (output.slot >= 0)
    out += fmt::format(" + statistics of its output into record {}", output.slot);
  return out;
}

FusedStats fused_stats(SequenceBuilder& b, const Group& g, ValueId input, ValueId output,
                       const GridRule& tile, const TileKernelShape& shape) {
  FusedStats fs;
  fs.grid = tile;
  const bool any = std::any_of(g.parts.begin(), g.parts.end(), [](const ir::Operation* p) {
    return p->kind == OpKind::TensorStats;
  });
  if (any) {
    const std::optional<int64_t> columns = tile.x.value();
    OPFUSE_ASSERT(columns.has_value() && *columns > 0, "a tile grid has known column tiles");
    if (!shape.dbias) {
      // The flat schedule: as many blocks as the GPU holds at once (the kernel's register budget
      // gives its resident blocks per SM), each running an equal run of the column-major tiles.
      // A grid of kStatsTileBlocksPerSm row blocks per SM left a partial last wave (the large
      // MLP's SwiGLU: 224 column tiles x 3 on 2 x 132 resident blocks, 12% of the kernel idle).
      const int resident = rules::min_blocks(
          rules::kTileThreads, rules::tile_register_budget(shape.input_bytes, shape.loads,
                                                           shape.transpose, false, true));
      auto dim = [&](const std::string& name) {
        for (const auto& [key, value] : tile.dims) {
          if (key == name) return value;
        }
        OPFUSE_ASSERT(false, "a tile grid names its rows and cols");
        return SymExpr(0);
      };
      const SymExpr rows = dim("rows");
      const SymExpr tiles = ceil_div(rows, rules::kTileRows) * SymExpr(*columns);
      fs.grid = GridRule{
          "tile_stats_flat",
          max_of(SymExpr(1),
                 min_of(tiles, SymExpr::symbol(kNumSmsSymbol) * SymExpr(int64_t(resident)))),
          1,
          {{"rows", rows}, {"cols", dim("cols")}, {"blocks_per_sm", int64_t(resident)}}};
    } else {
      // At most kStatsTileBlocksPerSm blocks per SM's worth of row blocks per column tile: a
      // block merges its accumulators into a record once, after all of its row tiles.
      fs.grid.rule = "tile_stats";
      fs.grid.y = min_of(tile.y, ceil_div(SymExpr::symbol(kNumSmsSymbol) *
                                              SymExpr(int64_t(rules::kStatsTileBlocksPerSm)),
                                          *columns));
      fs.grid.dims.emplace_back("blocks_per_sm", int64_t(rules::kStatsTileBlocksPerSm));
    }
  }
  fs.blocks = fs.grid.x * fs.grid.y;
  for (const ir::Operation* p : g.parts) {
    if (p->kind != OpKind::TensorStats) continue;
    const ValueId v = p->operands.at(0);
    const int slot = int(ir::attr_int(p->attrs, "slot"));
    const plan::StatSlot& s = b.seq().inspections.at(size_t(slot));
    if (s.record != plan::StatRecordKind::Moments || s.block_size != 0) no_kernel(b, g);
    FusedStats::Tap* tap = v == input ? &fs.input : (v == output ? &fs.output : nullptr);
    if (tap == nullptr || tap->slot >= 0) no_kernel(b, g);
    tap->slot = slot;
    tap->instance = p->instance;
    // One record (11 eight-byte fields) per block.
    tap->partials =
        b.add_workspace(p->instance + ".partials", DType::FP32, {fs.blocks * SymExpr(22)});
  }
  return fs;
}

void emit_fused_stats_merge(SequenceBuilder& b, const Group& g, const FusedStats& stats) {
  constexpr int kThreads = rules::kStatsMergeThreads;
  for (const FusedStats::Tap* tap : {&stats.input, &stats.output}) {
    if (tap->slot < 0) continue;
    b.add_launch(g, fmt::format("merge the kernel's partial records into record {}", tap->slot),
                 "tensor_stats_final", {std::to_string(kThreads)}, GridRule{"single", 1, 1, {}},
                 kThreads, 0,
                 {bind_in("partials", tap->partials), bind_int("count", stats.blocks),
                  bind_stat_record("record", tap->slot)});
  }
}

}  // namespace opfuse::codegen::emitters
