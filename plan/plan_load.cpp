// plan.json back into a Plan (the runtime loads `fusec build` outputs): every field plan_json.cpp
// writes, checked as it is read; derived fields (the cuBLASLt mapping, kernel file names) are
// recomputed, not trusted.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "plan/plan.h"

namespace opfuse::plan {

namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", path, what));
}

const Json& field(const Json& j, const std::string& path, const char* key) {
  if (!j.is_object()) fail(path, "not an object");
  const auto it = j.find(key);
  if (it == j.end()) fail(path, fmt::format("missing \"{}\"", key));
  return *it;
}

std::string sub(const std::string& path, const char* key) { return path + "." + key; }
std::string at(const std::string& path, std::size_t i) { return fmt::format("{}[{}]", path, i); }

template <typename T>
T get(const Json& j, const std::string& path, const char* key) {
  const Json& v = field(j, path, key);
  try {
    return v.get<T>();
  } catch (const nlohmann::json::exception&) {
    fail(sub(path, key), fmt::format("unexpected {}", v.type_name()));
  }
}

// An index field that may be null (-1).
int optional_index(const Json& j, const std::string& path, const char* key) {
  const Json& v = field(j, path, key);
  if (v.is_null()) return -1;
  if (!v.is_number_integer()) fail(sub(path, key), "not an integer or null");
  return v.get<int>();
}

SymExpr expr(const Json& v, const std::string& path) {
  if (v.is_number_integer()) return SymExpr(v.get<int64_t>());
  if (!v.is_string()) fail(path, "not an integer or a plan expression");
  try {
    return SymExpr::parse(v.get<std::string>());
  } catch (const std::invalid_argument& e) {
    fail(path, e.what());
  }
}

SymExpr expr(const Json& j, const std::string& path, const char* key) {
  return expr(field(j, path, key), sub(path, key));
}

const Json& array(const Json& j, const std::string& path, const char* key) {
  const Json& v = field(j, path, key);
  if (!v.is_array()) fail(sub(path, key), "not an array");
  return v;
}

// The enum value spelled by field `key` (plan/enums.h's name tables).
template <typename Enum>
Enum enum_field(const Json& j, const std::string& path, const char* key) {
  const std::string text = get<std::string>(j, path, key);
  const std::optional<Enum> value = parse<Enum>(text);
  if (!value) fail(sub(path, key), fmt::format("unknown value \"{}\"", text));
  return *value;
}

DType dtype(const Json& j, const std::string& path, const char* key) {
  return enum_field<DType>(j, path, key);
}

ScaleInvRef read_scale_inv(const Json& j, const std::string& path, const char* key) {
  const Json& v = field(j, path, key);
  ScaleInvRef r;
  if (v.is_null()) return r;
  const std::string p = sub(path, key);
  if (v.contains("quantizer")) r.quantizer = get<int>(v, p, "quantizer");
  if (v.contains("buffer")) r.buffer = get<int>(v, p, "buffer");
  if (!r.present()) fail(p, "names neither a quantizer nor a buffer");
  return r;
}

std::vector<OpRef> op_refs(const Json& j, const std::string& path, const char* key) {
  std::vector<OpRef> ops;
  const Json& list = array(j, path, key);
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string p = at(sub(path, key), i);
    ops.push_back({get<std::string>(list[i], p, "op"), get<std::string>(list[i], p, "instance"),
                   get<std::string>(list[i], p, "location")});
  }
  return ops;
}

Lifetime lifetime(const Json& j, const std::string& path, const char* key) {
  const auto steps = get<std::vector<int>>(j, path, key);
  if (steps.size() != 2 || steps[0] < -1 || steps[1] < steps[0] || (steps[0] < 0) != (steps[1] < 0))
    fail(sub(path, key), "not [first, last] step indices (-1, -1 for none)");
  return {steps[0], steps[1]};
}

