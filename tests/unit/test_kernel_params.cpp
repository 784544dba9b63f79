// Packing a launch step's ParamBindings into its kernel's params struct
// (runtime/gpu/kernel_params.h): the layout rules, the packed values, and, for every kernel every
// dsl_examples program launches (its own recipe and bf16, fused and unfused; training launches and
// inference variants), and of a program with learned op parameters and a declared fusion, of one
// with dropout and of one whose GEMM operand a debug config modifies pointwise, the layout checked
// against the CUDA compiler: NVRTC compiles the kernel with checks of each field's size,
// alignment, name and position and of the struct's size, and the cubin's parameter records must
// give the packed size. Needs NVRTC, not a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "codegen/kernel_source.h"
#include "codegen/plan.h"
#include "debug_clip_feature.h"
#include "debug_config/routing.h"
#include "driver/compile.h"
#include "driver/frontend.h"
#include "gpu/kernel_params.h"
#include "jit/cubin_info.h"
#include "jit/nvrtc_compiler.h"
#include "opfuse/error.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "test_support.h"

namespace opfuse::gpu {
namespace {

namespace fs = std::filesystem;
using codegen::ParamBinding;
using Kind = plan::ParamKind;

ParamBinding binding(std::string field, Kind kind, std::vector<int> buffers = {}) {
  ParamBinding p;
  p.field = std::move(field);
  p.kind = kind;
  p.buffers = std::move(buffers);
  return p;
}

ParamBinding int_binding(std::string field, Kind kind, codegen::SymExpr value) {
  ParamBinding p = binding(std::move(field), kind);
  p.int_value = std::move(value);
  return p;
}

// ---- layout rules -------------------------------------------------------------------------------

TEST(KernelParamsLayout, PointersIntsFloatsAndArraysTakeTheirNaturalAlignment) {
  const std::vector<ParamBinding> params = {
      binding("x", Kind::Buffer, {0}),              // 0..8
      int_binding("rows", Kind::Int, 4),            // 8..12
      binding("epsilon", Kind::Float),              // 12..16
      int_binding("count", Kind::Int64, 5),         // 16..24
      binding("partials", Kind::Buffers, {1, -1}),  // 24..40
      binding("scale", Kind::Quantizer),            // 40..48
      int_binding("cols", Kind::Int, 8),            // 48..52, then padding to 56
  };
  const ParamLayout layout = param_layout(params);
  ASSERT_EQ(layout.fields.size(), params.size());
  const std::vector<std::size_t> offsets = {0, 8, 12, 16, 24, 40, 48};
  const std::vector<std::size_t> sizes = {8, 4, 4, 8, 16, 8, 4};
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(layout.fields[i].offset, offsets[i]) << params[i].field;
    EXPECT_EQ(layout.fields[i].bytes, sizes[i]) << params[i].field;
  }
  EXPECT_EQ(layout.alignment, 8u);
  EXPECT_EQ(layout.bytes, 56u);
}

TEST(KernelParamsLayout, AnIntAfterAnIntPacksAndAPointerAfterAnIntIsPadded) {
  const ParamLayout two_ints =
      param_layout({int_binding("a", Kind::Int, 1), int_binding("b", Kind::Int, 2)});
  EXPECT_EQ(two_ints.fields[1].offset, 4u);
  EXPECT_EQ(two_ints.bytes, 8u);
  EXPECT_EQ(two_ints.alignment, 4u);
  const ParamLayout padded =
      param_layout({int_binding("count", Kind::Int, 1), binding("records", Kind::Records)});
  EXPECT_EQ(padded.fields[1].offset, 8u);
  EXPECT_EQ(padded.bytes, 16u);
}

TEST(KernelParamsLayout, AnArrayOfNoBuffersIsAUsageError) {
  EXPECT_THROW(param_layout({binding("partials", Kind::Buffers, {})}), UsageError);
}

// ---- packed values ------------------------------------------------------------------------------

template <typename T>
T read_at(const std::vector<unsigned char>& bytes, std::size_t offset) {
  T value{};
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

TEST(KernelParamsPack, ValuesLandAtTheirOffsetsAndBufferSlotsAreFilledPerLaunch) {
  ParamBinding quantizer = binding("scale", Kind::Quantizer);
  quantizer.quantizer = 3;
  quantizer.quantizer_value = plan::QuantizerValue::Scale;
  ParamBinding epsilon = binding("epsilon", Kind::Float);
  epsilon.float_value = 1e-5;
  const std::vector<ParamBinding> params = {
      binding("x", Kind::Buffer, {7}),
      binding("beta", Kind::Null),
      quantizer,
      epsilon,
      int_binding("rows", Kind::Int, codegen::SymExpr::symbol("tokens") * 2),
      int_binding("count", Kind::Int64, codegen::SymExpr::symbol("tokens") * 4096),
      binding("outputs", Kind::Buffers, {9, -1}),
  };
  static int fake_scale = 0;
  PackedParams packed = pack_params(params, {{"tokens", 3'000'000}}, [](const ParamBinding& p) {
    EXPECT_EQ(p.quantizer, 3);
    return static_cast<const void*>(&fake_scale);
  });
  const ParamLayout layout = param_layout(params);
  ASSERT_EQ(packed.bytes.size(), layout.bytes);
  EXPECT_EQ(read_at<const void*>(packed.bytes, layout.fields[1].offset), nullptr);
  EXPECT_EQ(read_at<const void*>(packed.bytes, layout.fields[2].offset), &fake_scale);
  EXPECT_EQ(read_at<float>(packed.bytes, layout.fields[3].offset), 1e-5f);
  EXPECT_EQ(read_at<int>(packed.bytes, layout.fields[4].offset), 6'000'000);
  EXPECT_EQ(read_at<long long>(packed.bytes, layout.fields[5].offset), 3'000'000LL * 4096);
  ASSERT_EQ(packed.buffer_slots.size(), 2u);  // x and outputs[0]; outputs[1] stays null

  static char memory[16];
  packed.set_buffers([](int buffer) { return static_cast<const void*>(memory + buffer); });
  EXPECT_EQ(read_at<const void*>(packed.bytes, layout.fields[0].offset), memory + 7);
  EXPECT_EQ(read_at<const void*>(packed.bytes, layout.fields[6].offset), memory + 9);
  EXPECT_EQ(read_at<const void*>(packed.bytes, layout.fields[6].offset + 8), nullptr);
}

TEST(KernelParamsPack, AnIntBeyond32BitsIsAUsageErrorNamingTheField) {
  const std::vector<ParamBinding> params = {
      int_binding("rows", Kind::Int, codegen::SymExpr::symbol("tokens") * 4096)};
  try {
    pack_params(params, {{"tokens", 1'000'000}}, nullptr);
    FAIL() << "packed an int of 4096000000";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("'rows'"), std::string::npos) << error.what();
  }
  EXPECT_THROW(pack_params(params, {}, nullptr), UsageError) << "tokens is unbound";
}

// ---- against the CUDA compiler ------------------------------------------------------------------

// Learned parameters (scalar and per feature, plain and gated: the activation kernels' `learned`
// arrays) and a declared fusion (bias_add's constant factor) that no example uses.
constexpr const char* kUserOpsAndFusions = R"(
recipe fp8 = delayed_scaling()
op affine_gelu(x) params(w: fp32[128] = 1.0, s: fp32[] = 0.5) = s * gelu(w * x)
gated op scaled_glu(a, b) params(g: bf16[64] = 0.5) = g * silu(a) * b
op ln_like(x, eps: number = 1e-5) params(g: fp32[128] = 1.0, b: bf16[] = 0.0) =
    g * (x - mean_last(x)) * rsqrt(mean_last((x - mean_last(x)) ^ 2) + eps) + b
op softmax_like(x) = exp(x - max_last(x)) / sum_last(exp(x - max_last(x)))
fusion axpy { constant_scale; add_extra_input }
import "std"
sequence s(x: bf16[tokens, 64], r: bf16[tokens, 64]) -> (y: bf16[tokens, 64]) uses fp8 {
  linear(64, 128, bias = false) as fc1
  affine_gelu()
  ln_like()
  softmax_like()
  linear(128, 128, bias = false) as fc2
  scaled_glu()
  l2_normalization()
  constant_scale(0.5)
  add_extra_input(r)
}
)";

