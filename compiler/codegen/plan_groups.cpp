// Group emitters: one IR op, or one fused group, becomes launches of template kernels, a cuBLASLt
// GEMM, or nothing (an alias). Note "Kernels by parts": the emitter is chosen by the kinds of the
// group's parts, never by its pattern's name, so a new pattern whose parts fit a known kernel
// shape needs no codegen change. docs/codegen.md lists the shapes.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "../../templates/common/launch_rules.h"
#include "codegen/kernel_templates.h"
#include "codegen/plan_builder.h"
#include "ir/pointwise_ops.h"
#include "support/assert.h"

namespace opfuse::codegen {

namespace {

namespace rules = opfuse::launch;
using ir::DType;
using ir::OpKind;
using ir::ValueId;

// Pointwise ops are selected by what they are (ir::is_pointwise...), never by a list of kinds,
// so a new one needs nothing here.
const ir::Operation* find_part(const Group& g, bool (*is)(OpKind)) {
  for (const ir::Operation* p : g.parts)
    if (is(p->kind)) return p;
  return nullptr;
}

// Every part is a kind `is` accepts or one of `others`.
void require_only(const SequenceBuilder& b, const Group& g, bool (*is)(OpKind),
                  std::initializer_list<OpKind> others);

std::string spell(DType d) { return std::string(cuda_dtype_spelling(d)); }
std::string spell(bool b) { return b ? "true" : "false"; }
std::string_view name_of(DType d) { return ir::dtype_name(d); }
std::string_view name_of(OpKind k) { return ir::op_info(k).name; }

SymExpr rows_of(const ir::Value& v) {
  return shape_product(v.type.shape, 0, v.type.shape.empty() ? 0 : v.type.shape.size() - 1);
}

// The known last dimension of `v` (the width every template is specialized or checked on).
int64_t width_of(const SequenceBuilder& b, const ir::Operation& at, const ir::Value& v) {
  if (v.type.shape.empty() || v.type.shape.back().is_symbolic()) {
    b.fail(at, fmt::format("'{}' ({}) needs a known last dimension for its GPU kernel, got {}",
                           name_of(at.kind), at.instance, ir::type_string(v.type)));
  }
  return v.type.shape.back().size;
}

// Tiled and norm kernels move 16-byte vectors: a row must be a whole number of them.
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

// Whether quantizer `q` derives its scale from this tensor's amax before the cast (its spec, not
// the sequence's recipe: an override may make one tensor current-scaled under delayed scaling).
bool current_scaling(const SequenceBuilder& b, int q) {
  return q >= 0 && b.seq().quantizers.at(size_t(q)).spec.scaling == plan::ScalingKind::Current;
}

DType quantizer_format(const SequenceBuilder& b, const ir::Operation& cast) {
  OPFUSE_ASSERT(cast.quantizer >= 0, "cast_fp8 '{}' has no quantizer", cast.instance);
  return b.seq().quantizers.at(size_t(cast.quantizer)).format();
}

// The cast's row-wise and transposed results (-1 where it does not make them).
struct CastOutputs {
  int rowwise = -1;
  int columnwise = -1;
};
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

// Known rows take the launch rule itself; symbolic rows spell its formula for run time (rows are
// never 0 there, so the rule's max with 1 is left out).
SymExpr tile_grid_y(const SymExpr& rows) {
  if (const std::optional<int64_t> known = rows.value()) return rules::tile_grid_y(*known);
  return min_of(ceil_div(rows, rules::kTileRows), rules::kTileMaxGridY);
}

GridRule tile_grid(const SymExpr& rows, int64_t cols) {
  return GridRule{
      "tile", rules::tile_grid_x(int(cols)), tile_grid_y(rows), {{"rows", rows}, {"cols", cols}}};
}

// A value a GEMM epilogue writes: its buffer, or scratch when no one outside the group reads it.
int epilogue_output(SequenceBuilder& b, ValueId v, const std::string& what) {
  if (b.is_materialized(v)) return b.existing_buffer(v);
  const ir::Value& value = b.value(v);
  std::vector<SymExpr> shape;
  for (const ir::Dim& d : value.type.shape)
    shape.push_back(d.is_symbolic() ? SymExpr::symbol(d.symbol) : SymExpr(d.size));
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

// reduce_column_partials: the fixed-order second stage of every dbias/dgamma/dbeta sum.
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

// The scale_record field: the quantizer whose scale the kernel's last block derives, or null.
ParamBinding bind_scale_record(int quantizer) {
  return quantizer >= 0 ? bind_records("scale_record", {quantizer}) : bind_null("scale_record");
}

// The amax field of a kernel that casts to FP8 itself under delayed scaling (`folded`: history
// slot 0), or measures a current-scaling amax (`measured`: the running max its scale_record's
// last block takes); null for neither.
ParamBinding bind_amax(int folded, int measured) {
  if (measured >= 0) return bind_quantizer("amax", measured, QuantizerValue::RunningAmax);
  return bind_quantizer("amax", folded, QuantizerValue::Amax);
}

// Current scaling (note "Current scaling" in docs/codegen.md): before the cast (cast_fp8 or
// quantize: `cast`) of `x`, the amax of the whole of x and the scale derived from it, unless the
// kernel that produced x measured them (measure_for_cast); the cast itself then tracks no amax.
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

// Current scaling: when `produced` (which this group's kernel writes whole, in high precision) is
// the input of an unfused cast_fp8 or quantize of the same phase, the kernel measures the amax
// for that cast's quantizer and its last block derives the scale (note "Current scaling"). Returns
// the quantizer; -1 when there is no such cast.
int measure_for_cast(SequenceBuilder& b, const Group& g, ValueId produced) {
  if (ir::dtype_is_fp8(b.value(produced).type.dtype) || b.measured_amax(produced) >= 0) return -1;
  for (const ir::Operation& op : b.seq().ops) {
    if ((op.kind == OpKind::CastFp8 || op.kind == OpKind::Quantize) &&
        current_scaling(b, op.quantizer) && op.phase == g.op->phase && !op.operands.empty() &&
        op.operands.front() == produced) {
      b.mark_amax_measured(produced, op.quantizer);
      return op.quantizer;
    }
  }
  return -1;
}

// A cast folded into a producing kernel: only under delayed scaling (its amax is this step's
// history slot 0); the producer's own result must not be needed in high precision too.
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

// ---- elementwise and normalization kernels ------------------------------------------------------

void emit_cast(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::CastFp8, OpKind::BiasGrad});
  const ir::Operation& cast = *g.find({OpKind::CastFp8});
  const ir::Operation* dbias = g.find({OpKind::BiasGrad});
  const ValueId x = cast.operands.at(0);
  if (dbias && dbias->operands.at(0) != x) no_kernel(b, g);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype, out = quantizer_format(b, cast);
  const int64_t cols = width_of(b, cast, xv);
  require_vector_width(b, cast, cols, in, "cast_transpose");
  const SymExpr rows = rows_of(xv);
  const CastOutputs y = cast_outputs(b, cast);
  const bool transpose = y.columnwise >= 0;
  int amax_quantizer = cast.quantizer;
  if (current_scaling(b, cast.quantizer)) {
    emit_current_amax(b, g, cast, x, cast.quantizer);
    amax_quantizer = -1;  // measured already
  }
  GridRule grid = tile_grid(rows, cols);
  const SymExpr partial_rows = grid.y;
  const int partial =
      dbias ? b.add_workspace(dbias->instance + ".dbias_partial", DType::FP32, {partial_rows, cols})
            : -1;
  auto what = [&](bool with_copy) {
    return fmt::format("cast {} -> {}{}", name_of(in), fp8_output_text(out, with_copy),
                       dbias ? " + dbias partial sums" : "");
  };
  WithoutTranspose plain{what(false), grid, rules::kTileThreads, 0};  // tiles launch alike
  b.add_launch(
      g, what(transpose), "cast_transpose",
      {spell(in), spell(out), spell(transpose), spell(dbias != nullptr)}, std::move(grid),
      rules::kTileThreads, 0,
      {bind_in("x", b.buffer(x, cast)), bind_out("y", y.rowwise), bind_copy("y_t", y.columnwise),
       bind_quantizer("scale", cast.quantizer, QuantizerValue::Scale),
       bind_quantizer("amax", amax_quantizer, QuantizerValue::Amax),
       bind_out("dbias_partial", partial), bind_int("rows", rows), bind_int("cols", cols)},
      std::move(plain));
  if (dbias) {
    const ValueId db = dbias->results.at(0);
    emit_column_reduce(b, g, "dbias = column sums of the partials", {partial},
                       {b.buffer(db, *dbias)}, partial_rows, cols, b.value(db).type.dtype);
  }
}

void emit_dbias(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::BiasGrad});
  const ir::Operation& op = *g.parts.front();
  const ValueId dy = op.operands.at(0);
  const ir::Value& dyv = b.value(dy);
  const int64_t cols = width_of(b, op, dyv);
  require_vector_width(b, op, cols, dyv.type.dtype, "dbias_partial");
  const SymExpr rows = rows_of(dyv);
  GridRule grid = tile_grid(rows, cols);
  const SymExpr partial_rows = grid.y;
  const int partial =
      b.add_workspace(op.instance + ".dbias_partial", DType::FP32, {partial_rows, cols});
  b.add_launch(g, fmt::format("dbias partial sums of {}", name_of(dyv.type.dtype)), "dbias_partial",
               {spell(dyv.type.dtype)}, std::move(grid), rules::kTileThreads, 0,
               {bind_in("dy", b.buffer(dy, op)), bind_out("dbias_partial", partial),
                bind_int("rows", rows), bind_int("cols", cols)});
  const ValueId db = op.results.at(0);
  emit_column_reduce(b, g, "dbias = column sums of the partials", {partial}, {b.buffer(db, op)},
                     partial_rows, cols, b.value(db).type.dtype);
}

