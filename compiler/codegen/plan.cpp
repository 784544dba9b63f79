#include "codegen/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

#include "codegen/emit_groups.h"
#include "codegen/kernel_source.h"
#include "codegen/kernel_templates.h"
#include "codegen/plan_builder.h"
#include "ir/pointwise_ops.h"
#include "support/assert.h"

namespace opfuse::codegen {

namespace {

using ir::OpKind;
using ir::ValueId;

// The names the IR printer gives values (ir/printer.cpp), so a plan reads next to `fusec ir`.
std::vector<std::string> printed_value_names(const ir::Sequence& s) {
  std::vector<std::string> names(s.values.size());
  int next = 0;
  for (const ir::Value& v : s.values) {
    switch (v.kind) {
      case ir::ValueKind::Result:
        names[v.id] = fmt::format("%{}", next++);
        break;
      case ir::ValueKind::OutputGrad:
        names[v.id] = "%d" + v.name;
        break;
      default:
        names[v.id] = "%" + v.name;
    }
  }
  return names;
}

void add_unique(std::vector<int>& ids, int id) {
  if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

}  // namespace

// ---- small helpers ------------------------------------------------------------------------------

const ir::Operation* Group::find(std::initializer_list<OpKind> kinds) const {
  for (const ir::Operation* p : parts)
    if (std::find(kinds.begin(), kinds.end(), p->kind) != kinds.end()) return p;
  return nullptr;
}

bool Group::only(std::initializer_list<OpKind> kinds) const {
  return std::all_of(parts.begin(), parts.end(), [&](const ir::Operation* p) {
    return std::find(kinds.begin(), kinds.end(), p->kind) != kinds.end();
  });
}

// ---- the sequence builder -----------------------------------------------------------------------

SequenceBuilder::SequenceBuilder(const ir::Sequence& seq, const CodegenOptions& options, Plan& plan)
    : seq_(seq), options_(options), plan_(plan), buffer_of_(seq.values.size(), -1) {}

std::string SequenceBuilder::location(SourceLoc loc) const {
  if (options_.sources == nullptr || !loc.valid() || loc.file >= options_.sources->file_count())
    return {};
  return fmt::format("{}:{}", options_.sources->base_name(loc.file), loc.line);
}

void SequenceBuilder::fail(const ir::Operation& op, const std::string& message,
                           const std::string& hint) const {
  throw CodegenError(op.loc, message, hint);
}

int SequenceBuilder::buffer(ValueId id, const ir::Operation& at) const {
  OPFUSE_ASSERT(id < buffer_of_.size(), "value {} out of range", id);
  if (buffer_of_[id] < 0) {
    fail(at,
         fmt::format("codegen: '{}' ({}) needs value {} in memory, but its fused group keeps it "
                     "inside one kernel",
                     ir::op_info(at.kind).name, at.instance, printed_value_names(seq_)[id]),
         "this is a bug in a fusion pattern; build with --disable-pass fuse-forward (or "
         "fuse-backward) and report it");
  }
  return buffer_of_[id];
}

int SequenceBuilder::add_workspace(const std::string& name, ir::DType dtype,
                                   std::vector<SymExpr> shape) {
  Buffer b;
  b.id = int(out_.buffers.size());
  b.name = name;
  b.role = BufferRole::Workspace;
  b.dtype = dtype;
  b.bytes = ir::dtype_bytes(dtype);
  for (const SymExpr& d : shape) b.bytes = b.bytes * d;
  b.shape = std::move(shape);
  out_.buffers.push_back(std::move(b));
  return out_.buffers.back().id;
}

void SequenceBuilder::make_alias(ValueId view, ValueId of) {
  const int view_buffer = buffer_of_.at(view), of_buffer = buffer_of_.at(of);
  OPFUSE_ASSERT(view_buffer >= 0 && of_buffer >= 0, "alias of an unmaterialized value");
  int root = of_buffer;
  while (out_.buffers[size_t(root)].alias_of >= 0) root = out_.buffers[size_t(root)].alias_of;
  out_.buffers[size_t(view_buffer)].alias_of = root;
}

std::vector<OpRef> SequenceBuilder::op_refs(const Group& g) const {
  std::vector<OpRef> refs;
  for (const ir::Operation* p : g.parts) {
    // A composed chain (compiler/passes/compose_pointwise.h) names each of its ops and line.
    const ir::PointwiseDef* def = ir::pointwise_def(p->kind);
    const auto composed = def != nullptr && ir::is_pointwise(p->kind)
                              ? ir::composed_parts(*def, p->attrs)
                              : std::vector<ir::ComposedPart>{};
    for (const ir::ComposedPart& c : composed)
      refs.push_back({c.name, p->instance, location(c.loc)});
    if (composed.empty())
      refs.push_back(
          {std::string(ir::written_op_name(p->kind, p->attrs)), p->instance, location(p->loc)});
  }
  return refs;
}

std::vector<std::string> SequenceBuilder::quantizer_names(const Group& g) const {
  std::vector<std::string> names;
  for (const ir::Operation* p : g.parts)
    if (p->quantizer >= 0) names.push_back(seq_.quantizers.at(size_t(p->quantizer)).name);
  return names;
}

Step& SequenceBuilder::add_step(const Group* g, const std::string& what) {
  Step s;
  s.index = int(out_.steps.size());
  s.phase = g ? g->op->phase : (seq_.has_backward ? ir::Phase::Backward : ir::Phase::Forward);
  s.group = g ? g->index : -1;
  if (g) {
    s.pattern = g->pattern;
    s.ops = op_refs(*g);
  }
  s.what = what;
  out_.steps.push_back(std::move(s));
  return out_.steps.back();
}

// The plan's kernel for `template_name<args>`, added on first use: one kernel per instantiation,
// shared by every launch of it.
Kernel& kernel_for(Plan& plan, const std::string& template_name,
                   const std::vector<std::string>& args) {
  const KernelTemplate* t = find_kernel_template(template_name);
  OPFUSE_ASSERT(t != nullptr, "no kernel template '{}'", template_name);
  std::string expression;
  try {
    expression = name_expression(*t, args);
  } catch (const std::invalid_argument& e) {
    internal_failure(__FILE__, __LINE__, e.what());
  }
  auto it = std::find_if(plan.kernels.begin(), plan.kernels.end(),
                         [&](const Kernel& k) { return k.name_expression == expression; });
  if (it != plan.kernels.end()) return *it;
  Kernel k;
  k.id = kernel_id(*t, args);
  k.header = std::string(t->header);
  k.template_name = template_name;
  k.template_args = args;
  k.name_expression = std::move(expression);
  k.params_struct = params_struct_spelling(*t, args);
  plan.kernels.push_back(std::move(k));
  return plan.kernels.back();
}

bool binds_transposed_copy(const ParamBinding& p) {
  return p.columnwise_copy && p.kind == ParamKind::Buffer;
}

namespace {

bool is_dropout_launch(const Step& step) {
  const auto* launch = std::get_if<LaunchStep>(&step.body);
  return launch != nullptr && launch->name_expression.starts_with("opfuse::dropout_fwd<");
}

constexpr std::string_view kInferenceSuffix = " (inference: without the transposed copy)";

}  // namespace

void SequenceBuilder::add_launch(const Group& g, const std::string& what,
                                 const std::string& template_name,
                                 const std::vector<std::string>& args, GridRule grid,
                                 int block_threads, int dynamic_smem_bytes,
                                 std::vector<ParamBinding> params,
                                 std::optional<WithoutTranspose> without_transpose) {
  const Group* group = g.op ? &g : nullptr;
  Kernel& kernel = kernel_for(plan_, template_name, args);
  Step& s = add_step(group, what);
  KernelUse use{seq_.name, s.phase, s.pattern, s.ops, what, {}};
  if (group) {
    use.quantizers = quantizer_names(*group);
  } else {
    for (const ir::QuantizerDecl& q : seq_.quantizers) use.quantizers.push_back(q.name);
  }
  kernel.uses.push_back(use);

  for (const ParamBinding& p : params) {
    if (p.kind != ParamKind::Buffer && p.kind != ParamKind::Buffers) continue;
    for (int b : p.buffers) add_unique(p.written ? s.writes : s.reads, b);
  }
  // A candidate only: add_inference_variants() keeps it where backward alone reads the copy.
  const bool writes_copy = std::any_of(params.begin(), params.end(), binds_transposed_copy) ||
                           (without_transpose && !without_transpose->serves.empty());
  if (group && s.phase == ir::Phase::Forward && writes_copy) {
    OPFUSE_ASSERT(without_transpose.has_value(),
                  "forward launch of '{}' writes a transposed copy but gives no launch without it",
                  template_name);
    InferenceVariant variant;
    variant.what = without_transpose->what;
    variant.launch.block_threads = without_transpose->block_threads;
    variant.launch.dynamic_smem_bytes = without_transpose->dynamic_smem_bytes;
    variant.launch.grid = std::move(without_transpose->grid);
    variant.launch.params = params;
    for (ParamBinding& p : variant.launch.params)
      if (binds_transposed_copy(p)) p = bind_null(p.field);
    s.inference = std::move(variant);
    if (!without_transpose->serves.empty()) serves_[s.index] = without_transpose->serves;
    use.what = without_transpose->what + std::string(kInferenceSuffix);
    inference_uses_[s.index] = std::move(use);
  }
  s.body = LaunchStep{kernel.id,          kernel.name_expression, block_threads,
                      dynamic_smem_bytes, std::move(grid),        std::move(params)};
}

void SequenceBuilder::add_gemm(const Group& g, const std::string& what, GemmStep gemm) {
  Step& s = add_step(&g, what);
  add_unique(s.reads, gemm.a.buffer);
  add_unique(s.reads, gemm.b.buffer);
  if (gemm.a.scale_inv.buffer >= 0) add_unique(s.reads, gemm.a.scale_inv.buffer);
  if (gemm.b.scale_inv.buffer >= 0) add_unique(s.reads, gemm.b.scale_inv.buffer);
  add_unique(s.reads, gemm.c);
  const bool bias_written = epilogue_writes_bias(gemm.epilogue);
  const bool aux_written = epilogue_writes_aux(gemm.epilogue);
  add_unique(bias_written ? s.writes : s.reads, gemm.bias);
  add_unique(aux_written ? s.writes : s.reads, gemm.aux);
  add_unique(s.writes, gemm.d);
  s.body = std::move(gemm);
}

void SequenceBuilder::add_collective(const Group& g, const std::string& what,
                                     CollectiveStep collective) {
  Step& s = add_step(&g, what);
  add_unique(s.reads, collective.input);
  add_unique(s.writes, collective.output);
  s.body = std::move(collective);
}

void SequenceBuilder::plan_quantizers() {
  for (size_t i = 0; i < seq_.quantizers.size(); ++i) {
    const ir::QuantizerDecl& d = seq_.quantizers[i];
    QuantizerPlan q;
    q.index = int(i);
    q.name = d.name;
    q.role = d.role;
    q.spec = d.spec;
    q.usages = d.usages;
    q.columnwise_layout = d.columnwise_layout;
    q.source_buffer = d.source == ir::kNoValue ? -1 : buffer_of_.at(d.source);
    q.boundary = d.boundary;
    out_.quantizers.push_back(std::move(q));
  }
}

void SequenceBuilder::plan_buffers() {
  // Values made and consumed inside a fused group never reach memory.
  std::set<ValueId> internal;
  for (const ir::Operation& op : seq_.ops) {
    for (const ir::Operation& part : op.parts) {
      for (ValueId r : part.results)
        if (std::find(op.results.begin(), op.results.end(), r) == op.results.end())
          internal.insert(r);
    }
  }
  // Note "Emulated micro-scaling": the decoded copies, by value, with their quantizer and copy.
  std::map<ValueId, std::pair<int, bool>> emulated;
  auto find_emulated = [&](const ir::Operation& op) {
    // (A quantized output's codes are not decoded: note "Quantized boundaries".)
    if (op.kind == ir::OpKind::EmulatedCast && seq_.value(op.results.at(0)).quantizer < 0)
      emulated[op.results.at(0)] = {op.quantizer, ir::attr_bool(op.attrs, "columnwise")};
  };
  for (const ir::Operation& op : seq_.ops) {
    find_emulated(op);
    for (const ir::Operation& part : op.parts) find_emulated(part);
  }
  const std::vector<std::string> names = printed_value_names(seq_);
  for (const ir::Value& v : seq_.values) {
    if (internal.count(v.id)) continue;
    Buffer b;
    b.id = int(out_.buffers.size());
    b.name = names[v.id];
    b.value = v.id;
    switch (v.kind) {
      case ir::ValueKind::Input:
        b.role = BufferRole::Input;
        break;
      case ir::ValueKind::Param:
        b.role = BufferRole::Param;
        b.init = v.init;
        b.shard = v.shard;
        break;
      case ir::ValueKind::OutputGrad:
        b.role = BufferRole::OutputGrad;
        break;
      case ir::ValueKind::Result:
        b.role = BufferRole::Result;
        break;
    }
    b.dtype = v.type.dtype;
    for (const ir::Dim& d : v.type.shape) b.shape.push_back(dim_expr(d));
    b.bytes = v.type.dtype == ir::DType::E2M1  // NVFP4 codes, two per byte
                  ? ceil_div(element_count_expr(v.type.shape), 2)
                  : element_count_expr(v.type.shape) * ir::dtype_bytes(v.type.dtype);
    b.quantizer = v.quantizer;
    if (v.quantizer >= 0) {
      const ir::QuantizerDecl& q = seq_.quantizers.at(size_t(v.quantizer));
      const bool columnwise = columnwise_.count(v.id) > 0;
      b.usage = columnwise ? CopyUsage::Columnwise : CopyUsage::Rowwise;
      b.layout = columnwise ? q.columnwise_layout : CopyLayout::AsIs;
      // Per-tensor specs keep the scale-inverse as the quantizer's device scalar; block specs
      // give each copy a grid of its own (below). A quantized input's copies read the caller's
      // scale_inv: one FP32 input both copies share, or each copy's grid (an input too).
      if (q.spec.per_tensor() && !q.boundary) b.scale_inv.quantizer = v.quantizer;
    }
    if (const auto it = emulated.find(v.id); it != emulated.end()) {
      b.emulated_quantizer = it->second.first;
      b.usage = it->second.second ? CopyUsage::Columnwise : CopyUsage::Rowwise;
    }
    buffer_of_[v.id] = b.id;
    const bool block_scaled =
        v.quantizer >= 0 && !seq_.quantizers.at(size_t(v.quantizer)).spec.per_tensor();
    const bool transposed = b.layout == CopyLayout::Transposed;
    const int data = b.id;
    out_.buffers.push_back(std::move(b));
    if (block_scaled) add_scale_grid(v, transposed);
    if (v.quantizer >= 0 && seq_.quantizers.at(size_t(v.quantizer)).boundary)
      add_boundary_scales(v, data, block_scaled);
  }
  auto tag = [&](ValueId v, InterfaceKind kind, const std::string& name) {
    if (v != ir::kNoValue && buffer_of_.at(v) >= 0)
      out_.buffers[size_t(buffer_of_[v])].interface.push_back({kind, name});
  };
  for (const ir::SequenceOutput& o : seq_.outputs) tag(o.value, InterfaceKind::Output, o.name);
  tag_quantized_output();
  for (size_t i = 0; i < seq_.input_grads.size() && i < seq_.inputs.size(); ++i)
    tag(seq_.input_grads[i], InterfaceKind::InputGrad, seq_.value(seq_.inputs[i]).name);
  for (size_t i = 0; i < seq_.param_grads.size() && i < seq_.params.size(); ++i)
    tag(seq_.param_grads[i], InterfaceKind::ParamGrad, seq_.value(seq_.params[i]).name);
}

// Note "One scale update": delayed scaling updates every delayed quantizer of the sequence once
// per step, after backward, in one launch (docs/architecture.md, "Quantizer state"); every
// kernel raised its amax into history slot 0 during the step. A current-scaling quantizer
// updates before its cast instead (plan_groups.cpp), so it is not in the launch.
void SequenceBuilder::add_scale_update() {
  std::vector<int> records;
  for (size_t i = 0; i < seq_.quantizers.size(); ++i)
    if (seq_.quantizers[i].spec.delayed() && !seq_.quantizers[i].boundary)
      records.push_back(int(i));
  if (records.empty()) return;
  const int count = int(records.size());
  GridRule grid{"per_record", count, 1, {{"records", count}}};
  add_launch(Group{},
             "update every quantizer's amax history, scale and scale_inv (delayed scaling)",
             "update_scales", {"256"}, std::move(grid), 256, 0,
             {bind_records("records", std::move(records)), bind_int("count", count)});
}

void SequenceBuilder::compute_lifetimes() {
  std::vector<bool> forward_use(out_.buffers.size()), backward_use(out_.buffers.size());
  auto touch = [&](int id, const Step& s) {
    Buffer& b = out_.buffers[size_t(id)];
    if (b.first_use < 0) b.first_use = s.index;
    b.last_use = std::max(b.last_use, s.index);
    (s.phase == ir::Phase::Forward ? forward_use : backward_use)[size_t(id)] = true;
  };
  for (const Step& s : out_.steps) {
    std::vector<int> ids = s.reads;
    ids.insert(ids.end(), s.writes.begin(), s.writes.end());
    for (int id : ids) {
      touch(id, s);
      // A view keeps the memory it views alive.
      for (int root = out_.buffers[size_t(id)].alias_of; root >= 0;
           root = out_.buffers[size_t(root)].alias_of)
        touch(root, s);
    }
  }
  for (Buffer& b : out_.buffers) b.saved = forward_use[size_t(b.id)] && backward_use[size_t(b.id)];
  // Note "Executor buffers" (docs/architecture.md): each root's memory per run mode, over every
  // buffer a step names as that mode runs it; an inference forward stops before backward.
  for (const bool inference : {false, true}) {
    for (const Step& s : out_.steps) {
      if (inference && s.phase == ir::Phase::Backward) break;
      for (int id : buffers_named_by(s, inference)) {
        Lifetime& life = out_.buffers[size_t(out_.buffers[size_t(id)].root)].*
                         (inference ? &Buffer::inference : &Buffer::training);
        if (life.first < 0) life.first = s.index;
        life.last = s.index;
      }
    }
  }
}

// Note "Weight cache" (docs/architecture.md): a forward group whose steps read nothing but
// parameters and write only memory of their own is a weight cast; the executor skips it while its
// outputs are valid, and no inference variant is made for it.
void SequenceBuilder::find_weight_cache_groups() {
  auto is_callers = [&](int root) {
    const BufferRole role = out_.buffers[size_t(root)].role;
    return role == BufferRole::Input || role == BufferRole::Param || role == BufferRole::OutputGrad;
  };
  std::map<int, std::vector<int>> steps_of_group;
  for (const Step& s : out_.steps)
    if (s.group >= 0 && s.phase == ir::Phase::Forward) steps_of_group[s.group].push_back(s.index);
  for (const auto& [group, indices] : steps_of_group) {
    std::set<int> reads, writes;
    for (int index : indices) {
      const Step& s = out_.steps[size_t(index)];
      for (int id : s.reads) reads.insert(out_.buffers[size_t(id)].root);
      for (int id : s.writes) writes.insert(out_.buffers[size_t(id)].root);
    }
    const bool only_params = std::all_of(reads.begin(), reads.end(), [&](int root) {
      return out_.buffers[size_t(root)].role == BufferRole::Param;
    });
    if (reads.empty() || writes.empty() || !only_params ||
        std::any_of(writes.begin(), writes.end(), is_callers)) {
      continue;
    }
    WeightCacheGroup cache;
    cache.steps = indices;
    cache.params.assign(reads.begin(), reads.end());
    for (int root : writes) {
      out_.buffers[size_t(root)].weight_cache = true;
      const int q = out_.buffers[size_t(root)].quantizer;
      if (q >= 0 &&
          std::find(cache.quantizers.begin(), cache.quantizers.end(), q) == cache.quantizers.end())
        cache.quantizers.push_back(q);
    }
    for (int index : indices)
      out_.steps[size_t(index)].weight_cache_group = int(out_.weight_cache_groups.size());
    out_.weight_cache_groups.push_back(std::move(cache));
  }
}

SequencePlan SequenceBuilder::build() {
  out_.name = seq_.name;
  out_.recipe = ir::recipe_string(seq_.recipe);
  out_.fp8_weights = seq_.fp8_weights;
  out_.parallel = seq_.parallel;
  if (seq_.parallel.active()) {
    std::map<std::string, int64_t> divisors;
    for (const ir::Value& v : seq_.values)
      for (const ir::Dim& d : v.type.shape)
        if (d.is_symbolic() && d.divisor > 1) {
          // Every share must be whole: the size divides by all of its divisors.
          int64_t& all = divisors.try_emplace(d.symbol, 1).first->second;
          all = std::lcm(all, d.divisor);
        }
    out_.symbol_divisors.assign(divisors.begin(), divisors.end());
  }
  out_.stat_slots = seq_.inspections;
  out_.capture_slots = seq_.captures;
  out_.symbols = seq_.symbols();
  out_.symbols.emplace_back(kNumSmsSymbol);
  // The column-wise FP8 copy is the last result of a column-wise cast (plan-quantization), the
  // result of an fp8_transpose (gather_fp8), or a quantized input's or output's (the codes of a
  // column-wise emulated cast: note "Quantized boundaries").
  auto note_casts = [&](const ir::Operation& op) {
    if ((op.kind == OpKind::CastFp8 && ir::attr_bool(op.attrs, "columnwise") &&
         !op.results.empty()) ||
        op.kind == OpKind::Fp8Transpose ||
        (op.kind == OpKind::EmulatedCast && ir::attr_bool(op.attrs, "columnwise") &&
         seq_.value(op.results.at(0)).quantizer >= 0))
      columnwise_.insert(op.results.back());
  };
  for (const ir::Operation& op : seq_.ops) {
    note_casts(op);
    for (const ir::Operation& part : op.parts) note_casts(part);
  }
  // A quantized input's column-wise copy, which the caller gives (note "Quantized boundaries").
  if (seq_.quantized_input && seq_.quantized_input->columnwise != ir::kNoValue)
    columnwise_.insert(seq_.quantized_input->columnwise);
  plan_buffers();
  plan_quantizers();
  auto enabled = [&](std::string_view pass) {
    return !options_.disabled_plan_passes.count(std::string(pass));
  };
  auto ran = [&](std::string_view pass) {
    if (options_.print && options_.print_after.count(std::string(pass))) options_.print(pass, out_);
  };
  fold_current_amax_ = enabled("fold-current-amax");
  for (size_t i = 0; i < seq_.ops.size(); ++i) {
    const ir::Operation& op = seq_.ops[i];
    OPFUSE_ASSERT(
        i == 0 || !(op.phase == ir::Phase::Forward && seq_.ops[i - 1].phase == ir::Phase::Backward),
        "forward op '{}' after a backward op", op.instance);
    Group g;
    g.op = &op;
    g.index = int(i);
    if (op.kind == OpKind::Fused) {
      for (const ir::Operation& part : op.parts) g.parts.push_back(&part);
      g.pattern = ir::attr_name(op.attrs, "pattern");
    } else {
      g.parts.push_back(&op);
    }
    emit_group(*this, g);
  }
  ran("fold-current-amax");
  emitters::emit_dropout_step_advance(*this);
  for (Buffer& b : out_.buffers) {
    b.root = b.id;
    while (out_.buffers[size_t(b.root)].alias_of >= 0)
      b.root = out_.buffers[size_t(b.root)].alias_of;
  }
  // Note "Plan passes": the order matters (the update is a step the lifetimes count; weight
  // casts get no inference variant; lifetimes follow the variants).
  const std::pair<std::string_view, void (SequenceBuilder::*)()> passes[] = {
      {"scale-update", &SequenceBuilder::add_scale_update},
      {"weight-cache", &SequenceBuilder::find_weight_cache_groups},
      {"inference-variants", &SequenceBuilder::add_inference_variants},
      {"gated-epilogues", &SequenceBuilder::add_gated_epilogues},
      {"lifetimes", &SequenceBuilder::compute_lifetimes},
  };
  for (const auto& [name, run] : passes) {
    const PlanPass* pass = find_plan_pass(name);
    OPFUSE_ASSERT(pass != nullptr && (enabled(name) || !pass->required),
                  "plan pass '{}' is required", name);
    if (!enabled(name)) {
      // The launches' candidates (add_launch) become variants only through the pass.
      // Except dropout's: its inference forward is the identity, not an optimization.
      if (name == "inference-variants") {
        for (Step& step : out_.steps)
          if (!is_dropout_launch(step)) step.inference.reset();
        add_inference_variants();
      }
      continue;
    }
    (this->*run)();
    ran(name);
  }
  return std::move(out_);
}

// ---- entry points -------------------------------------------------------------------------------

namespace {

std::string source_name(const ir::Program& program, const CodegenOptions& options) {
  if (options.sources == nullptr) return {};
  for (const ir::Sequence& s : program.sequences)
    if (s.loc.valid() && s.loc.file < options.sources->file_count())
      return options.sources->base_name(s.loc.file);
  return {};
}

}  // namespace

const std::vector<PlanPass>& plan_passes() {
  static const std::vector<PlanPass> passes = {
      {"fold-current-amax",
       "current scaling: the kernel producing a cast's input measures its amax and derives the "
       "scale (else a separate amax_reduce launch before the cast)",
       false},
      {"scale-update", "one update_scales launch over the delayed-scaling quantizers per step",
       false},
      {"weight-cache", "mark forward groups that read only parameters as cached weight casts",
       false},
      {"inference-variants",
       "inference forwards run launches without the column-wise copies only backward reads", false},
      {"gated-epilogues",
       "inference forwards fold a gated activation's E4M3 cast into the epilogue of the FP8 GEMM "
       "before it, where the runtime has the kernel",
       false},
      {"lifetimes", "each buffer's memory lifetime per run mode (read by the executor)", true},
  };
  return passes;
}

const PlanPass* find_plan_pass(std::string_view name) {
  for (const PlanPass& p : plan_passes())
    if (p.name == name) return &p;
  return nullptr;
}

Plan build_plan(const ir::Program& program, const CodegenOptions& options) {
  Plan plan;
  plan.source = source_name(program, options);
  plan.arch = options.arch;
  for (const ir::Sequence& s : program.sequences)
    plan.sequences.push_back(SequenceBuilder(s, options, plan).build());
  return plan;
}

Plan build_plan(const ir::Sequence& sequence, const CodegenOptions& options) {
  ir::Program one;
  one.sequences.push_back(sequence);
  return build_plan(one, options);
}

}  // namespace opfuse::codegen
