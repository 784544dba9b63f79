// The tensor_capture op (compiler/passes/debug_instrument.h): one launch of
// templates/tensor_capture.cuh converting the tensor to float32 into the executor's capture of
// the op's slot (SequencePlan::capture_slots, ParamKind::Capture).
#include <fmt/format.h>

#include "codegen/emit_groups.h"

namespace opfuse::codegen::emitters {

void emit_tensor_capture(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::TensorCapture});
  const ir::Operation& op = *g.parts.front();
  const ValueId x = op.operands.at(0);
  const ir::Value& xv = b.value(x);
  const int slot = int(ir::attr_int(op.attrs, "slot"));
  const plan::CaptureSlot& s = b.seq().captures.at(size_t(slot));
  const int buffer = b.buffer(x, op);
  SymExpr count(int64_t(1));
  for (const SymExpr& d : b.set_capture_buffer(slot, buffer)) count = count * d;
  constexpr int64_t kThreads = rules::kTensorCaptureThreads;
  const SymExpr blocks = min_of(ceil_div(count, kThreads), SymExpr(rules::kTensorCaptureMaxBlocks));
  // A quantized capture (the FP8 copy a GEMM reads) also takes the copy's scale_inv after the
  // values: its quantizer's scalar, or the real entries of its block scale grid (a buffer of its
  // own, laid out [grid_rows][grid_stride] with padding; plan::CaptureSlot::scale_count).
  const bool quantized = s.quantized && op.quantizer >= 0;
  const int grid = quantized ? b.plan_buffer(buffer).scale_inv.buffer : -1;
  SymExpr grid_rows(int64_t(0)), grid_stride(int64_t(0)), grid_used(int64_t(0));
  if (grid >= 0) {
    const std::vector<SymExpr>& g = b.plan_buffer(grid).shape;
    const std::vector<SymExpr>& data = b.plan_buffer(buffer).shape;
    grid_rows = g.at(0);
    grid_stride = g.at(1);
    SymExpr rows(int64_t(1));
    for (size_t d = 0; d + 1 < data.size(); ++d) rows = rows * data[d];
    // 1 x 128 blocks: a grid row per block column, one entry per data row; 128 x 128: a grid row
    // per block row, one entry per block column.
    grid_used = s.block.rows > 1 ? ceil_div(data.back(), int64_t(s.block.cols)) : rows;
  }
  const std::string what =
      fmt::format("capture of {}'s {} ({}{}) as float32 into capture {}", s.layer, s.tensor,
                  name_of(xv.type.dtype),
                  quantized ? ", the FP8 copy its GEMM reads, and its scale_inv" : "", slot);
  b.add_launch(g, what, "tensor_capture", {spell(xv.type.dtype)},
               GridRule{"tensor_capture", blocks, 1, {{"count", count}}}, kThreads, 0,
               {bind_in("x", buffer), bind_int64("count", count), bind_capture("capture", slot),
                quantized && grid < 0
                    ? bind_quantizer("scale_inv", op.quantizer, QuantizerValue::GemmScaleInv)
                    : bind_null("scale_inv"),
                grid >= 0 ? bind_in("scale_grid", grid) : bind_null("scale_grid"),
                bind_int64("grid_rows", grid_rows), bind_int64("grid_stride", grid_stride),
                bind_int64("grid_used", grid_used)});
}

}  // namespace opfuse::codegen::emitters