// bias, add_extra_input and grad_add (y = x + bias + residual), with an optional FP8 cast.
void emit_bias_add(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::Bias, OpKind::AddExtraInput, OpKind::GradAdd, OpKind::CastFp8});
  const ir::Operation& first = *g.parts.front();
  const ValueId x = first.operands.at(0);
  ValueId chain = x, bias = ir::kNoValue, residual = ir::kNoValue;
  const ir::Operation* cast = nullptr;
  for (const ir::Operation* p : g.parts) {
    const bool reads_chain =
        std::find(p->operands.begin(), p->operands.end(), chain) != p->operands.end();
    if (!reads_chain) no_kernel(b, g);
    if (p->kind == OpKind::CastFp8) {
      if (cast) no_kernel(b, g);
      cast = p;
      continue;
    }
    if (cast) no_kernel(b, g);  // the cast ends the chain
    ValueId& slot = p->kind == OpKind::Bias ? bias : residual;
    if (slot != ir::kNoValue) no_kernel(b, g);
    slot = p->kind == OpKind::Bias
               ? p->operands.at(1)
               : (p->operands.at(0) == chain ? p->operands.at(1) : p->operands.at(0));
    chain = p->results.at(0);
  }
  if (chain == x) no_kernel(b, g);  // a lone cast goes to emit_cast
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const int64_t cols = width_of(b, first, xv);
  require_vector_width(b, first, cols, in, "bias_add");
  const SymExpr rows = rows_of(xv);
  DType out = b.value(chain).type.dtype;
  int quantizer = -1;
  CastOutputs y{-1, -1};
  if (cast) {
    quantizer = folded_cast_quantizer(b, g, *cast, chain);
    out = quantizer_format(b, *cast);
    y = cast_outputs(b, *cast);
  } else {
    y.rowwise = b.buffer(chain, *g.parts.back());
  }
  const bool transpose = y.columnwise >= 0;
  const int measured = cast ? -1 : measure_for_cast(b, g, chain);
  std::string what = "y = x";
  if (bias != ir::kNoValue) what += " + bias";
  if (residual != ir::kNoValue) what += " + residual";
  auto text = [&](bool with_copy) {
    return fmt::format("{} ({} -> {})", what, name_of(in), fp8_output_text(out, with_copy));
  };
  b.add_launch(
      g, text(transpose), "bias_add",
      {spell(in), spell(out), spell(bias != ir::kNoValue), spell(residual != ir::kNoValue),
       spell(transpose)},
      tile_grid(rows, cols), rules::kTileThreads, 0,
      {bind_in("x", b.buffer(x, first)),
       bind_in("bias", bias == ir::kNoValue ? -1 : b.buffer(bias, first)),
       bind_in("residual", residual == ir::kNoValue ? -1 : b.buffer(residual, first)),
       bind_out("y", y.rowwise), bind_copy("y_t", y.columnwise),
       bind_quantizer("scale", quantizer, QuantizerValue::Scale), bind_amax(quantizer, measured),
       bind_scale_record(measured), bind_int("rows", rows), bind_int("cols", cols)},
      WithoutTranspose{text(false), tile_grid(rows, cols), rules::kTileThreads, 0});
}