Buffer read_buffer(const Json& j, const std::string& path) {
  Buffer b;
  b.id = get<int>(j, path, "id");
  b.name = get<std::string>(j, path, "name");
  b.role = enum_field<BufferRole>(j, path, "role");
  b.dtype = dtype(j, path, "dtype");
  const Json& shape = array(j, path, "shape");
  for (std::size_t i = 0; i < shape.size(); ++i)
    b.shape.push_back(expr(shape[i], at(sub(path, "shape"), i)));
  b.bytes = expr(j, path, "bytes");
  b.first_use = get<int>(j, path, "first_use");
  b.last_use = get<int>(j, path, "last_use");
  b.saved = get<bool>(j, path, "saved");
  if (j.contains("alias_of")) b.alias_of = get<int>(j, path, "alias_of");
  b.root = get<int>(j, path, "root");
  if (b.root == b.id) {
    b.training = lifetime(j, path, "training");
    b.inference = lifetime(j, path, "inference");
  }
  if (j.contains("weight_cache")) b.weight_cache = get<bool>(j, path, "weight_cache");
  if (b.role == BufferRole::Param) {
    const Json& init = field(j, path, "init");
    const std::string p = sub(path, "init");
    const std::string kind = get<std::string>(init, p, "kind");
    if (kind != "normal" && kind != "constant")
      fail(sub(p, "kind"), fmt::format("unknown value \"{}\"", kind));
    b.init = {kind == "normal" ? ParamInit::Kind::Normal : ParamInit::Kind::Constant,
              get<double>(init, p, "value")};
    if (j.contains("shard")) {
      const Json& shard = field(j, path, "shard");
      b.shard = {get<int>(shard, sub(path, "shard"), "dim"),
                 get<int>(shard, sub(path, "shard"), "blocks")};
      if (b.shard.dim < 0 || size_t(b.shard.dim) >= b.shape.size() || b.shard.blocks < 1)
        fail(sub(path, "shard"), "not a dimension of the parameter and a block count >= 1");
    }
  }
  if (j.contains("quantizer")) {
    b.quantizer = get<int>(j, path, "quantizer");
    b.usage = enum_field<CopyUsage>(j, path, "usage");
    b.layout = enum_field<CopyLayout>(j, path, "layout");
    b.scale_inv = read_scale_inv(j, path, "scale_inv");
  }
  if (j.contains("emulates")) {
    const Json& emulates = field(j, path, "emulates");
    b.emulated_quantizer = get<int>(emulates, sub(path, "emulates"), "quantizer");
    b.usage = enum_field<CopyUsage>(emulates, sub(path, "emulates"), "usage");
  }
  if (j.contains("interface")) {
    const Json& tags = array(j, path, "interface");
    for (std::size_t i = 0; i < tags.size(); ++i) {
      const std::string p = at(sub(path, "interface"), i);
      if (!tags[i].is_string()) fail(p, "not a string");
      const std::string text = tags[i].get<std::string>();
      const std::size_t space = text.find(' ');
      const std::optional<InterfaceKind> kind =
          space == std::string::npos ? std::nullopt : parse<InterfaceKind>(text.substr(0, space));
      if (!kind || space + 1 >= text.size())
        fail(p, fmt::format("\"{}\" is not \"output|input_grad|param_grad NAME\"", text));
      b.interface.push_back({*kind, text.substr(space + 1)});
    }
  }
  return b;
}

