#include "passes/plan_quantization.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "ir/rewrite.h"
#include "support/assert.h"

namespace opfuse::passes {

namespace {

using namespace opfuse::ir;

bool is_gradient(QuantizerRole role) {
  return role == QuantizerRole::GradOutput || role == QuantizerRole::GradInput;
}

}  // namespace

plan::QuantSpec recipe_spec(const Recipe& r, QuantizerRole role,
                            std::optional<plan::GemmRole> gemm) {
  plan::QuantSpec spec;
  spec.format = is_gradient(role) && r.format == Fp8Format::Hybrid ? DType::E5M2 : DType::E4M3;
  if (r.kind == RecipeKind::Mxfp8BlockScaling) {
    // TE's MXFP8BlockScaling: 32 elements per E8M0 scale along the GEMM's K (row-wise 1 x 32,
    // column-wise 32 x 1); the copies are decoded for the BF16 GEMMs Hopper runs.
    spec.scaling = plan::ScalingKind::MicroScaled;
    spec.block = {1, 32};
    spec.scale_dtype = plan::ScaleDType::E8M0;
  } else if (r.kind == RecipeKind::Nvfp4BlockScaling) {
    // TE's NVFP4BlockScaling: E2M1 with an E4M3 scale per 16 elements (weights: 16 x 16) and a
    // per-tensor FP32 scale; the Hadamard transform on the wgrad copies of inputs and gradients,
    // stochastic rounding of gradients.
    spec.scaling = plan::ScalingKind::MicroScaled;
    spec.format = DType::E2M1;
    spec.block = {role == QuantizerRole::Weight && r.w_2d ? 16 : 1, 16};
    spec.scale_dtype = plan::ScaleDType::E4M3;
    spec.rht = r.rht && gemm == plan::GemmRole::Wgrad &&
               (role == QuantizerRole::Input || role == QuantizerRole::GradOutput);
    spec.stochastic_rounding = r.stochastic_rounding && is_gradient(role);
    spec.seed = spec.stochastic_rounding ? r.seed : 0;
  } else if (r.kind == RecipeKind::Float8BlockScaling) {
    // TE's Float8BlockScaling: each tensor's blocks by its role; the quantize op's tensors (output,
    // grad_input) take 1 x 128 blocks like the activations they are.
    const int dims = role == QuantizerRole::Weight       ? r.w_block
                     : role == QuantizerRole::GradOutput ? r.grad_block
                     : role == QuantizerRole::Input      ? r.x_block
                                                         : 1;
    spec.scaling = dims == 2 ? plan::ScalingKind::Block2D : plan::ScalingKind::Block1D;
    spec.block = {dims == 2 ? 128 : 1, 128};
    spec.scale_dtype = plan::ScaleDType::FP32;
    spec.epsilon = r.amax_epsilon;
    spec.power_of_2_scale = r.power_of_2_scale;
  } else if (r.kind == RecipeKind::CurrentScaling) {
    spec.scaling = plan::ScalingKind::Current;
    spec.epsilon = r.amax_epsilon;
    spec.power_of_2_scale = r.power_of_2_scale;
  } else {
    spec.scaling = plan::ScalingKind::Delayed;
    spec.history_length = r.amax_history;
    spec.amax_compute =
        r.amax_compute == AmaxCompute::Max ? plan::AmaxCompute::Max : plan::AmaxCompute::MostRecent;
    spec.margin = r.margin;
  }
  return spec;
}

namespace {

// Whether `o` selects the quantizer of `role` for layer `layer` (a GEMM selector matches the
// quantizers that GEMM reads).
bool selects(const QuantOverride& o, const std::string& layer, QuantizerRole role,
             std::initializer_list<plan::GemmRole> read_by) {
  if (!o.layer.empty() && o.layer != layer) return false;
  if (o.tensor && *o.tensor != role) return false;
  if (o.gemm && std::find(read_by.begin(), read_by.end(), *o.gemm) == read_by.end()) return false;
  return true;
}

class Planner {
 public:
  explicit Planner(Sequence& s) : s_(s), before_(s.ops.size()) {}