void emit_norm_fwd(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::LayerNorm, OpKind::RMSNorm, OpKind::CastFp8});
  const ir::Operation& norm = *g.find({OpKind::LayerNorm, OpKind::RMSNorm});
  const ir::Operation* cast = g.find({OpKind::CastFp8});
  if (g.parts.front() != &norm) no_kernel(b, g);
  const bool rms = norm.kind == OpKind::RMSNorm;
  const ValueId x = norm.operands.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const int64_t hidden = ir::attr_int(norm.attrs, "size");
  require_vector_width(b, norm, hidden, in, name_of(norm.kind));
  const ValueId y_value = norm.results.at(0);
  DType out = in;
  int quantizer = -1;
  CastOutputs y{-1, -1};
  if (cast) {
    quantizer = folded_cast_quantizer(b, g, *cast, y_value);
    out = quantizer_format(b, *cast);
    y = cast_outputs(b, *cast);
  } else {
    y.rowwise = b.buffer(y_value, norm);
  }
  const bool transpose = y.columnwise >= 0;
  const int bytes = ir::dtype_bytes(in);
  if (transpose &&
      rules::norm_fwd_dynamic_smem_bytes(int(hidden), true) > rules::kMaxDynamicSharedBytes) {
    b.fail(norm, fmt::format("'{}' ({}): rows of {} elements are too wide to write the transposed "
                             "FP8 copy from the norm kernel (shared memory)",
                             name_of(norm.kind), norm.instance, hidden));
  }
  // Saved statistics are extra results: layernorm (y, mean, rstd), rmsnorm (y, rstd).
  const size_t rstd_at = rms ? 1 : 2;
  const int mean = !rms && norm.results.size() > 1 ? b.buffer(norm.results[1], norm) : -1;
  const int rstd = norm.results.size() > rstd_at ? b.buffer(norm.results[rstd_at], norm) : -1;
  const SymExpr rows = rows_of(xv);
  struct Shape {
    GridRule grid;
    int block = 0;
    int smem = 0;
  };
  auto shape = [&](bool with_copy) {
    Shape out_shape;
    out_shape.block = rules::norm_fwd_block_threads(int(hidden), bytes, with_copy);
    out_shape.smem = rules::norm_fwd_dynamic_smem_bytes(int(hidden), with_copy);
    if (with_copy) {
      // One block per SM: its staged tile fills shared memory.
      const int tile_rows = rules::norm_transpose_tile_rows(int(hidden));
      out_shape.grid = {"norm_fwd_transpose",
                        min_of(ceil_div(rows, tile_rows), SymExpr::symbol(kNumSmsSymbol)),
                        1,
                        {{"rows", rows}, {"tile_rows", tile_rows}}};
    } else {
      const int rows_per_block = rules::norm_fwd_rows_per_block(int(hidden), bytes, false);
      const int resident =
          rules::min_blocks(out_shape.block, rules::norm_fwd_register_budget(rms, false));
      out_shape.grid = {
          "norm_fwd",
          min_of(ceil_div(rows, rows_per_block), SymExpr::symbol(kNumSmsSymbol) * resident),
          1,
          {{"rows", rows}, {"rows_per_block", rows_per_block}, {"blocks_per_sm", resident}}};
    }
    return out_shape;
  };
  auto what = [&](bool with_copy) {
    return fmt::format("{} {} -> {}", name_of(norm.kind), name_of(in),
                       fp8_output_text(out, with_copy));
  };
  Shape launch = shape(transpose), plain = shape(false);
  const int measured = cast ? -1 : measure_for_cast(b, g, y_value);
  const std::string family = rms ? "rmsnorm_fwd" : "layernorm_fwd";
  const bool zero_centered = ir::attr_bool(norm.attrs, "zero_centered_gamma");
  b.add_launch(
      g, what(transpose), family,
      {spell(in), spell(out), std::to_string(hidden), spell(zero_centered), spell(transpose)},
      std::move(launch.grid), launch.block, launch.smem,
      {bind_in("x", b.buffer(x, norm)), bind_in("gamma", b.buffer(norm.operands.at(1), norm)),
       bind_in("beta", rms ? -1 : b.buffer(norm.operands.at(2), norm)), bind_out("y", y.rowwise),
       bind_copy("y_t", y.columnwise), bind_quantizer("scale", quantizer, QuantizerValue::Scale),
       bind_amax(quantizer, measured), bind_scale_record(measured), bind_out("mean", mean),
       bind_out("rstd", rstd), bind_float("epsilon", ir::attr_float(norm.attrs, "eps")),
       bind_int("rows", rows)},
      WithoutTranspose{what(false), std::move(plain.grid), plain.block, plain.smem});
}