QuantSpec read_spec(const Json& j, const std::string& path) {
  QuantSpec q;
  q.scaling = enum_field<ScalingKind>(j, path, "scaling");
  q.format = dtype(j, path, "format");
  if (!dtype_is_fp8(q.format) &&
      !(q.format == DType::E2M1 && q.scaling == ScalingKind::MicroScaled))
    fail(sub(path, "format"), "not an FP8 format (or e2m1 under micro_scaled)");
  switch (q.scaling) {
    case ScalingKind::Delayed:
      q.history_length = get<int>(j, path, "history_length");
      if (q.history_length < 1) fail(sub(path, "history_length"), "must be at least 1");
      q.amax_compute = enum_field<AmaxCompute>(j, path, "amax_compute");
      q.margin = get<int>(j, path, "margin");
      break;
    case ScalingKind::Current:
      q.epsilon = get<double>(j, path, "epsilon");
      q.power_of_2_scale = get<bool>(j, path, "power_of_2_scale");
      break;
    case ScalingKind::Block1D:
    case ScalingKind::Block2D:
    case ScalingKind::MicroScaled: {
      const auto block = get<std::vector<int>>(j, path, "block");
      if (block.size() != 2 || block[0] < 1 || block[1] < 1)
        fail(sub(path, "block"), "not [rows, cols] of positive sizes");
      q.block = {block[0], block[1]};
      q.scale_dtype = enum_field<ScaleDType>(j, path, "scale_dtype");
      q.epsilon = get<double>(j, path, "epsilon");
      q.power_of_2_scale = get<bool>(j, path, "power_of_2_scale");
      if (q.scaling == ScalingKind::MicroScaled) {
        q.rht = get<bool>(j, path, "rht");
        q.stochastic_rounding = get<bool>(j, path, "stochastic_rounding");
        q.seed = get<uint32_t>(j, path, "seed");
      }
      break;
    }
  }
  return q;
}

QuantizerPlan read_quantizer(const Json& j, const std::string& path) {
  QuantizerPlan q;
  q.index = get<int>(j, path, "index");
  q.name = get<std::string>(j, path, "name");
  q.role = enum_field<QuantizerRole>(j, path, "role");
  q.spec = read_spec(field(j, path, "spec"), sub(path, "spec"));
  q.source_buffer = optional_index(j, path, "source_buffer");
  q.usages.rowwise = get<bool>(j, path, "rowwise");
  q.usages.columnwise = get<bool>(j, path, "columnwise");
  q.columnwise_layout = enum_field<CopyLayout>(j, path, "columnwise_layout");
  if (j.contains("boundary")) q.boundary = get<bool>(j, path, "boundary");
  return q;
}

ParamBinding read_param(const Json& j, const std::string& path) {
  ParamBinding p;
  p.field = get<std::string>(j, path, "field");
  p.kind = enum_field<ParamKind>(j, path, "kind");
  switch (p.kind) {
    case ParamKind::Null:
      break;
    case ParamKind::Buffer:
      p.buffers = {get<int>(j, path, "buffer")};
      p.written = get<bool>(j, path, "written");
      if (j.contains("columnwise_copy")) p.columnwise_copy = get<bool>(j, path, "columnwise_copy");
      break;
    case ParamKind::Buffers: {
      const Json& list = array(j, path, "buffers");
      for (const Json& b : list) p.buffers.push_back(b.is_null() ? -1 : b.get<int>());
      p.written = get<bool>(j, path, "written");
      break;
    }
    case ParamKind::Quantizer:
      p.quantizer = get<int>(j, path, "quantizer");
      p.quantizer_value = enum_field<QuantizerValue>(j, path, "value");
      break;
    case ParamKind::Records:
      p.records = get<std::vector<int>>(j, path, "quantizers");
      break;
    case ParamKind::Int:
    case ParamKind::Int64:
      p.int_value = expr(j, path, "value");
      break;
    case ParamKind::Float:
      p.float_value = get<double>(j, path, "value");
      break;
    case ParamKind::StatRecord:
    case ParamKind::Capture:
      p.int_value = expr(j, path, "slot");
      break;
    case ParamKind::DropoutStep:
      break;
  }
  return p;
}