// Dropout between an activation and a linear (templates/dropout.cuh): the training forward with
// its mask and step counter, its inference variant, the backward and the end-of-step advance.
constexpr const char* kDropout = R"(
recipe fp8 = delayed_scaling()
sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 96]) uses fp8 {
  gelu()
  dropout(p = 0.2, seed = 5)
  linear(64, 96)
}
)";

// A pointwise modification of fc1's input from a debug config (templates/activation.cuh run as a
// modify kernel, compiler/codegen/emit_modify.cpp).
constexpr const char* kModified = R"(
recipe fp8 = delayed_scaling()
sequence s(x: bf16[tokens, 64]) -> (y: bf16[tokens, 96]) uses fp8 {
  linear(64, 96, bias = false) as fc1
}
)";

// A program compiled to its plan (`options` as given, fused or with the fusion passes off):
// the text `source` named "extra.fuse", or, with `path`, that file.
void add_plan(driver::CompileOptions options, bool fused, std::vector<codegen::Plan>& plans,
              const std::string& source, const std::string& path = {}) {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  if (!fused) options.disabled_passes = {"fuse-forward", "fuse-backward"};
  options.last_stage = driver::Stage::Plan;
  driver::CompileResult result =
      path.empty() ? driver::compile_source("extra.fuse", source, sources, diags, options)
                   : driver::compile_file(path, sources, diags, options);
  EXPECT_TRUE(result.ok()) << path << diags.format_all() << result.error;
  if (result.ok()) plans.push_back(std::move(result.plan));
}

