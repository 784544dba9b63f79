// The plan as JSON (docs/codegen.md, "plan.json"): keys in a fixed order, sizes as integers when
// known and as plan expressions otherwise, no times and no absolute paths, so goldens compare it.
#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace opfuse::plan {

namespace {

using Json = nlohmann::ordered_json;

Json expr(const SymExpr& e) {
  if (const auto v = e.value()) return *v;
  return e.text();
}

Json exprs(const std::vector<SymExpr>& list) {
  Json out = Json::array();
  for (const SymExpr& e : list) out.push_back(expr(e));
  return out;
}

Json op_refs(const std::vector<OpRef>& ops) {
  Json out = Json::array();
  for (const OpRef& r : ops)
    out.push_back({{"op", r.op}, {"instance", r.instance}, {"location", r.location}});
  return out;
}

Json quantizer_ref(const SequencePlan& s, int index) {
  if (index < 0) return nullptr;
  return s.quantizers.at(size_t(index)).name;
}

Json scale_inv_json(const ScaleInvRef& r) {
  if (r.quantizer >= 0) return Json{{"quantizer", r.quantizer}};
  if (r.buffer >= 0) return Json{{"buffer", r.buffer}};
  return nullptr;
}

Json buffer_json(const Buffer& b) {
  Json j{{"id", b.id},
         {"name", b.name},
         {"role", name(b.role)},
         {"dtype", name(b.dtype)},
         {"shape", exprs(b.shape)},
         {"bytes", expr(b.bytes)},
         {"first_use", b.first_use},
         {"last_use", b.last_use},
         {"saved", b.saved}};
  if (b.alias_of >= 0) j["alias_of"] = b.alias_of;
  j["root"] = b.root;
  if (b.root == b.id) {
    j["training"] = Json::array({b.training.first, b.training.last});
    j["inference"] = Json::array({b.inference.first, b.inference.last});
  }
  if (b.weight_cache) j["weight_cache"] = true;
  if (b.role == BufferRole::Param) {
    j["init"] = {{"kind", b.init.kind == ParamInit::Kind::Normal ? "normal" : "constant"},
                 {"value", b.init.value}};
    if (b.shard.sharded()) j["shard"] = {{"dim", b.shard.dim}, {"blocks", b.shard.blocks}};
  }
  if (b.quantizer >= 0) {
    j["quantizer"] = b.quantizer;
    j["usage"] = name(b.usage);
    j["layout"] = name(b.layout);
    j["scale_inv"] = scale_inv_json(b.scale_inv);
  }
  if (b.emulated_quantizer >= 0)
    j["emulates"] = {{"quantizer", b.emulated_quantizer}, {"usage", name(b.usage)}};
  if (!b.interface.empty()) {
    Json tags = Json::array();
    for (const InterfaceTag& t : b.interface) tags.push_back(interface_string(t));
    j["interface"] = tags;
  }
  return j;
}

Json spec_json(const QuantSpec& q) {
  Json j{{"scaling", name(q.scaling)}, {"format", name(q.format)}, {"fp8_max", q.fp8_max()}};
  switch (q.scaling) {
    case ScalingKind::Delayed:
      j["history_length"] = q.history_length;
      j["amax_compute"] = name(q.amax_compute);
      j["margin"] = q.margin;
      break;
    case ScalingKind::Current:
      j["epsilon"] = q.epsilon;
      j["power_of_2_scale"] = q.power_of_2_scale;
      break;
    case ScalingKind::Block1D:
    case ScalingKind::Block2D:
    case ScalingKind::MicroScaled:
      j["block"] = Json::array({q.block.rows, q.block.cols});
      j["scale_dtype"] = name(q.scale_dtype);
      j["epsilon"] = q.epsilon;
      j["power_of_2_scale"] = q.power_of_2_scale;
      if (q.scaling == ScalingKind::MicroScaled) {
        j["rht"] = q.rht;
        j["stochastic_rounding"] = q.stochastic_rounding;
        j["seed"] = q.seed;
      }
      break;
  }
  return j;
}

Json quantizer_json(const QuantizerPlan& q) {
  Json j{{"index", q.index},
         {"name", q.name},
         {"role", name(q.role)},
         {"spec", spec_json(q.spec)},
         {"source_buffer", q.source_buffer >= 0 ? Json(q.source_buffer) : Json(nullptr)},
         {"rowwise", q.usages.rowwise},
         {"columnwise", q.usages.columnwise},
         {"columnwise_layout", name(q.columnwise_layout)}};
  if (q.boundary) j["boundary"] = true;  // absent otherwise: plans without one keep their bytes
  return j;
}

Json param_json(const SequencePlan& s, const ParamBinding& p) {
  Json j{{"field", p.field}, {"kind", name(p.kind)}};
  switch (p.kind) {
    case ParamKind::Null:
      break;
    case ParamKind::Buffer:
      j["buffer"] = p.buffers.at(0);
      j["written"] = p.written;
      if (p.columnwise_copy) j["columnwise_copy"] = true;
      break;
    case ParamKind::Buffers: {
      Json list = Json::array();
      for (int b : p.buffers) list.push_back(b >= 0 ? Json(b) : Json(nullptr));
      j["buffers"] = list;
      j["written"] = p.written;
      break;
    }
    case ParamKind::Quantizer:
      j["quantizer"] = p.quantizer;
      j["name"] = quantizer_ref(s, p.quantizer);
      j["value"] = name(p.quantizer_value);
      break;
    case ParamKind::Records:
      j["quantizers"] = p.records;
      break;
    case ParamKind::Int:
    case ParamKind::Int64:
      j["value"] = expr(p.int_value);
      break;
    case ParamKind::Float:
      j["value"] = p.float_value;
      break;
    case ParamKind::StatRecord:
    case ParamKind::Capture:
      j["slot"] = expr(p.int_value);
      break;
    case ParamKind::DropoutStep:  // the executor's counter: nothing more to name
      break;
  }
  return j;
}

Json launch_json(const SequencePlan& s, const LaunchStep& l) {
  Json dims = Json::object();
  for (const auto& [name, value] : l.grid.dims) dims[name] = expr(value);
  Json params = Json::array();
  for (const ParamBinding& p : l.params) params.push_back(param_json(s, p));
  return Json{
      {"kernel", l.kernel},
      {"name_expression", l.name_expression},
      {"block", l.block_threads},
      {"dynamic_smem_bytes", l.dynamic_smem_bytes},
      {"grid",
       {{"rule", l.grid.rule}, {"x", expr(l.grid.x)}, {"y", expr(l.grid.y)}, {"dims", dims}}},
      {"params", params}};
}

Json operand_json(const GemmOperand& o, bool transposed) {
  return Json{{"buffer", o.buffer},
              {"dtype", name(o.dtype)},
              {"transposed", transposed},
              {"usage", name(o.usage)},
              {"scale_inv", scale_inv_json(o.scale_inv)}};
}

// The row-major -> column-major mapping of runtime/gpu/gemm_desc.h's to_cublaslt(): cuBLASLt's
// A is our B and its B is our A; FP8 operands give "TN".
Json cublaslt_json(const GemmStep& g) {
  const std::string transa = g.b_transposed ? "T" : "N";
  const std::string transb = g.a_transposed ? "T" : "N";
  return Json{{"layout", transa + transb},
              {"m", expr(g.n)},
              {"n", expr(g.m)},
              {"k", expr(g.k)},
              {"a", "our B"},
              {"lda", expr(g.b_transposed ? g.k : g.n)},
              {"b", "our A"},
              {"ldb", expr(g.a_transposed ? g.m : g.k)},
              {"ldd", expr(g.n)}};
}

Json gemm_json(const SequencePlan& s, const GemmStep& g) {
  Json d{{"buffer", g.d}, {"dtype", name(g.d_dtype)}};
  if (g.d_quantizer >= 0) {
    d["scale"] = quantizer_ref(s, g.d_quantizer);
    d["amax"] = quantizer_ref(s, g.d_quantizer);
  }
  Json j{{"role", name(g.role)},
         {"m", expr(g.m)},
         {"n", expr(g.n)},
         {"k", expr(g.k)},
         {"a", operand_json(g.a, g.a_transposed)},
         {"b", operand_json(g.b, g.b_transposed)},
         {"d", d},
         {"epilogue", name(g.epilogue)},
         {"bias", g.bias >= 0 ? Json(g.bias) : Json(nullptr)},
         {"aux", g.aux >= 0 ? Json(g.aux) : Json(nullptr)},
         {"accumulate", g.accumulate},
         {"c", g.c >= 0 ? Json(g.c) : Json(nullptr)},
         {"fast_accum", g.fast_accum},
         {"cublaslt", cublaslt_json(g)}};
  const auto epilogue_json = [&](const GatedEpilogue& e) {
    Json out{{"activation", e.activation},
             {"step", e.step},
             {"output", e.output},
             {"quantizer", quantizer_ref(s, e.quantizer)}};
    if (e.output_t >= 0) out["output_t"] = e.output_t;
    return out;
  };
  if (const auto& e = g.inference_epilogue) j["inference_epilogue"] = epilogue_json(*e);
  if (const auto& e = g.training_epilogue) j["training_epilogue"] = epilogue_json(*e);
  return j;
}

Json step_json(const SequencePlan& s, const Step& step) {
  Json j{{"index", step.index}};
  j["kind"] = std::holds_alternative<LaunchStep>(step.body)
                  ? "launch"
                  : (std::holds_alternative<GemmStep>(step.body) ? "gemm" : "collective");
  j["group"] = step.group;
  if (!step.pattern.empty()) j["pattern"] = step.pattern;
  j["ops"] = op_refs(step.ops);
  j["what"] = step.what;
  if (const auto* launch = std::get_if<LaunchStep>(&step.body)) {
    j["launch"] = launch_json(s, *launch);
  } else if (const auto* gemm = std::get_if<GemmStep>(&step.body)) {
    j["gemm"] = gemm_json(s, *gemm);
  } else {
    const auto& c = std::get<CollectiveStep>(step.body);
    j["collective"] = {{"op", name(c.kind)},
                       {"dtype", name(c.dtype)},
                       {"count", expr(c.count)},
                       {"input", c.input},
                       {"output", c.output}};
  }
  j["reads"] = step.reads;
  j["writes"] = step.writes;
  if (step.inference) {
    Json variant = launch_json(s, step.inference->launch);
    variant["writes"] = step.inference->writes;
    variant["what"] = step.inference->what;
    j["inference"] = std::move(variant);
  }
  if (step.weight_cache_group >= 0) j["weight_cache_group"] = step.weight_cache_group;
  return j;
}

Json sequence_json(const SequencePlan& s) {
  Json quantizers = Json::array(), buffers = Json::array();
  for (const QuantizerPlan& q : s.quantizers) quantizers.push_back(quantizer_json(q));
  for (const Buffer& b : s.buffers) buffers.push_back(buffer_json(b));
  Json forward = Json::array(), backward = Json::array();
  for (const Step& step : s.steps)
    (step.phase == Phase::Forward ? forward : backward).push_back(step_json(s, step));
  Json caches = Json::array();
  for (const WeightCacheGroup& g : s.weight_cache_groups)
    caches.push_back({{"steps", g.steps}, {"params", g.params}, {"quantizers", g.quantizers}});
  Json j{{"name", s.name},
         {"recipe", s.recipe},
         {"fp8_weights", s.fp8_weights},
         {"symbols", s.symbols},
         {"quantizers", quantizers},
         {"buffers", buffers},
         {"weight_cache_groups", caches}};
  if (s.parallel.active()) {
    Json divisors = Json::object();
    for (const auto& [symbol, divisor] : s.symbol_divisors) divisors[symbol] = divisor;
    j["parallel"] = {{"tp", s.parallel.tp}, {"sp", s.parallel.sp}, {"symbol_divisors", divisors}};
  }
  if (!s.stat_slots.empty()) {
    Json slots = Json::array();
    for (const StatSlot& slot : s.stat_slots) {
      Json js{{"layer", slot.layer},
              {"tensor", slot.tensor},
              {"block_size", slot.block_size},
              {"dims", slot.dims}};
      if (slot.record != StatRecordKind::Moments) {  // moments slots keep their old spelling
        js["record"] = name(slot.record);
        js["cast"] = name(slot.cast);
        js["columnwise"] = slot.columnwise;
        js["format"] = name(slot.format);
      }
      if (slot.exponent_histogram) js["exponent_histogram"] = true;
      if (slot.record == StatRecordKind::ExponentHistogram) js["part"] = slot.part;
      slots.push_back(std::move(js));
    }
    j["stat_slots"] = std::move(slots);
  }
  if (!s.capture_slots.empty()) {
    Json slots = Json::array();
    for (const CaptureSlot& slot : s.capture_slots) {
      Json js{{"layer", slot.layer}, {"tensor", slot.tensor}, {"shape", exprs(slot.shape)}};
      if (slot.quantized) {
        js["quantized"] = true;
        js["format"] = name(slot.format);
        if (slot.block.rows > 0) js["block"] = {slot.block.rows, slot.block.cols};
        if (slot.columnwise) js["columnwise"] = true;
      }
      slots.push_back(std::move(js));
    }
    j["capture_slots"] = std::move(slots);
  }
  j["phases"] = Json::array({Json{{"phase", "forward"}, {"steps", forward}},
                             Json{{"phase", "backward"}, {"steps", backward}}});
  return j;
}

Json kernel_json(const Kernel& k) {
  Json uses = Json::array();
  for (const KernelUse& u : k.uses) {
    uses.push_back({{"sequence", u.sequence},
                    {"phase", name(u.phase)},
                    {"pattern", u.pattern},
                    {"ops", op_refs(u.ops)},
                    {"what", u.what},
                    {"quantizers", u.quantizers}});
  }
  return Json{{"id", k.id},
              {"file", "kernels/" + k.id + ".cu"},
              {"header", k.header},
              {"template", k.template_name},
              {"template_args", k.template_args},
              {"name_expression", k.name_expression},
              {"params_struct", k.params_struct},
              {"uses", uses}};
}

}  // namespace

nlohmann::ordered_json plan_to_json(const Plan& plan) {
  Json sequences = Json::array(), kernels = Json::array();
  for (const SequencePlan& s : plan.sequences) sequences.push_back(sequence_json(s));
  for (const Kernel& k : plan.kernels) kernels.push_back(kernel_json(k));
  return Json{{"format", "opfuse-plan"}, {"version", kPlanFormatVersion}, {"source", plan.source},
              {"arch", plan.arch},       {"sequences", sequences},        {"kernels", kernels}};
}

std::string plan_json_text(const Plan& plan) { return plan_to_json(plan).dump(2) + "\n"; }

nlohmann::ordered_json sequence_plan_json(const SequencePlan& sequence) {
  return sequence_json(sequence);
}

std::string interface_string(const InterfaceTag& tag) {
  return std::string(name(tag.kind)) + " " + tag.name;
}

const Kernel* Plan::find_kernel(std::string_view id) const {
  for (const Kernel& k : kernels)
    if (k.id == id) return &k;
  return nullptr;
}

}  // namespace opfuse::plan