void emit_norm_bwd(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::LayerNormBackward, OpKind::RMSNormBackward, OpKind::GradAdd});
  const ir::Operation& norm = *g.find({OpKind::LayerNormBackward, OpKind::RMSNormBackward});
  const ir::Operation* add = g.find({OpKind::GradAdd});
  const bool rms = norm.kind == OpKind::RMSNormBackward;
  // Operands: (dy, x, gamma, mean, rstd) for LayerNorm, (dy, x, gamma, rstd) for RMSNorm.
  const ValueId dy = norm.operands.at(0), x = norm.operands.at(1), gamma = norm.operands.at(2);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const int64_t hidden = ir::attr_int(norm.attrs, "size");
  require_vector_width(b, norm, hidden, in, name_of(norm.kind));
  ValueId dx = norm.results.at(0), dresidual = ir::kNoValue;
  if (add) {
    if (add->operands.size() != 2 || (add->operands[0] != dx && add->operands[1] != dx))
      no_kernel(b, g);
    dresidual = add->operands[0] == dx ? add->operands[1] : add->operands[0];
    dx = add->results.at(0);
  }
  const int bytes = ir::dtype_bytes(in);
  const int block = rules::norm_bwd_block_threads(int(hidden), bytes);
  const int rows_per_block = rules::norm_bwd_rows_per_block(int(hidden), bytes);
  const int resident = rules::min_blocks(block, rules::kNormBwdRegisterBudget);
  const SymExpr grid_x = SymExpr::symbol(kNumSmsSymbol) * resident;
  const SymExpr partial_rows = grid_x * rows_per_block;
  const int dgamma_partial =
      b.add_workspace(norm.instance + ".dgamma_partial", DType::FP32, {partial_rows, hidden});
  const int dbeta_partial =
      rms ? -1
          : b.add_workspace(norm.instance + ".dbeta_partial", DType::FP32, {partial_rows, hidden});
  const SymExpr rows = rows_of(xv);
  GridRule grid{"norm_bwd",
                grid_x,
                1,
                {{"rows", rows}, {"rows_per_block", rows_per_block}, {"blocks_per_sm", resident}}};
  const bool zero_centered = ir::attr_bool(norm.attrs, "zero_centered_gamma");
  b.add_launch(
      g,
      fmt::format("{} {}{} + dgamma{} partial sums", name_of(norm.kind), name_of(in),
                  add ? " + residual gradient" : "", rms ? "" : "/dbeta"),
      rms ? "rmsnorm_bwd" : "layernorm_bwd",
      {spell(in), std::to_string(hidden), spell(zero_centered)}, std::move(grid), block, 0,
      {bind_in("dy", b.buffer(dy, norm)), bind_in("x", b.buffer(x, norm)),
       bind_in("gamma", b.buffer(gamma, norm)),
       bind_in("mean", rms ? -1 : b.buffer(norm.operands.at(3), norm)),
       bind_in("rstd", b.buffer(norm.operands.at(rms ? 3 : 4), norm)),
       bind_in("dresidual", dresidual == ir::kNoValue ? -1 : b.buffer(dresidual, *add)),
       bind_out("dx", b.buffer(dx, add ? *add : norm)), bind_out("dgamma_partial", dgamma_partial),
       bind_out("dbeta_partial", dbeta_partial), bind_int("rows", rows)});
  std::vector<int> outputs = {b.buffer(norm.results.at(1), norm)};
  std::vector<int> partials = {dgamma_partial};
  if (!rms) {
    outputs.push_back(b.buffer(norm.results.at(2), norm));
    partials.push_back(dbeta_partial);
  }
  emit_column_reduce(
      b, g,
      rms ? "dgamma = column sums of the partials" : "dgamma, dbeta = column sums of the partials",
      std::move(partials), std::move(outputs), partial_rows, hidden, b.value(gamma).type.dtype);
}