LaunchStep read_launch(const Json& j, const std::string& path) {
  LaunchStep l;
  l.kernel = get<std::string>(j, path, "kernel");
  l.name_expression = get<std::string>(j, path, "name_expression");
  l.block_threads = get<int>(j, path, "block");
  l.dynamic_smem_bytes = get<int>(j, path, "dynamic_smem_bytes");
  const Json& grid = field(j, path, "grid");
  const std::string grid_path = sub(path, "grid");
  l.grid.rule = get<std::string>(grid, grid_path, "rule");
  l.grid.x = expr(grid, grid_path, "x");
  l.grid.y = expr(grid, grid_path, "y");
  const Json& dims = field(grid, grid_path, "dims");
  if (!dims.is_object()) fail(sub(grid_path, "dims"), "not an object");
  // ordered_json keeps the written order, so the plan reads back exactly.
  for (const auto& [name, value] : dims.items())
    l.grid.dims.emplace_back(name, expr(value, sub(grid_path, "dims") + "." + name));
  const Json& params = array(j, path, "params");
  for (std::size_t i = 0; i < params.size(); ++i)
    l.params.push_back(read_param(params[i], at(sub(path, "params"), i)));
  return l;
}

GemmOperand read_operand(const Json& j, const std::string& path, bool* transposed) {
  GemmOperand o;
  o.buffer = get<int>(j, path, "buffer");
  o.dtype = dtype(j, path, "dtype");
  *transposed = get<bool>(j, path, "transposed");
  o.usage = enum_field<CopyUsage>(j, path, "usage");
  o.scale_inv = read_scale_inv(j, path, "scale_inv");
  return o;
}

GemmStep read_gemm(const Json& j, const std::string& path,
                   const std::vector<QuantizerPlan>& quantizers) {
  GemmStep g;
  g.role = enum_field<GemmRole>(j, path, "role");
  g.m = expr(j, path, "m");
  g.n = expr(j, path, "n");
  g.k = expr(j, path, "k");
  g.a = read_operand(field(j, path, "a"), sub(path, "a"), &g.a_transposed);
  g.b = read_operand(field(j, path, "b"), sub(path, "b"), &g.b_transposed);
  const Json& d = field(j, path, "d");
  g.d = get<int>(d, sub(path, "d"), "buffer");
  g.d_dtype = dtype(d, sub(path, "d"), "dtype");
  if (d.contains("scale")) {
    const std::string name = get<std::string>(d, sub(path, "d"), "scale");
    for (const QuantizerPlan& q : quantizers)
      if (q.name == name) g.d_quantizer = q.index;
    if (g.d_quantizer < 0) fail(sub(path, "d.scale"), fmt::format("no quantizer \"{}\"", name));
  }
  g.epilogue = enum_field<GemmEpilogue>(j, path, "epilogue");
  g.bias = optional_index(j, path, "bias");
  g.aux = optional_index(j, path, "aux");
  g.accumulate = get<bool>(j, path, "accumulate");
  g.c = optional_index(j, path, "c");
  g.fast_accum = get<bool>(j, path, "fast_accum");
  for (const char* key : {"inference_epilogue", "training_epilogue"}) {
    if (!j.contains(key)) continue;
    const std::string e_path = sub(path, key);
    const Json& e = field(j, path, key);
    GatedEpilogue epilogue;
    epilogue.activation = get<std::string>(e, e_path, "activation");
    epilogue.step = get<int>(e, e_path, "step");
    epilogue.output = get<int>(e, e_path, "output");
    const bool training = std::string_view(key) == "training_epilogue";
    if (training)
      epilogue.output_t = get<int>(e, e_path, "output_t");
    else if (e.contains("output_t"))
      fail(sub(e_path, "output_t"), "an inference forward's epilogue writes no transposed copy");
    const std::string name = get<std::string>(e, e_path, "quantizer");
    for (const QuantizerPlan& q : quantizers)
      if (q.name == name) epilogue.quantizer = q.index;
    if (epilogue.quantizer < 0)
      fail(sub(e_path, "quantizer"), fmt::format("no quantizer \"{}\"", name));
    (training ? g.training_epilogue : g.inference_epilogue) = std::move(epilogue);
  }
  return g;
}

