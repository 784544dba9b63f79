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
  // A quantized capture (the FP8 copy a GEMM reads) also takes the copy's scale_inv, after the
  // values (the executor's capture holds one more float).
  const bool quantized = s.quantized && op.quantizer >= 0;
  const std::string what =
      fmt::format("capture of {}'s {} ({}{}) as float32 into capture {}", s.layer, s.tensor,
                  name_of(xv.type.dtype),
                  quantized ? ", the FP8 copy its GEMM reads, and its scale_inv" : "", slot);
  b.add_launch(g, what, "tensor_capture", {spell(xv.type.dtype)},
               GridRule{"tensor_capture", blocks, 1, {{"count", count}}}, kThreads, 0,
               {bind_in("x", buffer), bind_int64("count", count), bind_capture("capture", slot),
                quantized ? bind_quantizer("scale_inv", op.quantizer, QuantizerValue::ScaleInv)
                          : bind_null("scale_inv")});
}

}  // namespace opfuse::codegen::emitters