void emit_activation_fwd(SequenceBuilder& b, const Group& g) {
  require_only(b, g, ir::is_pointwise, {OpKind::CastFp8});
  const ir::Operation& act = *find_part(g, ir::is_pointwise);
  const ir::Operation* cast = g.find({OpKind::CastFp8});
  if (g.parts.front() != &act) no_kernel(b, g);
  const ir::PointwiseDef& def = *ir::pointwise_def(act.kind);
  const bool gated = def.gated;
  const ValueId x = act.operands.at(0), y_value = act.results.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const int64_t cols = width_of(b, act, b.value(y_value));  // the output width n
  require_vector_width(b, act, cols, in, name_of(act.kind));
  DType out = b.value(y_value).type.dtype;
  int quantizer = -1;
  CastOutputs y{-1, -1};
  if (cast) {
    quantizer = folded_cast_quantizer(b, g, *cast, y_value);
    out = quantizer_format(b, *cast);
    y = cast_outputs(b, *cast);
  } else {
    y.rowwise = b.buffer(y_value, act);
  }
  const bool transpose = y.columnwise >= 0;
  const SymExpr rows = rows_of(xv);
  const int measured = cast ? -1 : measure_for_cast(b, g, y_value);
  auto what = [&](bool with_copy) {
    return fmt::format("{} {} -> {}", name_of(act.kind), name_of(in),
                       fp8_output_text(out, with_copy));
  };
  b.add_launch(
      g, what(transpose), gated ? "gated_activation_fwd" : "activation_fwd",
      {ir::pointwise_functor_name(def, act.attrs), spell(in), spell(out), spell(transpose)},
      tile_grid(rows, cols), rules::kTileThreads, 0,
      {bind_in("x", b.buffer(x, act)), bind_out("y", y.rowwise), bind_copy("y_t", y.columnwise),
       bind_quantizer("scale", quantizer, QuantizerValue::Scale), bind_amax(quantizer, measured),
       bind_scale_record(measured), bind_int("rows", rows), bind_int("cols", cols)},
      WithoutTranspose{what(false), tile_grid(rows, cols), rules::kTileThreads, 0});
}

