// The dropout op (note "Dropout" in docs/language.md): templates/dropout.cuh. The forward launch
// draws the mask from the op's seed, its instance's stream word and the executor's step counter
// (ParamKind::DropoutStep, read at run time), and writes it as bits; its inference variant
// (kWriteMask = false) passes x through and writes no mask. The backward reads the saved bits.
#include <fmt/format.h>

#include <algorithm>

#include "../../templates/common/philox.cuh"
#include "codegen/emit_groups.h"

namespace opfuse::codegen::emitters {

namespace {

// Each thread of the kernel owns 8 elements of a row and one byte of its mask.
void require_whole_runs(const SequenceBuilder& b, const ir::Operation& op, int64_t cols) {
  if (cols % 8 != 0) {
    b.fail(op,
           fmt::format("'dropout' ({}): the dropout kernel handles 8 elements per thread (one "
                       "byte of its mask), but the row width {} is not a multiple of 8",
                       op.instance, cols),
           "pad the width to a multiple of 8");
  }
}

ParamBinding bind_dropout_step(std::string field) {
  ParamBinding p = bind_null(std::move(field));
  p.kind = ParamKind::DropoutStep;
  return p;
}

}  // namespace

void emit_dropout(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::Dropout});
  const ir::Operation& op = *g.parts.front();
  const ValueId x = op.operands.at(0), y = op.results.at(0);
  const ir::Value& xv = b.value(x);
  const DType dtype = xv.type.dtype;
  const int64_t cols = width_of(b, op, xv);
  require_vector_width(b, op, cols, dtype, "dropout");
  require_whole_runs(b, op, cols);
  const SymExpr rows = rows_of(xv);
  const double p = ir::attr_float(op.attrs, "p");
  const unsigned long long threshold = opfuse::dropout_threshold(p);
  const uint32_t stream = opfuse::dropout_stream(op.instance.data(), op.instance.size());
  // The saved mask (a result build-backward added) where backward reads it; otherwise scratch,
  // which the inference variant leaves out like the saved one.
  int mask = -1;
  if (op.results.size() > 1) {
    mask = b.buffer(op.results[1], op);
  } else {
    mask = b.add_workspace(fmt::format("{}.mask", op.instance), DType::FP32,
                           {rows, SymExpr((cols + 31) / 32)});
  }
  const GridRule grid = tile_grid(rows, cols);
  b.add_launch(
      g, fmt::format("y = dropout(x, p = {}) ({}), mask bits saved", p, name_of(dtype)),
      "dropout_fwd", {spell(dtype), spell(true)}, grid, rules::kTileThreads, 0,
      {bind_in("x", b.buffer(x, op)), bind_out("y", b.buffer(y, op)), bind_copy("mask", mask),
       bind_dropout_step("step"), bind_int64("seed", ir::attr_int(op.attrs, "seed")),
       bind_int64("threshold", int64_t(threshold)), bind_float("scale", 1.0 / (1.0 - p)),
       // The stream word's bits as the kernel's int (it converts them back).
       bind_int("stream", int64_t(int32_t(stream))), bind_int("rows", rows),
       bind_int("cols", cols)},
      WithoutTranspose{"y = x (dropout in inference)", grid, rules::kTileThreads, 0});
}

void emit_dropout_bwd(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::DropoutBackward});
  const ir::Operation& op = *g.parts.front();
  const ValueId dy = op.operands.at(0), mask = op.operands.at(1), dx = op.results.at(0);
  const ir::Value& dyv = b.value(dy);
  const DType dtype = dyv.type.dtype;
  const int64_t cols = width_of(b, op, dyv);
  require_vector_width(b, op, cols, dtype, "dropout backward");
  require_whole_runs(b, op, cols);
  const double p = ir::attr_float(op.attrs, "p");
  b.add_launch(g, fmt::format("dx = dy * saved mask / (1 - {}) ({})", p, name_of(dtype)),
               "dropout_bwd", {spell(dtype)}, tile_grid(rows_of(dyv), cols), rules::kTileThreads, 0,
               {bind_in("dy", b.buffer(dy, op)), bind_in("mask", b.buffer(mask, op)),
                bind_out("dx", b.buffer(dx, op)), bind_float("scale", 1.0 / (1.0 - p)),
                bind_int("rows", rows_of(dyv)), bind_int("cols", cols)});
}

void emit_dropout_step_advance(SequenceBuilder& b) {
  const auto& ops = b.seq().ops;
  if (std::none_of(ops.begin(), ops.end(),
                   [](const ir::Operation& op) { return op.kind == OpKind::Dropout; }))
    return;
  b.add_launch(Group{}, "advance dropout's step counter (the next step draws new masks)",
               "dropout_advance_step", {}, GridRule{"single", 1, 1, {}}, 1, 0,
               {bind_dropout_step("step")});
}

}  // namespace opfuse::codegen::emitters