// A forward launch's variant for inference forwards: a launch that writes part of what the step
// writes (plan.h, InferenceVariant).
InferenceVariant read_inference(const Json& j, const std::string& path, const Step& step) {
  const std::string variant_path = sub(path, "inference");
  const Json& v = field(j, path, "inference");
  if (!std::holds_alternative<LaunchStep>(step.body) || step.phase != Phase::Forward)
    fail(variant_path, "only a forward launch has an inference variant");
  InferenceVariant variant;
  variant.launch = read_launch(v, variant_path);
  variant.writes = get<std::vector<int>>(v, variant_path, "writes");
  if (v.contains("what")) variant.what = get<std::string>(v, variant_path, "what");
  for (int id : variant.writes) {
    if (std::find(step.writes.begin(), step.writes.end(), id) == step.writes.end())
      fail(sub(variant_path, "writes"), fmt::format("buffer {} is not one the step writes", id));
  }
  return variant;
}

Step read_step(const Json& j, const std::string& path, Phase phase,
               const std::vector<QuantizerPlan>& quantizers) {
  Step s;
  s.index = get<int>(j, path, "index");
  s.phase = phase;
  s.group = get<int>(j, path, "group");
  if (j.contains("pattern")) s.pattern = get<std::string>(j, path, "pattern");
  s.ops = op_refs(j, path, "ops");
  s.what = get<std::string>(j, path, "what");
  const std::string kind = get<std::string>(j, path, "kind");
  if (kind == "launch") {
    s.body = read_launch(field(j, path, "launch"), sub(path, "launch"));
  } else if (kind == "gemm") {
    s.body = read_gemm(field(j, path, "gemm"), sub(path, "gemm"), quantizers);
  } else if (kind == "collective") {
    const Json& c = field(j, path, "collective");
    const std::string p = sub(path, "collective");
    CollectiveStep step;
    step.kind = enum_field<CollectiveKind>(c, p, "op");
    step.dtype = dtype(c, p, "dtype");
    step.count = expr(c, p, "count");
    step.input = get<int>(c, p, "input");
    step.output = get<int>(c, p, "output");
    s.body = step;
  } else {
    fail(sub(path, "kind"), fmt::format("unknown step kind \"{}\"", kind));
  }
  s.reads = get<std::vector<int>>(j, path, "reads");
  s.writes = get<std::vector<int>>(j, path, "writes");
  if (j.contains("inference")) s.inference = read_inference(j, path, s);
  if (j.contains("weight_cache_group"))
    s.weight_cache_group = get<int>(j, path, "weight_cache_group");
  return s;
}