void emit_activation_bwd(SequenceBuilder& b, const Group& g) {
  require_only(b, g, ir::is_pointwise_backward, {OpKind::BiasGrad, OpKind::CastFp8});
  const ir::Operation& act = *find_part(g, ir::is_pointwise_backward);
  const ir::Operation* dbias = g.find({OpKind::BiasGrad});
  const ir::Operation* cast = g.find({OpKind::CastFp8});
  if (g.parts.front() != &act) no_kernel(b, g);
  const ir::PointwiseDef& forward = *ir::pointwise_def(act.kind);
  const bool gated = forward.gated;
  const ValueId dy = act.operands.at(0), x = act.operands.at(1), dx_value = act.results.at(0);
  const ir::Value& dyv = b.value(dy);
  const DType in = dyv.type.dtype;
  const int64_t cols = width_of(b, act, dyv);  // n, dy's width
  const int64_t dx_cols = gated ? 2 * cols : cols;
  require_vector_width(b, act, cols, in, name_of(act.kind));
  if (dbias && dbias->operands.at(0) != dx_value) no_kernel(b, g);
  DType out = b.value(dx_value).type.dtype;
  int quantizer = -1;
  CastOutputs dx{-1, -1};
  if (cast) {
    // The dbias sum reads dx inside the kernel, so only the cast's copies leave it.
    quantizer = folded_cast_quantizer(b, g, *cast, dx_value);
    out = quantizer_format(b, *cast);
    dx = cast_outputs(b, *cast);
  } else {
    dx.rowwise = b.buffer(dx_value, act);
  }
  const bool transpose = dx.columnwise >= 0;
  const SymExpr rows = rows_of(dyv);
  GridRule grid = tile_grid(rows, cols);
  const SymExpr partial_rows = grid.y;
  const int partial = dbias ? b.add_workspace(dbias->instance + ".dbias_partial", DType::FP32,
                                              {partial_rows, dx_cols})
                            : -1;
  const int measured = cast ? -1 : measure_for_cast(b, g, dx_value);
  b.add_launch(
      g,
      fmt::format("{} backward {} -> {}{}", forward.name, name_of(in),
                  fp8_output_text(out, transpose), dbias ? " + dbias partial sums" : ""),
      gated ? "gated_activation_bwd" : "activation_bwd",
      {ir::pointwise_functor_name(forward, act.attrs), spell(in), spell(out), spell(transpose),
       spell(dbias != nullptr)},
      std::move(grid), rules::kTileThreads, 0,
      {bind_in("dy", b.buffer(dy, act)), bind_in("x", b.buffer(x, act)), bind_out("dx", dx.rowwise),
       bind_copy("dx_t", dx.columnwise), bind_quantizer("scale", quantizer, QuantizerValue::Scale),
       bind_amax(quantizer, measured), bind_scale_record(measured),
       bind_out("dbias_partial", partial), bind_int("rows", rows), bind_int("cols", cols)});
  if (dbias) {
    const ValueId db = dbias->results.at(0);
    emit_column_reduce(b, g, "dbias = column sums of the partials", {partial},
                       {b.buffer(db, *dbias)}, partial_rows, dx_cols, b.value(db).type.dtype);
  }
}

