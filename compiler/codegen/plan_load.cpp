// plan.json back into a Plan (the runtime loads `fusec build` outputs): every field plan_json.cpp
// writes, checked as it is read; derived fields (the cuBLASLt mapping, kernel file names) are
// recomputed, not trusted.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "codegen/plan.h"

namespace opfuse::codegen {

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

// The enum value whose printed name is `name` (the writers' *_name functions).
template <typename Enum, std::size_t N, typename NameOf>
Enum by_name(const std::string& name, const Enum (&values)[N], NameOf name_of,
             const std::string& path) {
  for (Enum v : values)
    if (name_of(v) == name) return v;
  fail(path, fmt::format("unknown value \"{}\"", name));
}

constexpr ir::DType kDTypes[] = {ir::DType::BF16, ir::DType::FP16, ir::DType::FP32, ir::DType::E4M3,
                                 ir::DType::E5M2};
ir::DType dtype(const Json& j, const std::string& path, const char* key) {
  return by_name(get<std::string>(j, path, key), kDTypes, ir::dtype_name, sub(path, key));
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

Buffer read_buffer(const Json& j, const std::string& path) {
  constexpr BufferRole kRoles[] = {BufferRole::Input, BufferRole::Param, BufferRole::OutputGrad,
                                   BufferRole::Result, BufferRole::Workspace};
  Buffer b;
  b.id = get<int>(j, path, "id");
  b.name = get<std::string>(j, path, "name");
  b.role = by_name(get<std::string>(j, path, "role"), kRoles, buffer_role_name, sub(path, "role"));
  b.dtype = dtype(j, path, "dtype");
  const Json& shape = array(j, path, "shape");
  for (std::size_t i = 0; i < shape.size(); ++i)
    b.shape.push_back(expr(shape[i], at(sub(path, "shape"), i)));
  b.bytes = expr(j, path, "bytes");
  b.first_use = get<int>(j, path, "first_use");
  b.last_use = get<int>(j, path, "last_use");
  b.saved = get<bool>(j, path, "saved");
  if (j.contains("alias_of")) b.alias_of = get<int>(j, path, "alias_of");
  if (j.contains("quantizer")) {
    b.quantizer = get<int>(j, path, "quantizer");
    b.columnwise = get<bool>(j, path, "columnwise");
  }
  if (j.contains("interface")) b.interface = get<std::vector<std::string>>(j, path, "interface");
  return b;
}

QuantizerPlan read_quantizer(const Json& j, const std::string& path) {
  constexpr ir::QuantizerRole kRoles[] = {ir::QuantizerRole::Input, ir::QuantizerRole::Weight,
                                          ir::QuantizerRole::GradOutput, ir::QuantizerRole::Output,
                                          ir::QuantizerRole::GradInput};
  QuantizerPlan q;
  q.index = get<int>(j, path, "index");
  q.name = get<std::string>(j, path, "name");
  q.role = by_name(get<std::string>(j, path, "role"), kRoles, ir::quantizer_role_name,
                   sub(path, "role"));
  q.format = dtype(j, path, "format");
  q.source_buffer = optional_index(j, path, "source_buffer");
  q.rowwise = get<bool>(j, path, "rowwise");
  q.columnwise = get<bool>(j, path, "columnwise");
  q.mode = get<int>(j, path, "mode");
  q.fp8_max = get<float>(j, path, "fp8_max");
  if (q.mode == 2) {
    q.epsilon = get<double>(j, path, "epsilon");
    q.power_of_2_scale = get<bool>(j, path, "power_of_2_scale");
  } else {
    q.history_length = get<int>(j, path, "history_length");
    q.margin = get<int>(j, path, "margin");
  }
  return q;
}

ParamBinding read_param(const Json& j, const std::string& path) {
  constexpr ParamBinding::Kind kKinds[] = {
      ParamBinding::Kind::Null,      ParamBinding::Kind::Buffer,  ParamBinding::Kind::Buffers,
      ParamBinding::Kind::Quantizer, ParamBinding::Kind::Records, ParamBinding::Kind::Int,
      ParamBinding::Kind::Int64,     ParamBinding::Kind::Float};
  ParamBinding p;
  p.field = get<std::string>(j, path, "field");
  p.kind = by_name(get<std::string>(j, path, "kind"), kKinds, param_kind_name, sub(path, "kind"));
  switch (p.kind) {
    case ParamBinding::Kind::Null:
      break;
    case ParamBinding::Kind::Buffer:
      p.buffers = {get<int>(j, path, "buffer")};
      p.written = get<bool>(j, path, "written");
      break;
    case ParamBinding::Kind::Buffers: {
      const Json& list = array(j, path, "buffers");
      for (const Json& b : list) p.buffers.push_back(b.is_null() ? -1 : b.get<int>());
      p.written = get<bool>(j, path, "written");
      break;
    }
    case ParamBinding::Kind::Quantizer:
      p.quantizer = get<int>(j, path, "quantizer");
      p.quantizer_field = get<std::string>(j, path, "value");
      break;
    case ParamBinding::Kind::Records:
      p.records = get<std::vector<int>>(j, path, "quantizers");
      break;
    case ParamBinding::Kind::Int:
    case ParamBinding::Kind::Int64:
      p.int_value = expr(j, path, "value");
      break;
    case ParamBinding::Kind::Float:
      p.float_value = get<double>(j, path, "value");
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

GemmOperand read_operand(const Json& j, const std::string& path,
                         const std::vector<QuantizerPlan>& quantizers, bool* transposed) {
  GemmOperand o;
  o.buffer = get<int>(j, path, "buffer");
  o.dtype = dtype(j, path, "dtype");
  *transposed = get<bool>(j, path, "transposed");
  o.columnwise_copy = get<bool>(j, path, "columnwise_copy");
  const Json& scale = field(j, path, "scale_inv");
  if (!scale.is_null()) {
    const std::string name = scale.get<std::string>();
    for (const QuantizerPlan& q : quantizers)
      if (q.name == name) o.quantizer = q.index;
    if (o.quantizer < 0) fail(sub(path, "scale_inv"), fmt::format("no quantizer \"{}\"", name));
  }
  return o;
}

GemmStep read_gemm(const Json& j, const std::string& path,
                   const std::vector<QuantizerPlan>& quantizers) {
  constexpr GemmRole kRoles[] = {GemmRole::Fprop, GemmRole::Dgrad, GemmRole::Wgrad};
  GemmStep g;
  g.role = by_name(get<std::string>(j, path, "role"), kRoles, gemm_role_name, sub(path, "role"));
  g.m = expr(j, path, "m");
  g.n = expr(j, path, "n");
  g.k = expr(j, path, "k");
  g.a = read_operand(field(j, path, "a"), sub(path, "a"), quantizers, &g.a_transposed);
  g.b = read_operand(field(j, path, "b"), sub(path, "b"), quantizers, &g.b_transposed);
  const Json& d = field(j, path, "d");
  g.d = get<int>(d, sub(path, "d"), "buffer");
  g.d_dtype = dtype(d, sub(path, "d"), "dtype");
  if (d.contains("scale")) {
    const std::string name = get<std::string>(d, sub(path, "d"), "scale");
    for (const QuantizerPlan& q : quantizers)
      if (q.name == name) g.d_quantizer = q.index;
    if (g.d_quantizer < 0) fail(sub(path, "d.scale"), fmt::format("no quantizer \"{}\"", name));
  }
  g.epilogue = get<std::string>(j, path, "epilogue");
  g.bias = optional_index(j, path, "bias");
  g.aux = optional_index(j, path, "aux");
  g.accumulate = get<bool>(j, path, "accumulate");
  g.c = optional_index(j, path, "c");
  g.fast_accum = get<bool>(j, path, "fast_accum");
  return g;
}

// A forward launch's variant for inference forwards: a launch that writes part of what the step
// writes (plan.h, InferenceVariant).
InferenceVariant read_inference(const Json& j, const std::string& path, const Step& step) {
  const std::string variant_path = sub(path, "inference");
  const Json& v = field(j, path, "inference");
  if (!std::holds_alternative<LaunchStep>(step.body) || step.phase != ir::Phase::Forward)
    fail(variant_path, "only a forward launch has an inference variant");
  InferenceVariant variant;
  variant.launch = read_launch(v, variant_path);
  variant.writes = get<std::vector<int>>(v, variant_path, "writes");
  for (int id : variant.writes) {
    if (std::find(step.writes.begin(), step.writes.end(), id) == step.writes.end())
      fail(sub(variant_path, "writes"), fmt::format("buffer {} is not one the step writes", id));
  }
  return variant;
}

Step read_step(const Json& j, const std::string& path, ir::Phase phase,
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
  } else {
    fail(sub(path, "kind"), fmt::format("unknown step kind \"{}\"", kind));
  }
  s.reads = get<std::vector<int>>(j, path, "reads");
  s.writes = get<std::vector<int>>(j, path, "writes");
  if (j.contains("inference")) s.inference = read_inference(j, path, s);
  return s;
}

SequencePlan read_sequence(const Json& j, const std::string& path) {
  SequencePlan s;
  s.name = get<std::string>(j, path, "name");
  s.recipe = get<std::string>(j, path, "recipe");
  s.fp8_weights = get<bool>(j, path, "fp8_weights");
  s.symbols = get<std::vector<std::string>>(j, path, "symbols");
  const Json& quantizers = array(j, path, "quantizers");
  for (std::size_t i = 0; i < quantizers.size(); ++i)
    s.quantizers.push_back(read_quantizer(quantizers[i], at(sub(path, "quantizers"), i)));
  const Json& buffers = array(j, path, "buffers");
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    s.buffers.push_back(read_buffer(buffers[i], at(sub(path, "buffers"), i)));
    if (s.buffers.back().id != static_cast<int>(i))
      fail(at(sub(path, "buffers"), i), "id != index");
  }
  const Json& phases = array(j, path, "phases");
  for (std::size_t p = 0; p < phases.size(); ++p) {
    const std::string phase_path = at(sub(path, "phases"), p);
    const std::string name = get<std::string>(phases[p], phase_path, "phase");
    const ir::Phase phase = name == "forward"    ? ir::Phase::Forward
                            : name == "backward" ? ir::Phase::Backward
                                                 : (fail(sub(phase_path, "phase"), "unknown phase"),
                                                    ir::Phase::Forward);
    const Json& steps = array(phases[p], phase_path, "steps");
    for (std::size_t i = 0; i < steps.size(); ++i) {
      s.steps.push_back(read_step(steps[i], at(sub(phase_path, "steps"), i), phase, s.quantizers));
      if (s.steps.back().index != static_cast<int>(s.steps.size() - 1))
        fail(at(sub(phase_path, "steps"), i), "steps out of order");
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
    use.phase = get<std::string>(uses[i], p, "phase") == "backward" ? ir::Phase::Backward
                                                                    : ir::Phase::Forward;
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
  // Version 2: current scaling measured by the producing kernels (no memset steps).
  if (const int version = get<int>(json, root, "version"); version != 2)
    fail(sub(root, "version"),
         fmt::format("version {} is not the version 2 this opfuse reads: rebuild with this "
                     "opfuse's fusec",
                     version));
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

}  // namespace opfuse::codegen
