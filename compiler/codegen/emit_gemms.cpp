// The GEMM group emitters: fprop, dgrad and wgrad as cuBLASLt GEMMs with their epilogues (the
// shared helpers are in emit_groups.h; note "Kernels by parts" in docs/codegen.md).

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "codegen/emit_groups.h"
#include "codegen/kernel_templates.h"
#include "ir/pointwise_ops.h"
#include "plan/gemm_caps.h"
#include "support/assert.h"

namespace opfuse::codegen::emitters {

namespace {

// ---- GEMMs (note "Row-major GEMMs" in runtime/gpu/gemm_desc.h) ----------------------------------

GemmOperand gemm_operand(const SequenceBuilder& b, ValueId v, const ir::Operation& at) {
  const ir::Value& value = b.value(v);
  GemmOperand operand;
  operand.buffer = b.buffer(v, at);
  operand.dtype = value.type.dtype;
  // A per-tensor scale is the quantizer's device scalar; a block-scaled copy carries its grid.
  if (value.quantizer >= 0) {
    operand.scale_inv = b.plan_buffer(operand.buffer).scale_inv;
    const ir::QuantizerDecl& q = b.seq().quantizers.at(size_t(value.quantizer));
    const std::string problem =
        plan::gemm_support_problem(plan::gemm_caps(b.options().arch), q.spec);
    if (!problem.empty()) {
      b.fail(at,
             fmt::format("{} of '{}' reads '{}' quantized as {}, but {}", ir::op_info(at.kind).name,
                         at.instance, q.name, plan::quant_spec_string(q.spec), problem),
             "compile for sm_90a (H100, H200), or use a per-tensor recipe for this sequence");
    }
  }
  operand.usage = b.is_columnwise_copy(v) ? CopyUsage::Columnwise : CopyUsage::Rowwise;
  return operand;
}

// Whether a block-scaled operand takes part: cuBLASLt's block scale modes have no fast
// accumulation (docs/architecture.md, "GEMM capabilities").
bool block_scaled(const GemmStep& gemm) {
  return gemm.a.scale_inv.buffer >= 0 || gemm.b.scale_inv.buffer >= 0;
}

// A column-wise FP8 copy stored transposed ([k, rows...]): how TN-only GEMMs read K-major data.
bool transposed_copy(const SequenceBuilder& b, ValueId v) {
  const int q = b.value(v).quantizer;
  return b.is_columnwise_copy(v) &&
         b.seq().quantizers.at(size_t(q)).columnwise_layout == CopyLayout::Transposed;
}

void set_output(SequenceBuilder& b, GemmStep& gemm, ValueId d, const ir::Operation& at) {
  const ir::Value& dv = b.value(d);
  gemm.d = b.buffer(d, at);
  gemm.d_dtype = dv.type.dtype;
  gemm.d_quantizer = ir::dtype_is_fp8(dv.type.dtype) ? dv.quantizer : -1;
}

std::string gemm_text(const GemmStep& gemm, std::string_view instance) {
  return fmt::format("{} GEMM of {} ({} x {} -> {}{}{})", plan::name(gemm.role), instance,
                     name_of(gemm.a.dtype), name_of(gemm.b.dtype), name_of(gemm.d_dtype),
                     gemm.epilogue == GemmEpilogue::None
                         ? std::string()
                         : fmt::format(", epilogue {}", plan::name(gemm.epilogue)),
                     gemm.accumulate ? ", accumulate" : "");
}

}  // namespace

void emit_fprop(SequenceBuilder& b, const Group& g) {
  require_only(b, g, ir::has_gelu_epilogue, {OpKind::Linear, OpKind::Bias, OpKind::AddExtraInput});
  const ir::Operation& linear = *g.find({OpKind::Linear});
  const ir::Operation* bias_op = g.find({OpKind::Bias});
  const ir::Operation* gelu = find_part(g, ir::has_gelu_epilogue);
  const ir::Operation* add = g.find({OpKind::AddExtraInput});
  if (g.parts.front() != &linear || (gelu && add)) no_kernel(b, g);
  const bool own_bias = ir::attr_bool(linear.attrs, "bias");
  if (own_bias && bias_op) no_kernel(b, g);
  GemmStep gemm;
  gemm.role = GemmRole::Fprop;
  const ValueId x = linear.operands.at(0), w = linear.operands.at(1);
  gemm.a = gemm_operand(b, x, linear);
  gemm.b = gemm_operand(b, w, linear);
  gemm.a_transposed = false;  // x [m, k]
  gemm.b_transposed = true;   // W [n, k]
  gemm.m = rows_of(b.value(x));
  gemm.n = ir::attr_int(linear.attrs, "out");
  gemm.k = ir::attr_int(linear.attrs, "in");
  gemm.fast_accum =
      ir::dtype_is_fp8(gemm.a.dtype) && b.options().fp8_fprop_fast_accum && !block_scaled(gemm);
  if (own_bias) gemm.bias = b.buffer(linear.operands.at(2), linear);
  if (bias_op) gemm.bias = b.buffer(bias_op->operands.at(1), *bias_op);
  if (gemm.bias >= 0) gemm.epilogue = GemmEpilogue::Bias;
  if (gelu) {
    if (gemm.bias < 0) {
      b.fail(*gelu,
             "a linear followed by gelu fuses into one GEMM only with a bias "
             "(GELU_AUX_BIAS epilogue)");
    }
    gemm.epilogue = GemmEpilogue::GeluAuxBias;
    // The pre-activation, saved for the GELU backward.
    gemm.aux = epilogue_output(b, gelu->operands.at(0), gelu->instance + ".gelu_aux");
  }
  if (add) {
    gemm.accumulate = true;
    gemm.c = b.buffer(add->operands.back(), *add);
  }
  const ir::Operation& last = *g.parts.back();
  set_output(b, gemm, last.results.at(0), last);
  const std::string what = gemm_text(gemm, linear.instance);
  b.add_gemm(g, what, std::move(gemm));
}

void emit_dgrad(SequenceBuilder& b, const Group& g) {
  require_only(b, g, ir::has_gelu_epilogue,
               {OpKind::LinearDgrad, OpKind::GradAdd, OpKind::BiasGrad});
  const ir::Operation& dgrad = *g.find({OpKind::LinearDgrad});
  const ir::Operation* add = g.find({OpKind::GradAdd});
  const ir::Operation* dact = find_part(g, ir::has_gelu_epilogue);
  const ir::Operation* dbias = g.find({OpKind::BiasGrad});
  if (g.parts.front() != &dgrad || (add && dact) || (dbias && !dact)) no_kernel(b, g);
  GemmStep gemm;
  gemm.role = GemmRole::Dgrad;
  const ValueId dy = dgrad.operands.at(0), w = dgrad.operands.at(1);
  gemm.a = gemm_operand(b, dy, dgrad);
  gemm.b = gemm_operand(b, w, dgrad);
  gemm.a_transposed = false;                  // dy [m, k]
  gemm.b_transposed = transposed_copy(b, w);  // W^T [n, k] (FP8) or W [k, n]
  gemm.m = rows_of(b.value(dy));
  gemm.n = ir::attr_int(dgrad.attrs, "in");
  gemm.k = ir::attr_int(dgrad.attrs, "out");
  ValueId d = dgrad.results.at(0);
  if (dact) {
    if (!ir::is_pointwise_backward(dact->kind) || dact->operands.at(0) != d) no_kernel(b, g);
    gemm.aux = b.buffer(dact->operands.at(1), *dact);  // the saved pre-activation
    d = dact->results.at(0);
    gemm.epilogue = GemmEpilogue::DGelu;
    if (dbias) {
      if (dbias->operands.at(0) != d) no_kernel(b, g);
      gemm.epilogue = GemmEpilogue::DGeluBiasGrad;
      gemm.bias = b.buffer(dbias->results.at(0), *dbias);
    }
    gemm.d = epilogue_output(b, d, dact->instance + ".dgelu");
    gemm.d_dtype = b.value(d).type.dtype;
  } else if (add) {
    if (add->operands.at(0) != d && add->operands.at(1) != d) no_kernel(b, g);
    gemm.accumulate = true;
    gemm.c = b.buffer(add->operands[0] == d ? add->operands[1] : add->operands[0], *add);
    set_output(b, gemm, add->results.at(0), *add);
  } else {
    set_output(b, gemm, d, dgrad);
  }
  const std::string what = gemm_text(gemm, dgrad.instance);
  gemm.fast_accum =
      ir::dtype_is_fp8(gemm.a.dtype) && b.options().fp8_backward_fast_accum && !block_scaled(gemm);
  b.add_gemm(g, what, std::move(gemm));
}

void emit_wgrad(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::LinearWgrad});
  const ir::Operation& wgrad = *g.parts.front();
  GemmStep gemm;
  gemm.role = GemmRole::Wgrad;
  const ValueId dy = wgrad.operands.at(0), x = wgrad.operands.at(1);
  gemm.a = gemm_operand(b, dy, wgrad);
  gemm.b = gemm_operand(b, x, wgrad);
  gemm.a_transposed = !transposed_copy(b, dy);  // dy [k, m], or dy^T [m, k] (FP8)
  gemm.b_transposed = transposed_copy(b, x);    // x [k, n], or x^T [n, k] (FP8)
  gemm.m = ir::attr_int(wgrad.attrs, "out");
  gemm.n = ir::attr_int(wgrad.attrs, "in");
  // k = tokens: the rows of x, whose transposed copy is [in, rows...].
  const ir::Shape& xs = b.value(x).type.shape;
  gemm.k =
      gemm.b_transposed ? shape_product(xs, 1, xs.size()) : shape_product(xs, 0, xs.size() - 1);
  set_output(b, gemm, wgrad.results.at(0), wgrad);
  const std::string what = gemm_text(gemm, wgrad.instance);
  gemm.fast_accum =
      ir::dtype_is_fp8(gemm.a.dtype) && b.options().fp8_backward_fast_accum && !block_scaled(gemm);
  b.add_gemm(g, what, std::move(gemm));
}

}  // namespace opfuse::codegen::emitters