  void run() {
    for (size_t i = 0; i < s_.ops.size(); ++i) {
      const Operation& op = s_.ops[i];
      if (op.phase != Phase::Forward) continue;
      if (op.kind == OpKind::Linear) plan_linear(i);
      if (op.kind == OpKind::Quantize && s_.quantized_output &&
          op.results.at(0) == s_.outputs.at(0).value) {
        plan_quantized_output(i);
      } else if (op.kind == OpKind::Quantize) {
        plan_quantize(i);
      }
    }
    std::vector<Operation> ops;
    for (size_t i = 0; i < s_.ops.size(); ++i) {
      for (Operation& cast : before_[i]) ops.push_back(std::move(cast));
      if (i != removed_) ops.push_back(std::move(s_.ops[i]));
    }
    s_.ops = std::move(ops);
    recompute_producers(s_);
  }

 private:
  // Index of the backward op of `kind` made for forward layer `instance`; -1 if none.
  int find_backward(OpKind kind, const std::string& instance) const {
    for (size_t i = 0; i < s_.ops.size(); ++i)
      if (s_.ops[i].phase == Phase::Backward && s_.ops[i].kind == kind &&
          s_.ops[i].instance == instance)
        return int(i);
    return -1;
  }

  // A quantizer for `source` and the cast_fp8 (placed before op `position`) that makes its
  // row-wise and/or column-wise copies; returns {rowwise, columnwise} (kNoValue where not made).
  std::pair<ValueId, ValueId> add_cast(const Operation& consumer, QuantizerRole role,
                                       std::string name, const plan::QuantSpec& spec,
                                       ValueId source, bool rowwise, bool columnwise,
                                       size_t position) {
    if (!rowwise && !columnwise) return {kNoValue, kNoValue};
    QuantizerDecl q;
    q.name = std::move(name);
    q.role = role;
    q.spec = spec;
    q.source = source;
    q.usages = {rowwise, columnwise};
    // Notes "Emulated micro-scaling" and "Emulated block scaling" (docs/architecture.md).
    const bool emulated = spec.micro_scaled() || (spec.block_scaled() && s_.emulate_block_scaling);
    if (emulated) q.columnwise_layout = plan::CopyLayout::AsIs;
    const int32_t index = int32_t(s_.quantizers.size());
    s_.quantizers.push_back(q);
    if (emulated) return add_emulated_casts(consumer, index, rowwise, columnwise, position);

    Operation cast;
    cast.kind = OpKind::CastFp8;
    cast.phase = s_.ops[position].phase;
    cast.operands = {source};
    cast.attrs = {{"rowwise", rowwise}, {"columnwise", columnwise}};
    cast.instance = q.name;
    cast.loc = consumer.loc;
    cast.quantizer = index;
    const TensorType type = s_.value(source).type;  // a copy: add_value grows s_.values
    ValueId row = kNoValue, col = kNoValue;
    if (rowwise) {
      row = s_.add_value(ValueKind::Result, TensorType{q.format(), type.shape});
      s_.values[row].quantizer = index;
      cast.results.push_back(row);
    }
    if (columnwise) {
      const bool transposed = q.columnwise_layout == plan::CopyLayout::Transposed;
      col = s_.add_value(
          ValueKind::Result,
          TensorType{q.format(), transposed ? transposed_shape(type.shape) : type.shape});
      s_.values[col].quantizer = index;
      cast.results.push_back(col);
    }
    before_[position].push_back(std::move(cast));
    return {row, col};
  }

  // Note "Emulated micro-scaling" (docs/architecture.md): an MXFP8 / NVFP4 quantizer's copies
  // are decoded back to the source's dtype, one emulated_cast per copy, and the GEMMs that read
  // them are ordinary high-precision GEMMs. The column-wise copy keeps the source's layout (its
  // blocks run down the columns), as a high-precision GEMM reads it. Emulated block scaling
  // (note "Emulated block scaling") alike, except that 128 x 128 blocks are the same blocks in
  // both copies: one decoded copy serves both GEMMs.
  std::pair<ValueId, ValueId> add_emulated_casts(const Operation& consumer, int32_t quantizer,
                                                 bool rowwise, bool columnwise, size_t position) {
    const QuantizerDecl& q = s_.quantizers[size_t(quantizer)];
    const ValueId source = q.source;
    const bool one_copy = q.spec.scaling == plan::ScalingKind::Block2D;
    // A high-precision value (no quantizer of its own): GEMMs read it as any other.
    auto copy = [&](bool column) {
      return add_emulated_cast(q.name, consumer.loc, position, source, quantizer, column,
                               s_.value(source).type, /*codes=*/false);
    };
    const ValueId row = rowwise ? copy(false) : kNoValue;
    if (one_copy && rowwise) return {row, columnwise ? row : kNoValue};
    const ValueId col = columnwise ? copy(true) : kNoValue;
    return {row, col};
  }