// A config clipping the activation fc1 reads in fprop and wgrad (the test's C++ feature Clip)
// and its routing, which points into the config (its sections and features): both live here.
struct ClipRouting {
  std::optional<debug::DebugConfig> config;
  debug::Routing routing;
};

std::unique_ptr<ClipRouting> clip_routing() {
  SourceManager sources;
  DiagnosticEngine diags(sources);
  auto registry = std::make_shared<debug::FeatureRegistry>(debug::FeatureRegistry::with_builtins());
  registry->add(std::make_shared<test::Clip>());
  const FileId f =
      sources.add_buffer("debug.yaml",
                         "a:\n  layers: {exact_layer_names: [fc1]}\n  transformer_engine:\n"
                         "    Clip: {gemms: [fprop, wgrad], tensors: [activation], c: 0.5}\n");
  auto clip = std::make_unique<ClipRouting>();
  clip->config = debug::read_debug_config(sources, f, registry, diags);
  EXPECT_TRUE(clip->config) << diags.format_all();
  if (clip->config)
    clip->routing = debug::route(debug::bind_layers(*clip->config, {{"fc1", {}, true}}, diags), 0);
  return clip;
}

std::vector<codegen::Plan> example_plans() {
  std::vector<codegen::Plan> plans;
  for (const bool fused : {true, false}) {
    add_plan({}, fused, plans, kUserOpsAndFusions);
    add_plan({}, fused, plans, kDropout);
  }
  const std::unique_ptr<ClipRouting> clip = clip_routing();
  driver::CompileOptions routed;
  routed.debug_routing = &clip->routing;
  add_plan(routed, true, plans, kModified);
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(test::source_path("dsl_examples"))) {
    if (entry.path().extension() == ".fuse") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    for (const char* recipe : {"", "bf16"}) {
      driver::CompileOptions options;
      options.recipe = recipe;
      for (const bool fused : {true, false}) add_plan(options, fused, plans, {}, file.string());
    }
  }
  return plans;
}

// What NVRTC checks of the params struct against the bindings: each named field's size and
// alignment, the struct's size and alignment, its field count (a structured binding needs one name
// per field) and the fields' names and order (C++20 designated initializers must follow the
// declaration order). With every field known by size, alignment and position, the offsets are
// C++'s, which param_layout computes. (NVRTC has no constant offsetof to compare directly.)
std::string layout_checks(const std::string& params_struct,
                          const std::vector<ParamBinding>& params) {
  const ParamLayout layout = param_layout(params);
  std::string text = "\nnamespace opfuse_params_check {\nusing P = " + params_struct + ";\n";
  text += "static_assert(sizeof(P) == " + std::to_string(layout.bytes) + ", \"struct size\");\n";
  text += "static_assert(alignof(P) == " + std::to_string(layout.alignment) +
          ", \"struct alignment\");\n";
  std::string names, designators;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string& field = params[i].field;
    const ParamField& expected = layout.fields[i];
    text += "static_assert(sizeof(P::" + field + ") == " + std::to_string(expected.bytes) +
            " && alignof(decltype(P::" + field + ")) == " + std::to_string(expected.alignment) +
            ", \"size or alignment of " + field + "\");\n";
    names += (i == 0 ? "f" : ", f") + std::to_string(i);
    designators += (i == 0 ? "." : ", .") + field + " = {}";
  }
  text += "__device__ inline void check_fields(P p) {\n  auto [" + names + "] = p;\n";
  for (std::size_t i = 0; i < params.size(); ++i) text += "  (void)f" + std::to_string(i) + ";\n";
  text += "  P in_order{" + designators + "};\n  (void)in_order;\n}\n";
  text += "}  // namespace opfuse_params_check\n";
  return text;
}