void emit_alias(SequenceBuilder& b, const Group& g) {
  // make_extra_output, identity and reshape view their operand's memory: no step.
  for (const ir::Operation* p : g.parts) b.make_alias(p->results.at(0), p->operands.at(0));
}

// constant_scale, forward and backward alike (its backward is a constant_scale of dy).
void emit_constant_scale(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::ConstantScale});
  const ir::Operation& op = *g.parts.front();
  const ValueId x = op.operands.at(0), y = op.results.at(0);
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype, out = b.value(y).type.dtype;
  const int64_t cols = width_of(b, op, xv);
  require_vector_width(b, op, cols, in, "constant_scale");
  const SymExpr rows = rows_of(xv);
  const double factor = ir::attr_float(op.attrs, "scale");
  const bool backward = op.phase == ir::Phase::Backward;
  b.add_launch(g,
               fmt::format("{} = {} * {} ({} -> {})", backward ? "dx" : "y", factor,
                           backward ? "dy" : "x", name_of(in), name_of(out)),
               "constant_scale", {spell(in), spell(out), spell(false)}, tile_grid(rows, cols),
               rules::kTileThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_out("y", b.buffer(y, op)), bind_copy("y_t", -1),
                bind_null("scale"), bind_null("amax"), bind_float("factor", factor),
                bind_int("rows", rows), bind_int("cols", cols)});
}