  // One emulated_cast of `operand` under `quantizer` (a decoded copy, a quantized output's codes
  // or a quantized input's codes decoded), placed before op `position` in its phase; its result
  // has `type` and, for codes (`codes`), carries the quantizer. `type` is taken by value:
  // add_value grows s_.values.
  ValueId add_emulated_cast(const std::string& instance, SourceLoc loc, size_t position,
                            ValueId operand, int32_t quantizer, bool columnwise, TensorType type,
                            bool codes) {
    Operation cast;
    cast.kind = OpKind::EmulatedCast;
    cast.phase = s_.ops[position].phase;
    cast.operands = {operand};
    cast.attrs = {{"columnwise", columnwise}};
    cast.instance = instance;
    cast.loc = loc;
    cast.quantizer = quantizer;
    const ValueId v = s_.add_value(ValueKind::Result, std::move(type));
    if (codes) s_.values[v].quantizer = quantizer;
    cast.results.push_back(v);
    before_[position].push_back(std::move(cast));
    return v;
  }

  // The spec of the quantizer of `role` in `layer`: the recipe's unless an override selects it.
  plan::QuantSpec spec_for(const std::string& layer, QuantizerRole role,
                           std::initializer_list<plan::GemmRole> read_by) const {
    std::optional<plan::GemmRole> gemm;
    if (read_by.size() == 1) gemm = *read_by.begin();
    plan::QuantSpec spec = recipe_spec(s_.recipe, role, gemm);
    for (const QuantOverride& o : s_.quant_overrides)
      if (!o.high_precision && selects(o, layer, role, read_by)) spec = o.spec;
    return spec;
  }

  // Whether an override keeps GEMM `gemm` of `layer` in high precision.
  bool high_precision(const std::string& layer, plan::GemmRole gemm) const {
    for (const QuantOverride& o : s_.quant_overrides)
      if (o.high_precision && (o.layer.empty() || o.layer == layer) && (!o.gemm || *o.gemm == gemm))
        return true;
    return false;
  }

  // The value `v` stood for before debug-modify replaced it for one GEMM.
  ValueId unmodified(ValueId v) const {
    for (int p = s_.values.at(v).producer; p >= 0 && s_.ops[size_t(p)].kind == OpKind::ModifyTensor;
         p = s_.values.at(v).producer)
      v = s_.ops[size_t(p)].operands.at(0);
    return v;
  }

