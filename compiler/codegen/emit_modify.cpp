// A GEMM operand a debug config modifies (compiler/passes/debug_modify.h): fake quantization is
// the language's quantize op under current scaling (an amax pass, then fake_quantize); a pointwise
// modification y = f(x) is templates/activation.cuh's activation_fwd with the functor generated
// from the expression (ir::expression_functor_name), reading and writing the tensor's dtype.
#include <fmt/format.h>

#include "codegen/emit_groups.h"
#include "ir/pointwise_ops.h"

namespace opfuse::codegen::emitters {

void emit_modify_tensor(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::ModifyTensor});
  const ir::Operation& op = *g.parts.front();
  if (op.quantizer >= 0) return emit_fake_quantize(b, g, op);
  const ValueId x = op.operands.at(0), y = op.results.at(0);
  const ir::Value& xv = b.value(x);
  const DType dtype = xv.type.dtype;
  const int64_t cols = width_of(b, op, xv);
  require_vector_width(b, op, cols, dtype, "modify_tensor");
  const SymExpr rows = rows_of(xv);
  const std::string functor = ir::expression_functor_name(ir::attr_name(op.attrs, "expression"));
  b.add_launch(g,
               fmt::format("{} modifies {} (y = f(x), {})", ir::attr_name(op.attrs, "feature"),
                           op.instance, name_of(dtype)),
               "activation_fwd", {functor, spell(dtype), spell(dtype), spell(false)},
               tile_grid(rows, cols), rules::kTileThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_out("y", b.buffer(y, op)), bind_copy("y_t", -1),
                bind_quantizer("scale", -1, QuantizerValue::Scale),
                bind_quantizer("amax", -1, QuantizerValue::Amax), bind_scale_record(-1),
                bind_int("rows", rows), bind_int("cols", cols), bind_null("in_stats"),
                bind_null("out_stats"),
                // The expression has no learned parameters: every entry of the array is null.
                bind_buffers("learned", std::vector<int>(ir::kMaxUserParams, -1), false)});
}

}  // namespace opfuse::codegen::emitters