struct KernelCheck {
  std::string id;
  std::string name_expression;
  std::string params_struct;
  std::string kernel_source;         // without the checks
  std::vector<ParamBinding> params;  // the first launch's
  int launches = 0;
};

// Adds `launch` to the check of its kernel; a later launch of a kernel must bind the same fields
// in the same layout as the first.
void add_launch_check(const codegen::Plan& plan, const codegen::SequencePlan& sequence,
                      const codegen::LaunchStep& launch,
                      std::map<std::string, KernelCheck>& checks) {
  const codegen::Kernel* kernel = plan.find_kernel(launch.kernel);
  EXPECT_NE(kernel, nullptr) << launch.kernel;
  if (kernel == nullptr) return;
  auto [it, inserted] = checks.try_emplace(kernel->name_expression);
  KernelCheck& check = it->second;
  ++check.launches;
  if (inserted) {
    check.id = kernel->id;
    check.name_expression = kernel->name_expression;
    check.params = launch.params;
    check.params_struct = kernel->params_struct;
    check.kernel_source = codegen::kernel_source(plan, *kernel);
    return;
  }
  const ParamLayout first = param_layout(check.params);
  const ParamLayout here = param_layout(launch.params);
  EXPECT_EQ(here.bytes, first.bytes) << kernel->id << " in " << sequence.name;
  EXPECT_EQ(launch.params.size(), check.params.size()) << kernel->id;
  if (launch.params.size() != check.params.size()) return;
  for (std::size_t i = 0; i < check.params.size(); ++i) {
    EXPECT_EQ(launch.params[i].field, check.params[i].field) << kernel->id;
    EXPECT_EQ(here.fields[i].offset, first.fields[i].offset) << kernel->id;
  }
}

// The launches a step can make: its own, and its inference variant's where it has one.
std::vector<const codegen::LaunchStep*> launches_of(const codegen::Step& step) {
  std::vector<const codegen::LaunchStep*> launches;
  if (const auto* launch = std::get_if<codegen::LaunchStep>(&step.body)) launches.push_back(launch);
  if (step.inference) launches.push_back(&step.inference->launch);
  return launches;
}

// One check per distinct kernel of every example plan, inference variants included.
std::vector<KernelCheck> kernel_checks() {
  std::map<std::string, KernelCheck> checks;
  for (const codegen::Plan& plan : example_plans()) {
    for (const codegen::SequencePlan& sequence : plan.sequences) {
      for (const codegen::Step& step : sequence.steps) {
        for (const codegen::LaunchStep* launch : launches_of(step))
          add_launch_check(plan, sequence, *launch, checks);
      }
    }
  }
  std::vector<KernelCheck> list;
  for (auto& [expression, check] : checks) list.push_back(std::move(check));
  return list;
}

jit::CompileRequest request_for(const KernelCheck& check) {
  jit::CompileRequest request;
  request.kernel_name = check.id + "_params_check";
  request.source = check.kernel_source + layout_checks(check.params_struct, check.params);
  request.name_expressions = {check.name_expression};
  request.arch = "sm_90a";
  // Why C++20: designated initializers (the field-order check); the layout is the same as C++17's.
  request.extra_options = {"-std=c++20"};
  return request;
}