  // One operand tensor of the layer as its two GEMMs read it: the first GEMM reads the row-wise
  // copy, the second the column-wise one. Both from one value with one spec share one quantizer
  // and one cast (placed before the first GEMM). A debug feature can give one GEMM its own value
  // (debug-modify) or its own spec (a per-GEMM override, PerTensorScaling): then each FP8 copy
  // gets a quantizer of its own, cast right before its GEMM, and the copy that differs from the
  // layer's tensor under the layer's spec is named "<layer>.<role>.<gemm>", so the other keeps
  // the plain name (and its state across plan variants).
  struct Reader {
    plan::GemmRole gemm;
    bool fp8 = false;
    ValueId source = kNoValue;
    int op = -1;  // the GEMM op; -1: the sequence has none
  };
  // Where the cast of `source` for `readers` goes: before the first of them that exists, unless
  // `source` is a modification made right before its one reader.
  size_t cast_position(ValueId source, const Reader& reader, const Reader& other) const {
    if (source != unmodified(source) || other.op < 0) return size_t(reader.op);
    return size_t(std::min(reader.op, other.op));
  }
  std::pair<ValueId, ValueId> add_casts(const Operation& layer, QuantizerRole role,
                                        const Reader& first, const Reader& second) {
    const plan::QuantSpec first_spec = spec_for(layer.instance, role, {first.gemm});
    const plan::QuantSpec second_spec = spec_for(layer.instance, role, {second.gemm});
    if (!first.fp8 || !second.fp8 || (first.source == second.source && first_spec == second_spec)) {
      const Reader& r = first.fp8 ? first : second;
      const Reader& other = first.fp8 ? second : first;
      const std::string name = fmt::format("{}.{}", layer.instance, quantizer_role_name(role));
      return add_cast(layer, role, name, first.fp8 ? first_spec : second_spec, r.source, first.fp8,
                      second.fp8, cast_position(r.source, r, other));
    }
    const plan::QuantSpec layer_spec = spec_for(layer.instance, role, {});
    auto name = [&](const Reader& r, const plan::QuantSpec& spec) {
      const bool differs = r.source != unmodified(r.source) || !(spec == layer_spec);
      return differs ? fmt::format("{}.{}.{}", layer.instance, quantizer_role_name(role),
                                   plan::name(r.gemm))
                     : fmt::format("{}.{}", layer.instance, quantizer_role_name(role));
    };
    std::string first_name = name(first, first_spec), second_name = name(second, second_spec);
    if (first_name == second_name)  // both differ alike: keep the names apart
      second_name = fmt::format("{}.{}.{}", layer.instance, quantizer_role_name(role),
                                plan::name(second.gemm));
    const ValueId row = add_cast(layer, role, first_name, first_spec, first.source, true, false,
                                 cast_position(first.source, first, second))
                            .first;
    const ValueId col = add_cast(layer, role, second_name, second_spec, second.source, false, true,
                                 cast_position(second.source, second, first))
                            .second;
    return {row, col};
  }

  // Each GEMM of the layer reads FP8 copies unless an override keeps it in high precision; the
  // quantizers make only the copies the FP8 GEMMs read: fprop reads x and W row-wise, dgrad
  // (dx = dy W) dy row-wise and W column-wise, wgrad (dW = dy^T x) dy and x column-wise.
  void plan_linear(size_t i) {
    using plan::GemmRole;
    const Operation fprop = s_.ops[i];  // a copy: add_cast grows s_.values, not s_.ops
    const int dgrad = find_backward(OpKind::LinearDgrad, fprop.instance);
    const int wgrad = find_backward(OpKind::LinearWgrad, fprop.instance);
    const bool fp8_fprop = !high_precision(fprop.instance, GemmRole::Fprop);
    const bool fp8_dgrad = dgrad >= 0 && !high_precision(fprop.instance, GemmRole::Dgrad);
    const bool fp8_wgrad = wgrad >= 0 && !high_precision(fprop.instance, GemmRole::Wgrad);
    auto operand = [&](int op, size_t k) {
      return op >= 0 ? s_.ops[size_t(op)].operands.at(k) : kNoValue;
    };
    const int f = int(i);
    const bool boundary = s_.quantized_input && operand(f, 0) == s_.inputs.at(0);
    OPFUSE_ASSERT(!boundary || (fp8_fprop && (wgrad < 0 || fp8_wgrad)),
                  "linear '{}' reads a quantized input in high precision (the compile driver "
                  "refuses such routing)",
                  fprop.instance);
    const auto [xq, xq_t] =
        boundary
            ? quantized_input(fprop, i)
            : add_casts(fprop, QuantizerRole::Input, {GemmRole::Fprop, fp8_fprop, operand(f, 0), f},
                        {GemmRole::Wgrad, fp8_wgrad, operand(wgrad, 1), wgrad});
    const auto [wq, wq_t] =
        add_casts(fprop, QuantizerRole::Weight, {GemmRole::Fprop, fp8_fprop, operand(f, 1), f},
                  {GemmRole::Dgrad, fp8_dgrad, operand(dgrad, 1), dgrad});
    if (fp8_fprop) {
      s_.ops[i].operands[0] = xq;
      s_.ops[i].operands[1] = wq;
    }
    if (!fp8_dgrad && !fp8_wgrad) return;
    const auto [dyq, dyq_t] = add_casts(fprop, QuantizerRole::GradOutput,
                                        {GemmRole::Dgrad, fp8_dgrad, operand(dgrad, 0), dgrad},
                                        {GemmRole::Wgrad, fp8_wgrad, operand(wgrad, 0), wgrad});
    if (fp8_dgrad) s_.ops[size_t(dgrad)].operands = {dyq, wq_t};
    if (fp8_wgrad) s_.ops[size_t(wgrad)].operands = {dyq_t, xq_t};
  }

