// Norm-like user-defined ops (compiler/ir/row_expr.h): the forward and backward row kernels of
// templates/row_expr.cuh, one block per row striding over the rows. The backward's learned
// parameters' gradients are per-block column sums reduced as an activation's (dgamma's way).
// The op's output is its value's dtype: a following FP8 cast is a kernel of its own (the
// norm-cast fusion holds the built-in norms only).

#include <fmt/format.h>

#include "codegen/emit_groups.h"
#include "ir/row_expr.h"

namespace opfuse::codegen {

namespace emitters {

namespace {

// Rows strided over at most kRowExprBlocksPerSm blocks per SM; one block per row below that.
SymExpr row_grid(const SymExpr& rows) {
  return min_of(rows, SymExpr::symbol(kNumSmsSymbol) * rules::kRowExprBlocksPerSm);
}

void require_high_precision(const SequenceBuilder& b, const ir::Operation& op, DType d) {
  if (d == DType::BF16 || d == DType::FP16 || d == DType::FP32) return;
  b.fail(op,
         fmt::format("'{}' ({}) reads or writes {}; its row kernel takes bf16, fp16 or fp32",
                     ir::written_op_name(op.kind, op.attrs), op.instance, name_of(d)),
         "cast to FP8 after the op (quantize() or the GEMM that reads it), not before");
}

}  // namespace

void emit_row_fwd(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::UserNorm});
  const ir::Operation& op = *g.find({OpKind::UserNorm});
  const ValueId x = op.operands.at(0), y = op.results.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype, out = b.value(y).type.dtype;
  require_high_precision(b, op, in);
  require_high_precision(b, op, out);
  const int64_t cols = width_of(b, op, xv);
  const SymExpr rows = rows_of(xv);
  const std::string_view name = ir::written_op_name(op.kind, op.attrs);
  b.add_launch(g, fmt::format("{} (row program) {} -> {}", name, name_of(in), name_of(out)),
               "row_expr_fwd", {ir::row_functor_name(op.attrs), spell(in), spell(out)},
               GridRule{"row_expr", row_grid(rows), 1, {{"rows", rows}}}, rules::kRowExprThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_out("y", b.buffer(y, op)),
                bind_learned(b, op, 1), bind_int("rows", rows), bind_int("cols", cols)});
}

void emit_row_bwd(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::UserNormBackward});
  const ir::Operation& op = *g.find({OpKind::UserNormBackward});
  const ValueId dy = op.operands.at(0), x = op.operands.at(1), dx = op.results.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype, out = b.value(dx).type.dtype;
  require_high_precision(b, op, in);
  require_high_precision(b, op, out);
  if (b.value(dy).type.dtype != in) {
    b.fail(op, fmt::format("'{}' ({}): its row kernel reads dy and x as one dtype, got {} and {}",
                           ir::written_op_name(op.kind, op.attrs), op.instance,
                           name_of(b.value(dy).type.dtype), name_of(in)));
  }
  const int64_t cols = width_of(b, op, xv);
  const SymExpr rows = rows_of(xv);
  const SymExpr grid = row_grid(rows);
  const ir::RowExpr expr(op.attrs);
  const std::vector<ir::UserParam>& learned = expr.learned();
  std::vector<int> partials(ir::kMaxUserParams, -1);
  for (size_t k = 0; k < learned.size(); ++k)
    partials[k] = b.add_workspace(fmt::format("{}.{}.grad_partial", op.instance, learned[k].name),
                                  DType::FP32, {grid, cols});
  const std::string_view name = ir::written_op_name(op.kind, op.attrs);
  b.add_launch(g,
               fmt::format("{} backward (row program) {} -> {}{}", name, name_of(in), name_of(out),
                           learned.empty() ? "" : " + parameter partial sums"),
               "row_expr_bwd", {ir::row_functor_name(op.attrs), spell(in), spell(out)},
               GridRule{"row_expr", grid, 1, {{"rows", rows}}}, rules::kRowExprThreads, 0,
               {bind_in("dy", b.buffer(dy, op)), bind_in("x", b.buffer(x, op)),
                bind_out("dx", b.buffer(dx, op)), bind_learned(b, op, 2),
                bind_buffers("learned_partial", partials, true), bind_int("rows", rows),
                bind_int("cols", cols)});
  emit_learned_gradients(b, g, op, learned, partials, grid, cols);
}

}  // namespace emitters

}  // namespace opfuse::codegen