TEST(KernelParamsCubin, EveryExampleKernelsPackedLayoutIsTheCompilersLayout) {
  const std::vector<KernelCheck> checks = kernel_checks();
  ASSERT_GE(checks.size(), 15u) << "the examples launch fewer kernels than expected";
  std::vector<jit::CompileRequest> requests;
  requests.reserve(checks.size());
  for (const KernelCheck& check : checks) requests.push_back(request_for(check));
  // A failed check makes the compile throw, naming the kernel and the field.
  const jit::CompileAllResult result = jit::compile_all(requests, nullptr);
  ASSERT_EQ(result.kernels.size(), checks.size());
  std::set<std::string> templates;
  for (std::size_t i = 0; i < checks.size(); ++i) {
    SCOPED_TRACE(checks[i].id);
    const jit::CompiledKernel& compiled = result.kernels[i];
    const std::string& symbol = compiled.lowered_names.at(checks[i].name_expression);
    const jit::CubinInfo info = jit::read_cubin_info(compiled.binary);
    const auto entry =
        std::find_if(info.functions.begin(), info.functions.end(),
                     [&](const jit::CubinFunction& function) { return function.name == symbol; });
    ASSERT_NE(entry, info.functions.end());
    const std::size_t packed = param_layout(checks[i].params).bytes;
    EXPECT_EQ(entry->params_bytes, static_cast<int>(packed));
    ASSERT_EQ(entry->params.size(), 1u) << "one params struct by value";
    EXPECT_EQ(entry->params[0].offset, 0);
    EXPECT_EQ(entry->params[0].bytes, static_cast<int>(packed));
    templates.insert(checks[i].params.front().field + "/" + std::to_string(packed));
  }
  std::size_t launches = 0;
  for (const KernelCheck& check : checks) launches += static_cast<std::size_t>(check.launches);
  RecordProperty("kernels", static_cast<int>(checks.size()));
  RecordProperty("launches", static_cast<int>(launches));
  EXPECT_GE(templates.size(), 6u) << "too few distinct params structs were checked";
  // Only inference variants launch this instantiation (training launches write the copy).
  EXPECT_TRUE(std::any_of(checks.begin(), checks.end(), [](const KernelCheck& check) {
    return check.id == "layernorm_fwd_bf16_e4m3_4096";
  })) << "the inference variants' kernels were not checked";
  EXPECT_TRUE(std::any_of(checks.begin(), checks.end(), [](const KernelCheck& check) {
    return check.name_expression.find("pointwise_expr") != std::string::npos;
  })) << "the debug modification's kernel was not checked";
  EXPECT_TRUE(std::any_of(checks.begin(), checks.end(), [](const KernelCheck& check) {
    return check.params.back().field == "learned_partial";
  })) << "no backward kernel with learned parameters was checked";
}

// Compiles `check` expecting NVRTC to reject it with a log containing `reason`.
void expect_rejected(const KernelCheck& check, const std::string& reason) {
  try {
    jit::compile_kernel(request_for(check));
    ADD_FAILURE() << "compiled, but the bindings differ from the struct (" << reason << ")";
  } catch (const jit::JitError& error) {
    EXPECT_NE(std::string(error.what()).find(reason), std::string::npos) << error.what();
  }
}

// The check above can fail: a binding list with a field dropped, an int where the struct has a
// pointer, or two fields of one type swapped no longer compiles.
TEST(KernelParamsCubin, ALayoutThatDiffersFromTheStructFailsToCompile) {
  std::vector<KernelCheck> checks = kernel_checks();
  const auto norm = std::find_if(checks.begin(), checks.end(), [](const KernelCheck& check) {
    return check.id.starts_with("layernorm_fwd_");
  });
  ASSERT_NE(norm, checks.end());
  KernelCheck dropped = *norm;
  dropped.params.pop_back();  // `rows`: the size stays 80 (padding), the field count does not
  expect_rejected(dropped, "more elements than there are binding names");

  KernelCheck retyped = *norm;
  for (ParamBinding& param : retyped.params) {
    if (param.field == "gamma") param.kind = Kind::Int;  // a pointer in NormFwdParams
  }
  expect_rejected(retyped, "size or alignment of gamma");

  KernelCheck swapped = *norm;
  const auto field = [&](const char* name) {
    return std::find_if(swapped.params.begin(), swapped.params.end(),
                        [&](const ParamBinding& p) { return p.field == name; });
  };
  ASSERT_NE(field("y"), swapped.params.end());
  std::iter_swap(field("y"), field("y_t"));  // both Output*: sizes agree, positions do not
  expect_rejected(swapped, "out-of-order initializers");
}

}  // namespace
}  // namespace opfuse::gpu