  // Note "Quantized boundaries" (docs/architecture.md): the main input's copies come from the
  // caller, so the input becomes the row-wise copy and a second input the column-wise one, both
  // of a boundary quantizer (no cast, no state) with the spec the linear's input would have.
  // Made once; every linear reading the input reads these copies. MXFP8 and NVFP4 copies, which
  // Hopper's GEMMs cannot read, are decoded (emulated_cast of the codes) before linear `f`, as
  // the casts of note "Emulated micro-scaling" decode theirs.
  std::pair<ValueId, ValueId> quantized_input(const Operation& linear, size_t f) {
    QuantizedBoundary& b = *s_.quantized_input;
    const ValueId in = s_.inputs.at(0);
    if (s_.values[in].quantizer >= 0) return boundary_reads_;
    QuantizerDecl q;
    q.name = s_.values[in].name;
    q.role = QuantizerRole::Input;
    q.spec = spec_for(linear.instance, QuantizerRole::Input, {});
    // NVFP4: whether the column-wise copy the caller gives is Hadamard-transformed (what the
    // weight gradient's cast would make; emit_micro_cast's reading of rht: the column-wise copy's).
    if (q.spec.nvfp4() && b.usages.columnwise)
      q.spec.rht = spec_for(linear.instance, QuantizerRole::Input, {plan::GemmRole::Wgrad}).rht;
    q.usages = b.usages;
    q.boundary = true;
    // MXFP8's column-wise copy keeps x's layout (its blocks run down the columns).
    if (q.spec.micro_scaled() && !q.spec.nvfp4()) q.columnwise_layout = plan::CopyLayout::AsIs;
    const int32_t index = int32_t(s_.quantizers.size());
    s_.quantizers.push_back(q);
    const TensorType decoded = s_.values[in].type;  // the type the linear declared it as
    s_.values[in].type.dtype = q.format();
    s_.values[in].quantizer = index;
    if (b.usages.columnwise) {
      const Shape& shape = s_.values[in].type.shape;
      const TensorType type{q.format(), q.columnwise_layout == plan::CopyLayout::Transposed
                                            ? transposed_shape(shape)
                                            : shape};
      b.columnwise = s_.add_value(ValueKind::Input, type, s_.values[in].name + ".columnwise");
      s_.values[b.columnwise].quantizer = index;
    }
    boundary_reads_ = {in, b.columnwise};
    if (!q.spec.micro_scaled()) return boundary_reads_;
    auto decode = [&](ValueId codes, bool columnwise) {
      if (codes == kNoValue) return kNoValue;
      return add_emulated_cast(q.name + (columnwise ? ".columnwise.decode" : ".decode"), linear.loc,
                               f, codes, index, columnwise, decoded,
                               /*codes=*/false);
    };
    boundary_reads_ = {decode(in, false), decode(b.columnwise, true)};
    return boundary_reads_;
  }

  // The quantize op that makes a quantized main output becomes a real cast (its copies are the
  // output) with the spec a linear's input gets, the consumer's; the op itself goes. MXFP8 and
  // NVFP4 outputs are the codes and block scales of emulated casts (add_encoded_casts).
  void plan_quantized_output(size_t i) {
    const Operation op = s_.ops[i];  // a copy: add_cast grows s_.values
    QuantizedBoundary& b = *s_.quantized_output;
    const plan::QuantSpec spec = spec_for(op.instance, QuantizerRole::Input, {});
    const auto [row, col] =
        spec.micro_scaled() ? add_encoded_casts(op, spec, b.usages, i)
                            : add_cast(op, QuantizerRole::Input, s_.outputs.at(0).name, spec,
                                       op.operands.at(0), b.usages.rowwise, b.usages.columnwise, i);
    OPFUSE_ASSERT(row != kNoValue, "quantized output '{}' has no row-wise copy",
                  s_.outputs.at(0).name);
    s_.outputs[0].value = row;
    b.columnwise = col;
    removed_ = i;
    plan_quantize(i, /*forward=*/false);  // quantize(backward = true) still casts the gradient
  }