SequencePlan read_sequence(const Json& j, const std::string& path) {
  SequencePlan s;
  s.name = get<std::string>(j, path, "name");
  s.recipe = get<std::string>(j, path, "recipe");
  s.fp8_weights = get<bool>(j, path, "fp8_weights");
  s.symbols = get<std::vector<std::string>>(j, path, "symbols");
  if (j.contains("parallel")) {
    const Json& par = field(j, path, "parallel");
    const std::string p = sub(path, "parallel");
    s.parallel = {get<int>(par, p, "tp"), get<bool>(par, p, "sp")};
    if (s.parallel.tp < 1) fail(sub(p, "tp"), "the group size must be >= 1");
    const Json& divisors = field(par, p, "symbol_divisors");
    for (const auto& [symbol, divisor] : divisors.items()) {
      if (!divisor.is_number_integer() || divisor.get<int64_t>() < 1)
        fail(sub(p, "symbol_divisors") + "." + symbol, "not a positive integer");
      s.symbol_divisors.emplace_back(symbol, divisor.get<int64_t>());
    }
  }
  const Json& quantizers = array(j, path, "quantizers");
  for (std::size_t i = 0; i < quantizers.size(); ++i)
    s.quantizers.push_back(read_quantizer(quantizers[i], at(sub(path, "quantizers"), i)));
  const Json& buffers = array(j, path, "buffers");
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    s.buffers.push_back(read_buffer(buffers[i], at(sub(path, "buffers"), i)));
    if (s.buffers.back().id != static_cast<int>(i))
      fail(at(sub(path, "buffers"), i), "id != index");
  }
  const Json& caches = array(j, path, "weight_cache_groups");
  for (std::size_t i = 0; i < caches.size(); ++i) {
    const std::string p = at(sub(path, "weight_cache_groups"), i);
    s.weight_cache_groups.push_back({get<std::vector<int>>(caches[i], p, "steps"),
                                     get<std::vector<int>>(caches[i], p, "params"),
                                     get<std::vector<int>>(caches[i], p, "quantizers")});
  }
  if (j.contains("stat_slots")) {
    const Json& slots = array(j, path, "stat_slots");
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const std::string p = at(sub(path, "stat_slots"), i);
      StatSlot slot{get<std::string>(slots[i], p, "layer"), get<std::string>(slots[i], p, "tensor"),
                    get<int>(slots[i], p, "block_size"), get<int>(slots[i], p, "dims")};
      if (slots[i].contains("record")) {
        slot.record = enum_field<StatRecordKind>(slots[i], p, "record");
        slot.cast = enum_field<QuantStatCast>(slots[i], p, "cast");
        slot.columnwise = get<bool>(slots[i], p, "columnwise");
        slot.format = enum_field<DType>(slots[i], p, "format");
      }
      if (slots[i].contains("exponent_histogram"))
        slot.exponent_histogram = get<bool>(slots[i], p, "exponent_histogram");
      if (slots[i].contains("part")) slot.part = get<int>(slots[i], p, "part");
      s.stat_slots.push_back(std::move(slot));
    }
  }
  if (j.contains("capture_slots")) {
    const Json& slots = array(j, path, "capture_slots");
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const std::string p = at(sub(path, "capture_slots"), i);
      CaptureSlot slot{
          get<std::string>(slots[i], p, "layer"), get<std::string>(slots[i], p, "tensor"), {}};
      const Json& shape = array(slots[i], p, "shape");
      for (std::size_t d = 0; d < shape.size(); ++d)
        slot.shape.push_back(expr(shape[d], at(sub(p, "shape"), d)));
      if (slots[i].contains("quantized")) {
        slot.quantized = get<bool>(slots[i], p, "quantized");
        slot.format = enum_field<DType>(slots[i], p, "format");
        if (slots[i].contains("block")) {
          const auto block = get<std::vector<int>>(slots[i], p, "block");
          if (block.size() != 2) fail(sub(p, "block"), "want [rows, cols]");
          slot.block = {block[0], block[1]};
        }
        if (slots[i].contains("columnwise")) slot.columnwise = get<bool>(slots[i], p, "columnwise");
      }
      s.capture_slots.push_back(std::move(slot));
    }
  }
  const Json& phases = array(j, path, "phases");
  for (std::size_t p = 0; p < phases.size(); ++p) {
    const std::string phase_path = at(sub(path, "phases"), p);
    const Phase phase = enum_field<Phase>(phases[p], phase_path, "phase");
    const Json& steps = array(phases[p], phase_path, "steps");
    for (std::size_t i = 0; i < steps.size(); ++i) {
      s.steps.push_back(read_step(steps[i], at(sub(phase_path, "steps"), i), phase, s.quantizers));
      if (s.steps.back().index != static_cast<int>(s.steps.size() - 1))
        fail(at(sub(phase_path, "steps"), i), "steps out of order");
    }
  }
  // A fused epilogue names a later forward launch of its sequence and some of its buffers.
  for (const Step& step : s.steps) {
    const auto* gemm = std::get_if<GemmStep>(&step.body);
    if (gemm == nullptr) continue;
    for (const auto* epilogue : {&gemm->inference_epilogue, &gemm->training_epilogue}) {
      if (!*epilogue) continue;
      const GatedEpilogue& e = **epilogue;
      const std::string e_path = fmt::format(
          "{}.steps[index {}].gemm.{}", path, step.index,
          epilogue == &gemm->inference_epilogue ? "inference_epilogue" : "training_epilogue");
      if (step.phase != Phase::Forward || e.step <= step.index ||
          e.step >= static_cast<int>(s.steps.size()) ||
          !std::holds_alternative<LaunchStep>(s.steps[static_cast<std::size_t>(e.step)].body) ||
          s.steps[static_cast<std::size_t>(e.step)].phase != Phase::Forward)
        fail(sub(e_path, "step"), "not a later forward launch of a forward GEMM");
      const auto buffers = static_cast<int>(s.buffers.size());
      if (e.output < 0 || e.output >= buffers)
        fail(sub(e_path, "output"), fmt::format("no buffer {}", e.output));
      if (epilogue == &gemm->training_epilogue && (e.output_t < 0 || e.output_t >= buffers))
        fail(sub(e_path, "output_t"), fmt::format("no buffer {}", e.output_t));
      // The GEMM writes them: their memory must be live from its step (an older plan placed
      // them from the activation's step, over the GEMM's own operands).
      const bool training = epilogue == &gemm->training_epilogue;
      std::vector<int> written = {e.output};
      if (training) written.push_back(e.output_t);
      for (const int id : written) {
        const int root = s.buffers[static_cast<std::size_t>(id)].root;
        if (root < 0 || root >= buffers) continue;  // the buffers' own checks name it
        const Lifetime& life = training ? s.buffers[static_cast<std::size_t>(root)].training
                                        : s.buffers[static_cast<std::size_t>(root)].inference;
        if (life.first < 0 || life.first > step.index)
          fail(sub(e_path, id == e.output ? "output" : "output_t"),
               fmt::format("buffer {} is live only from step {}, after the GEMM (step {}) that "
                           "writes it: a plan from an older opfuse; rebuild it",
                           id, life.first, step.index));
      }
    }
  }
  return s;
}