// The user quantize op: fake quantization with the quantizer plan-quantization gave it (forward:
// the output quantizer; backward = true: the grad_input one). Without a quantizer (bf16 recipes,
// forward = false) it is the identity, an alias like make_extra_output.
void emit_quantize(SequenceBuilder& b, const Group& g) {
  require_only(b, g, {OpKind::Quantize});
  const ir::Operation& op = *g.parts.front();
  const ValueId x = op.operands.at(0), y = op.results.at(0);
  if (op.quantizer < 0) {
    b.make_alias(y, x);
    return;
  }
  const ir::Value& xv = b.value(x);
  const DType in = xv.type.dtype;
  const DType format = b.seq().quantizers.at(size_t(op.quantizer)).format();
  const int64_t cols = width_of(b, op, xv);
  require_vector_width(b, op, cols, in, "fake_quantize");
  const SymExpr rows = rows_of(xv);
  int amax_quantizer = op.quantizer;
  if (current_scaling(b, op.quantizer)) {
    emit_current_amax(b, g, op, x, op.quantizer);
    amax_quantizer = -1;  // measured already
  }
  b.add_launch(g,
               fmt::format("fake-quantize {} through {} (y = dequantize(quantize(x)))", name_of(in),
                           name_of(format)),
               "fake_quantize", {spell(in), spell(format)}, tile_grid(rows, cols),
               rules::kTileThreads, 0,
               {bind_in("x", b.buffer(x, op)), bind_out("y", b.buffer(y, op)),
                bind_quantizer("scale", op.quantizer, QuantizerValue::Scale),
                bind_quantizer("scale_inv", op.quantizer, QuantizerValue::ScaleInv),
                bind_quantizer("amax", amax_quantizer, QuantizerValue::Amax),
                bind_int("rows", rows), bind_int("cols", cols)});
}

// ---- GEMMs (note "Row-major GEMMs" in runtime/gpu/gemm_desc.h) ----------------------------------

GemmOperand gemm_operand(const SequenceBuilder& b, ValueId v, const ir::Operation& at) {
  const ir::Value& value = b.value(v);
  GemmOperand operand;
  operand.buffer = b.buffer(v, at);
  operand.dtype = value.type.dtype;
  if (value.quantizer >= 0) operand.scale_inv.quantizer = value.quantizer;
  operand.usage = b.is_columnwise_copy(v) ? CopyUsage::Columnwise : CopyUsage::Rowwise;
  return operand;
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
  gemm.fast_accum = ir::dtype_is_fp8(gemm.a.dtype) && b.options().fp8_fprop_fast_accum;
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
  gemm.fast_accum = ir::dtype_is_fp8(gemm.a.dtype) && b.options().fp8_backward_fast_accum;
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
  gemm.fast_accum = ir::dtype_is_fp8(gemm.a.dtype) && b.options().fp8_backward_fast_accum;
  b.add_gemm(g, what, std::move(gemm));
}

}  // namespace

void emit_group(SequenceBuilder& b, const Group& g) {
  if (g.only({OpKind::MakeExtraOutput, OpKind::Identity, OpKind::Reshape})) return emit_alias(b, g);
  if (g.find({OpKind::Linear})) return emit_fprop(b, g);
  if (g.find({OpKind::LinearDgrad})) return emit_dgrad(b, g);
  if (g.find({OpKind::LinearWgrad})) return emit_wgrad(b, g);
  if (g.find({OpKind::LayerNorm, OpKind::RMSNorm})) return emit_norm_fwd(b, g);
  if (g.find({OpKind::LayerNormBackward, OpKind::RMSNormBackward})) return emit_norm_bwd(b, g);
  if (find_part(g, ir::is_pointwise)) return emit_activation_fwd(b, g);
  if (find_part(g, ir::is_pointwise_backward)) return emit_activation_bwd(b, g);
  if (g.find({OpKind::Bias, OpKind::AddExtraInput, OpKind::GradAdd})) return emit_bias_add(b, g);
  if (g.find({OpKind::CastFp8})) return emit_cast(b, g);
  if (g.find({OpKind::BiasGrad})) return emit_dbias(b, g);
  if (g.find({OpKind::ConstantScale})) return emit_constant_scale(b, g);
  if (g.find({OpKind::Quantize})) return emit_quantize(b, g);
  no_kernel(b, g);
}

}  // namespace opfuse::codegen