  // A micro-scaled quantized output's copies: emulated casts whose results are the codes (with
  // their block scales; codegen) instead of decoded values. The column-wise copy takes the spec
  // a wgrad's input gets (NVFP4: Hadamard-transformed) and, when that differs from the row-wise
  // one, a quantizer of its own, "<output>.columnwise", with its own tensor scale, as a linear's
  // two casts of its input do.
  std::pair<ValueId, ValueId> add_encoded_casts(const Operation& op, const plan::QuantSpec& spec,
                                                const plan::Usages& usages, size_t position) {
    const std::string& name = s_.outputs.at(0).name;
    const ValueId source = op.operands.at(0);
    const plan::QuantSpec wgrad_spec =
        spec_for(op.instance, QuantizerRole::Input, {plan::GemmRole::Wgrad});
    const bool own = usages.columnwise && !(wgrad_spec == spec);
    auto quantizer = [&](std::string qname, const plan::QuantSpec& qspec, plan::Usages u) {
      QuantizerDecl q;
      q.name = std::move(qname);
      q.role = QuantizerRole::Input;
      q.spec = qspec;
      q.source = source;
      q.usages = u;
      if (!qspec.nvfp4()) q.columnwise_layout = plan::CopyLayout::AsIs;
      s_.quantizers.push_back(q);
      return int32_t(s_.quantizers.size() - 1);
    };
    const int32_t row_q = quantizer(name, spec, {true, usages.columnwise && !own});
    const int32_t col_q = own ? quantizer(name + ".columnwise", wgrad_spec, {false, true}) : row_q;
    auto encode = [&](int32_t index, bool columnwise) {
      const QuantizerDecl& q = s_.quantizers[size_t(index)];
      const Shape& shape = s_.value(source).type.shape;
      const bool transposed = columnwise && q.columnwise_layout == plan::CopyLayout::Transposed;
      return add_emulated_cast(q.name, op.loc, position, source, index, columnwise,
                               TensorType{q.format(), transposed ? transposed_shape(shape) : shape},
                               /*codes=*/true);
    };
    const ValueId row = encode(row_q, false);
    const ValueId col = usages.columnwise ? encode(col_q, true) : kNoValue;
    return {row, col};
  }

  // TE's Quantize op keeps its dtype: the executor casts and dequantizes with these quantizers.
  void plan_quantize(size_t i, bool forward = true) {
    Operation& op = s_.ops[i];
    if (op.quantizer >= 0) return;
    auto add = [&](Operation& target, QuantizerRole role) {
      QuantizerDecl q;
      q.name = fmt::format("{}.{}", op.instance, quantizer_role_name(role));
      q.role = role;
      q.spec = spec_for(op.instance, role, {});
      q.source = target.operands[0];
      q.usages.rowwise = true;
      target.quantizer = int32_t(s_.quantizers.size());
      s_.quantizers.push_back(q);
    };
    if (forward && attr_bool(op.attrs, "forward")) add(op, QuantizerRole::Output);
    if (attr_bool(op.attrs, "backward")) {
      for (Operation& b : s_.ops)
        if (b.phase == Phase::Backward && b.kind == OpKind::Quantize && b.instance == op.instance)
          add(b, QuantizerRole::GradInput);
    }
  }

  Sequence& s_;
  std::vector<std::vector<Operation>> before_;  // casts to insert before each op
  std::pair<ValueId, ValueId> boundary_reads_{kNoValue, kNoValue};  // what linears read of the
                                                                    // quantized input
  size_t removed_ = ~size_t(0);  // the quantize a quantized output's cast replaces
};

}  // namespace

// Whether the planner ran on `s` already (the quantizers debug-modify gives its fake
// quantizations do not count).
bool planned(const Sequence& s) {
  for (const Operation& op : s.ops)
    if (op.kind == OpKind::CastFp8 || (op.kind == OpKind::Quantize && op.quantizer >= 0) ||
        op.kind == OpKind::Fused)
      return true;
  return false;
}

bool plan_quantization(Program& program) {
  bool changed = false;
  for (Sequence& s : program.sequences) {
    if (!s.recipe.is_fp8() || planned(s)) continue;
    const size_t before = s.quantizers.size();
    Planner(s).run();
    changed |= s.quantizers.size() != before;
  }
  return changed;
}

}  // namespace opfuse::passes