Kernel read_kernel(const Json& j, const std::string& path) {
  Kernel k;
  k.id = get<std::string>(j, path, "id");
  k.header = get<std::string>(j, path, "header");
  k.template_name = get<std::string>(j, path, "template");
  k.template_args = get<std::vector<std::string>>(j, path, "template_args");
  k.name_expression = get<std::string>(j, path, "name_expression");
  k.params_struct = get<std::string>(j, path, "params_struct");
  const Json& uses = array(j, path, "uses");
  for (std::size_t i = 0; i < uses.size(); ++i) {
    const std::string p = at(sub(path, "uses"), i);
    KernelUse use;
    use.sequence = get<std::string>(uses[i], p, "sequence");
    use.phase = enum_field<Phase>(uses[i], p, "phase");
    use.pattern = get<std::string>(uses[i], p, "pattern");
    use.ops = op_refs(uses[i], p, "ops");
    use.what = get<std::string>(uses[i], p, "what");
    use.quantizers = get<std::vector<std::string>>(uses[i], p, "quantizers");
    k.uses.push_back(std::move(use));
  }
  return k;
}

}  // namespace

Plan plan_from_json(const nlohmann::ordered_json& json) {
  const std::string root = "plan";
  if (get<std::string>(json, root, "format") != "opfuse-plan")
    fail(sub(root, "format"), "not an opfuse plan");
  // Version 3: typed quantizer specs (scaling kind, usages, layouts), scale-inverse references
  // and enum spellings where version 2 had mode numbers and field names.
  if (const int version = get<int>(json, root, "version"); version != kPlanFormatVersion)
    fail(sub(root, "version"),
         fmt::format("plan.json is format version {}, but this opfuse reads version {}: rebuild "
                     "it with this opfuse's `fusec build`",
                     version, kPlanFormatVersion));
  Plan plan;
  plan.source = get<std::string>(json, root, "source");
  plan.arch = get<std::string>(json, root, "arch");
  const Json& sequences = array(json, root, "sequences");
  for (std::size_t i = 0; i < sequences.size(); ++i)
    plan.sequences.push_back(read_sequence(sequences[i], at(sub(root, "sequences"), i)));
  const Json& kernels = array(json, root, "kernels");
  for (std::size_t i = 0; i < kernels.size(); ++i)
    plan.kernels.push_back(read_kernel(kernels[i], at(sub(root, "kernels"), i)));
  return plan;
}

}  // namespace opfuse::plan
