// Group emitters: one IR op, or one fused group, becomes launches of template kernels, a cuBLASLt
// GEMM, or nothing (an alias). Note "Kernels by parts": the emitter is chosen by the kinds of the
// group's parts (aliases by family), never by its pattern's name, so a new pattern whose parts fit
// a known kernel shape needs no codegen change. docs/codegen.md lists the shapes.

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "codegen/emit_groups.h"
#include "codegen/kernel_templates.h"
#include "ir/kernel_shapes.h"
#include "ir/pointwise_ops.h"
#include "support/assert.h"

namespace opfuse::codegen {

namespace emitters {

const ir::Operation* find_part(const Group& g, bool (*is)(OpKind)) {
  for (const ir::Operation* p : g.parts)
    if (is(p->kind)) return p;
  return nullptr;
}

std::string spell(DType d) { return std::string(cuda_dtype_spelling(d)); }
std::string spell(bool b) { return b ? "true" : "false"; }
std::string_view name_of(DType d) { return ir::dtype_name(d); }
std::string_view name_of(OpKind k) { return ir::op_info(k).name; }

SymExpr rows_of(const ir::Value& v) {
  return shape_product(v.type.shape, 0, v.type.shape.empty() ? 0 : v.type.shape.size() - 1);
}

int64_t width_of(const SequenceBuilder& b, const ir::Operation& at, const ir::Value& v) {
  if (v.type.shape.empty() || v.type.shape.back().is_symbolic()) {
    b.fail(at, fmt::format("'{}' ({}) needs a known last dimension for its GPU kernel, got {}",
                           name_of(at.kind), at.instance, ir::type_string(v.type)));
  }
  return v.type.shape.back().size;
}

void require_vector_width(const SequenceBuilder& b, const ir::Operation& at, int64_t width,
                          DType input, std::string_view kernel) {
  const int vector = rules::vector_elems(ir::dtype_bytes(input));
  if (width % vector != 0) {
    b.fail(
        at,
        fmt::format("'{}' ({}): the {} kernel reads 16-byte vectors of {} ({} elements), but "
                    "the row width {} is not a multiple of {}",
                    name_of(at.kind), at.instance, kernel, name_of(input), vector, width, vector),
        fmt::format("pad the width to a multiple of {}", vector));
  }
}

bool current_scaling(const SequenceBuilder& b, int q) {
  return q >= 0 && b.seq().quantizers.at(size_t(q)).spec.scaling == plan::ScalingKind::Current;
}

// Whether the amax of a cast's whole input must be measured before it: current scaling, and
// NVFP4's tensor scale (except over a Hadamard-transformed copy, whose amax is the transformed
// values', measured by a kernel of its own).
bool measures_input_amax(const SequenceBuilder& b, const ir::Operation& cast) {
  if (cast.quantizer < 0) return false;
  const plan::QuantSpec& spec = b.seq().quantizers.at(size_t(cast.quantizer)).spec;
  if (spec.scaling == plan::ScalingKind::Current) return true;
  return spec.nvfp4() && !(spec.rht && ir::attr_bool(cast.attrs, "columnwise"));
}

DType quantizer_format(const SequenceBuilder& b, const ir::Operation& cast) {
  OPFUSE_ASSERT(cast.quantizer >= 0, "cast_fp8 '{}' has no quantizer", cast.instance);
  return b.seq().quantizers.at(size_t(cast.quantizer)).format();
}

CastOutputs cast_outputs(const SequenceBuilder& b, const ir::Operation& cast) {
  CastOutputs out;
  size_t next = 0;
  if (ir::attr_bool(cast.attrs, "rowwise")) out.rowwise = b.buffer(cast.results.at(next++), cast);
  if (ir::attr_bool(cast.attrs, "columnwise"))
    out.columnwise = b.buffer(cast.results.at(next), cast);
  return out;
}

std::string fp8_output_text(DType out, bool transposed) {
  return fmt::format("{}{}", name_of(out), transposed ? " + transposed copy" : "");
}

SymExpr tile_grid_y(const SymExpr& rows) {
  if (const std::optional<int64_t> known = rows.value()) return rules::tile_grid_y(*known);
  return min_of(ceil_div(rows, rules::kTileRows), rules::kTileMaxGridY);
}

GridRule tile_grid(const SymExpr& rows, int64_t cols) {
  return GridRule{
      "tile", rules::tile_grid_x(int(cols)), tile_grid_y(rows), {{"rows", rows}, {"cols", cols}}};
}

int epilogue_output(SequenceBuilder& b, ValueId v, const std::string& what) {
  if (b.is_materialized(v)) return b.existing_buffer(v);
  const ir::Value& value = b.value(v);
  std::vector<SymExpr> shape;
  for (const ir::Dim& d : value.type.shape) shape.push_back(dim_expr(d));
  return b.add_workspace(what, value.type.dtype, std::move(shape));
}

[[noreturn]] void no_kernel(const SequenceBuilder& b, const Group& g) {
  if (g.pattern.empty()) {
    const ir::Operation& op = *g.op;
    b.fail(op, fmt::format("'{}' ({}) has no GPU kernel: opfuse has no CUDA template for it",
                           name_of(op.kind), op.instance));
  }
  std::string parts;
  for (const ir::Operation* p : g.parts)
    parts += fmt::format("{}{} ({})", parts.empty() ? "" : ", ", name_of(p->kind), p->instance);
  b.fail(*g.op,
         fmt::format("fused group '{}' [{}] has no GPU kernel: no template or GEMM epilogue runs "
                     "these parts together",
                     g.pattern, parts),
         "build with --disable-pass fuse-forward (or fuse-backward) and report the pattern");
}

void require_only(const SequenceBuilder& b, const Group& g, std::initializer_list<OpKind> kinds) {
  if (!g.only(kinds)) no_kernel(b, g);
}

void require_only(const SequenceBuilder& b, const Group& g, bool (*is)(OpKind),
                  std::initializer_list<OpKind> others) {
  for (const ir::Operation* p : g.parts)
    if (!is(p->kind) && std::find(others.begin(), others.end(), p->kind) == others.end())
      no_kernel(b, g);
}

void emit_column_reduce(SequenceBuilder& b, const Group& g, const std::string& what,
                        std::vector<int> partials, std::vector<int> outputs,
                        const SymExpr& num_partials, int64_t cols, DType out) {
  const int arrays = int(partials.size());
  partials.resize(2, -1);
  outputs.resize(2, -1);
  GridRule grid{"column_reduce",
                rules::column_reduce_grid_x(int(cols)),
                arrays,
                {{"cols", cols}, {"arrays", arrays}}};
  b.add_launch(
      g, what, "reduce_column_partials", {spell(out)}, std::move(grid), rules::kColumnReduceThreads,
      0,
      {bind_buffers("partials", std::move(partials), false),
       bind_buffers("outputs", std::move(outputs), true), bind_int("num_partials", num_partials),
       bind_int("cols", cols), bind_int("accumulate", 0)});
}

ParamBinding bind_scale_record(int quantizer) {
  return quantizer >= 0 ? bind_records("scale_record", {quantizer}) : bind_null("scale_record");
}

ParamBinding bind_amax(int folded, int measured) {
  if (measured >= 0) return bind_quantizer("amax", measured, QuantizerValue::RunningAmax);
  return bind_quantizer("amax", folded, QuantizerValue::Amax);
}

void emit_current_amax(SequenceBuilder& b, const Group& g, const ir::Operation& cast, ValueId x,
                       int quantizer) {
  if (b.measured_amax(x) == quantizer) return;
  const ir::Value& xv = b.value(x);
  const std::string& name = b.seq().quantizers.at(size_t(quantizer)).name;
  const SymExpr count = element_count_expr(xv.type.shape);
  const int vector = rules::vector_elems(ir::dtype_bytes(xv.type.dtype));
  GridRule grid{"amax",
                min_of(ceil_div(count, int64_t(vector) * 2048), SymExpr::symbol(kNumSmsSymbol) * 4),
                1,
                {{"count", count}}};
  b.add_launch(g,
               fmt::format("amax of {} and the scale of quantizer {} (current scaling)",
                           name_of(xv.type.dtype), name),
               "amax_reduce", {spell(xv.type.dtype)}, std::move(grid), rules::kAmaxThreads, 0,
               {bind_in("x", b.buffer(x, cast)), bind_int64("count", count),
                bind_amax(-1, quantizer), bind_scale_record(quantizer)});
}

int measure_for_cast(SequenceBuilder& b, const Group& g, ValueId produced) {
  if (!b.fold_current_amax()) return -1;  // plan pass disabled: an amax_reduce per cast instead
  if (ir::dtype_is_fp8(b.value(produced).type.dtype) || b.measured_amax(produced) >= 0) return -1;
  for (const ir::Operation& op : b.seq().ops) {
    if ((op.kind == OpKind::CastFp8 || op.kind == OpKind::Quantize ||
         op.kind == OpKind::EmulatedCast) &&
        measures_input_amax(b, op) && op.phase == g.op->phase && !op.operands.empty() &&
        op.operands.front() == produced) {
      b.mark_amax_measured(produced, op.quantizer);
      return op.quantizer;
    }
  }
  return -1;
}

int folded_cast_quantizer(const SequenceBuilder& b, const Group& g, const ir::Operation& cast,
                          ValueId produced) {
  if (cast.operands.at(0) != produced) no_kernel(b, g);
  if (current_scaling(b, cast.quantizer)) {
    b.fail(cast,
           fmt::format("cast_fp8 ({}) is fused into '{}', but current scaling needs the amax of "
                       "the whole tensor before the cast",
                       cast.instance, g.pattern),
           "fusion passes must not fold casts under current scaling");
  }
  if (b.is_materialized(produced)) {
    b.fail(cast, fmt::format("fused group '{}' needs {} in high precision and in FP8; one kernel "
                             "writes only one of them",
                             g.pattern, cast.instance));
  }
  return cast.quantizer;
}

KernelOutputs kernel_outputs(SequenceBuilder& b, const Group& g, const ir::Operation* cast,
                             ValueId produced, const ir::Operation& producer) {
  KernelOutputs out;
  if (cast) {
    out.quantizer = folded_cast_quantizer(b, g, *cast, produced);
    out.dtype = quantizer_format(b, *cast);
    out.copies = cast_outputs(b, *cast);
  } else {
    out.dtype = b.value(produced).type.dtype;
    out.copies.rowwise = b.buffer(produced, producer);
  }
  return out;
}

}  // namespace emitters

void emit_group(SequenceBuilder& b, const Group& g) {
  using namespace emitters;
  // The shape comes from the kinds of the parts (ir/kernel_shapes.h), the table a declared fusion
  // is checked against when it is declared. Aliases by family (make_extra_output, identity,
  // reshape): a new op that only views its operand needs nothing here. The other families hold
  // kinds that lower differently (the Gemm family's fprop, dgrad and wgrad; the Cast family's
  // cast_fp8 and quantize), so shapes are told apart by kind.
  std::vector<OpKind> kinds;
  for (const ir::Operation* p : g.parts) kinds.push_back(p->kind);
  const ir::KernelShapeInfo* shape = ir::select_kernel_shape(kinds);
  if (shape == nullptr) no_kernel(b, g);
  switch (shape->shape) {
    case ir::KernelShape::Alias:
      return emit_alias(b, g);
    case ir::KernelShape::Fprop:
      return emit_fprop(b, g);
    case ir::KernelShape::Dgrad:
      return emit_dgrad(b, g);
    case ir::KernelShape::Wgrad:
      return emit_wgrad(b, g);
    case ir::KernelShape::NormForward:
      return emit_norm_fwd(b, g);
    case ir::KernelShape::NormBackward:
      return emit_norm_bwd(b, g);
    case ir::KernelShape::RowForward:
      return emit_row_fwd(b, g);
    case ir::KernelShape::RowBackward:
      return emit_row_bwd(b, g);
    case ir::KernelShape::ActivationForward:
      return emit_activation_fwd(b, g);
    case ir::KernelShape::ActivationBackward:
      return emit_activation_bwd(b, g);
    case ir::KernelShape::BiasAdd:
      return emit_bias_add(b, g);
    case ir::KernelShape::Cast:
      return emit_cast(b, g);
    case ir::KernelShape::Fp8Transpose:
      return emit_fp8_transpose(b, g);
    case ir::KernelShape::EmulatedCast:
      return emit_emulated_cast(b, g);
    case ir::KernelShape::TensorStats:
      return emit_tensor_stats(b, g);
    case ir::KernelShape::TensorCapture:
      return emit_tensor_capture(b, g);
    case ir::KernelShape::Collective:
      return emit_collective(b, g);
    case ir::KernelShape::ModifyTensor:
      return emit_modify_tensor(b, g);
    case ir::KernelShape::Dbias:
      return emit_dbias(b, g);
    case ir::KernelShape::ConstantScale:
      return emit_constant_scale(b, g);
    case ir::KernelShape::Quantize:
      return emit_quantize(b, g);
    case ir::KernelShape::Dropout:
      return emit_dropout(b, g);
    case ir::KernelShape::DropoutBackward:
      return emit_dropout_bwd(b, g);
  }
  no_kernel(b, g);
}

}  // namespace opfuse::codegen
