// The kernel-template table (compiler/codegen/kernel_templates.h) against templates/README.md,
// the contract it transcribes: every entry documented, README's name expressions rebuilt through
// the table character for character, bad argument lists rejected. The Clang template checker
// (tools/check_templates/check_templates.cpp) compares the table with the CUDA sources themselves.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "codegen/kernel_templates.h"
#include "test_support.h"

namespace opfuse::codegen {
namespace {

const std::string& readme() {
  static const std::string kText = test::read_text(test::source_path("templates/README.md"));
  return kText;
}

struct ReadmeExample {
  std::string expression;  // "opfuse::rmsnorm_bwd<__nv_bfloat16, 4096>"
  std::string name;        // "rmsnorm_bwd"
  std::vector<std::string> args;
};

// Every `opfuse::name<args>` name expression the README spells out.
std::vector<ReadmeExample> readme_examples() {
  static const std::regex kExpression(R"(opfuse::(\w+)<([^<>`]*)>)");
  std::vector<ReadmeExample> examples;
  const std::string& text = readme();
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kExpression);
       it != std::sregex_iterator(); ++it) {
    ReadmeExample example{(*it)[0].str(), (*it)[1].str(), {}};
    const std::string args = (*it)[2].str();
    for (size_t start = 0; start < args.size();) {
      const size_t comma = args.find(", ", start);
      example.args.push_back(args.substr(start, comma - start));
      start = comma == std::string::npos ? args.size() : comma + 2;
    }
    examples.push_back(std::move(example));
  }
  return examples;
}

std::vector<std::string> to_strings(std::span<const std::string_view> views) {
  return {views.begin(), views.end()};
}

const KernelTemplate& entry(std::string_view name) {
  const KernelTemplate* found = find_kernel_template(name);
  if (found == nullptr) throw std::logic_error("no table entry " + std::string(name));
  return *found;
}

TEST(KernelTemplateTable, EveryEntryIsDocumentedInTheReadme) {
  ASSERT_GE(kernel_templates().size(), 16u);  // templates/README.md lists 16 entry points
  for (const KernelTemplate& t : kernel_templates()) {
    EXPECT_TRUE(std::regex_search(readme(), std::regex("\\b" + std::string(t.name) + "\\b")))
        << t.name << " is not in templates/README.md";
    EXPECT_NE(readme().find(std::string(t.params_struct)), std::string::npos)
        << t.params_struct << " (" << t.name << ") is not in templates/README.md";
    EXPECT_TRUE(
        std::filesystem::is_regular_file(test::source_path("templates/" + std::string(t.header))))
        << t.name << ": no templates/" << t.header;
  }
}

TEST(KernelTemplateTable, ReadmeExamplesComeOutExactlyAsWritten) {
  const std::vector<ReadmeExample> examples = readme_examples();
  std::set<std::string> names_with_examples;
  for (const ReadmeExample& example : examples) {
    const KernelTemplate* t = find_kernel_template(example.name);
    if (t == nullptr) continue;  // opfuse::launch and other namespaces
    names_with_examples.insert(example.name);
    EXPECT_EQ(name_expression(*t, example.args), example.expression);
  }
  // Every entry but activation_fwd has an example in the README today.
  EXPECT_GE(names_with_examples.size(), 13u);
}

TEST(KernelTemplateTable, TableExamplesAreValidAndMatchTheReadme) {
  const std::vector<ReadmeExample> examples = readme_examples();
  for (const KernelTemplate& t : kernel_templates()) {
    const std::string expression = name_expression(t, t.example_args);
    bool readme_has_one = false;
    bool readme_has_this = false;
    for (const ReadmeExample& example : examples) {
      readme_has_one |= example.name == t.name;
      readme_has_this |= example.expression == expression;
    }
    // The checker instantiates the table's example: it should be one the README promises.
    if (readme_has_one) {
      EXPECT_TRUE(readme_has_this) << expression << " is not in the README";
    }
  }
}

TEST(KernelTemplateTable, BuildsTheNameExpressionsCodegenNeeds) {
  const std::vector<std::string> rmsnorm = {"__nv_bfloat16", "__nv_fp8_e4m3", "4096", "false",
                                            "true"};
  EXPECT_EQ(name_expression(entry("rmsnorm_fwd"), rmsnorm),
            "opfuse::rmsnorm_fwd<__nv_bfloat16, __nv_fp8_e4m3, 4096, false, true>");
  const std::vector<std::string> swiglu = {"opfuse::pointwise_swiglu", "__nv_bfloat16",
                                           "__nv_fp8_e5m2", "true", "true"};
  EXPECT_EQ(
      name_expression(entry("gated_activation_bwd"), swiglu),
      "opfuse::gated_activation_bwd<opfuse::pointwise_swiglu, __nv_bfloat16, __nv_fp8_e5m2, true, "
      "true>");
  // Every parameter defaulted: an empty argument list is a valid expression.
  EXPECT_EQ(name_expression(entry("update_scales"), std::vector<std::string>{}),
            "opfuse::update_scales<>");
  EXPECT_EQ(name_expression(entry("layernorm_bwd"), std::vector<std::string>{"float", "-1"}),
            "opfuse::layernorm_bwd<float, -1>");
}

void expect_rejected(std::string_view name, const std::vector<std::string>& args,
                     const std::string& message_part) {
  try {
    const std::string expression = name_expression(entry(name), args);
    ADD_FAILURE() << "accepted " << expression;
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find(message_part), std::string::npos) << error.what();
  }
}

TEST(KernelTemplateTable, ScaleAndFakeQuantizeSpellTheirDtypesAndFlags) {
  EXPECT_EQ(name_expression(entry("constant_scale"),
                            std::vector<std::string>{"__half", "__nv_fp8_e4m3", "true"}),
            "opfuse::constant_scale<__half, __nv_fp8_e4m3, true>");
  EXPECT_EQ(
      name_expression(entry("fake_quantize"), std::vector<std::string>{"float", "__nv_fp8_e5m2"}),
      "opfuse::fake_quantize<float, __nv_fp8_e5m2>");
  expect_rejected("fake_quantize", {"__nv_bfloat16"}, "takes 2 template arguments, got 1");
  expect_rejected("constant_scale", {"__nv_bfloat16", "__nv_bfloat16", "false", "true"}, "got 4");
  expect_rejected("constant_scale", {"__nv_bfloat16", "2.0"}, "argument 2 (Output)");
}

TEST(KernelTemplateTable, BadArgumentListsThrow) {
  expect_rejected("rmsnorm_fwd", {"__nv_bfloat16", "__nv_fp8_e4m3"}, "takes 3 to 5");
  expect_rejected("rmsnorm_fwd", {"__nv_bfloat16", "__nv_fp8_e4m3", "4096", "false", "true", "1"},
                  "got 6");
  expect_rejected("amax_reduce", {}, "takes 1 template argument, got 0");
  expect_rejected("rmsnorm_fwd", {"bf16", "__nv_fp8_e4m3", "4096"}, "argument 1 (Input)");
  expect_rejected("rmsnorm_fwd", {"__nv_bfloat16", "__nv_fp8_e4m3", "4096.0"},
                  "argument 3 (kHidden) must be a decimal int");
  // 010 would be octal 8 in C++; 0x10 and +16 are not decimal spellings.
  for (const char* bad : {"010", "0x10", "+16", "", "4096 ", "99999999999"}) {
    expect_rejected("rmsnorm_bwd", {"__nv_bfloat16", bad}, "kHidden");
  }
  expect_rejected("rmsnorm_bwd", {"__nv_bfloat16", "4096", "1"}, "must be true or false");
  expect_rejected("activation_fwd", {"pointwise_silu", "__nv_bfloat16", "__nv_bfloat16"},
                  "argument 1 (Act) must be a generated pointwise functor");
  expect_rejected("activation_fwd", {"opfuse::pointwise_swish", "__nv_bfloat16", "__nv_bfloat16"},
                  "Act");
  // An attribute the op does not have, or one it has left out, names no functor.
  expect_rejected("activation_fwd",
                  {"opfuse::pointwise_silu_limit_7", "__nv_bfloat16", "__nv_bfloat16"}, "Act");
  expect_rejected("gated_activation_fwd",
                  {"opfuse::pointwise_clamped_swiglu_limit_7", "__nv_bfloat16", "__nv_bfloat16"},
                  "Act");
  expect_rejected("activation_fwd", {"__nv_bfloat16", "opfuse::pointwise_silu", "__nv_bfloat16"},
                  "argument 1 (Act)");
  expect_rejected("update_scales", {"true"}, "kThreads");
}

TEST(KernelTemplateTable, DefaultsFollowRequiredParamsAndFitTheirKinds) {
  std::set<std::string_view> names;
  for (const KernelTemplate& t : kernel_templates()) {
    EXPECT_TRUE(names.insert(t.name).second) << "duplicate entry " << t.name;
    EXPECT_TRUE(t.params_struct.ends_with("Params")) << t.name;
    bool defaults_started = false;
    std::vector<std::string> full = to_strings(t.example_args);
    for (size_t i = 0; i < t.params.size(); ++i) {
      const TemplateParam& p = t.params[i];
      if (!p.default_value.empty()) defaults_started = true;
      EXPECT_FALSE(defaults_started && p.default_value.empty())
          << t.name << ": required " << p.name << " after a defaulted parameter";
      if (i >= full.size()) full.emplace_back(p.default_value);
    }
    // The example completed with the defaults must itself be a valid argument list.
    EXPECT_NO_THROW(name_expression(t, full)) << t.name;
  }
}

TEST(KernelTemplateTable, FamiliesMapToTheirTemplates) {
  auto names = [](ir::KernelFamily family) {
    std::set<std::string_view> found;
    for (const KernelTemplate* t : kernel_templates_for(family)) found.insert(t->name);
    return found;
  };
  // No generated kernel: cuBLASLt and no data movement.
  EXPECT_TRUE(names(ir::KernelFamily::Gemm).empty());
  EXPECT_TRUE(names(ir::KernelFamily::Alias).empty());
  EXPECT_EQ(names(ir::KernelFamily::Scale), (std::set<std::string_view>{"constant_scale"}));
  // The user quantize op is of the cast family: fake_quantize, with amax_reduce and
  // update_scales under current scaling.
  EXPECT_TRUE(names(ir::KernelFamily::Cast).contains("fake_quantize"));
  EXPECT_TRUE(names(ir::KernelFamily::Cast).contains("amax_reduce"));
  EXPECT_EQ(names(ir::KernelFamily::Norm),
            (std::set<std::string_view>{"layernorm_fwd", "rmsnorm_fwd", "layernorm_block_fwd",
                                        "rmsnorm_block_fwd", "layernorm_micro_fwd",
                                        "rmsnorm_micro_fwd", "layernorm_bwd", "rmsnorm_bwd",
                                        "reduce_column_partials", "row_expr_fwd", "row_expr_bwd"}));
  EXPECT_TRUE(names(ir::KernelFamily::Residual).contains("bias_add"));
  EXPECT_TRUE(names(ir::KernelFamily::Bias).contains("bias_add"));
  EXPECT_TRUE(names(ir::KernelFamily::Bias).contains("dbias_partial"));
  EXPECT_TRUE(names(ir::KernelFamily::Cast).contains("cast_transpose"));
  EXPECT_TRUE(names(ir::KernelFamily::GatedActivation).contains("gated_activation_bwd"));
  EXPECT_FALSE(names(ir::KernelFamily::GatedActivation).contains("activation_fwd"));
  // Every op whose family generates a kernel finds at least one template.
  for (const ir::OpInfo& op : ir::all_ops()) {
    // GEMMs are cuBLASLt's, collectives NCCL's (runtime/comm); aliases move no data.
    if (op.family == ir::KernelFamily::Gemm || op.family == ir::KernelFamily::Alias ||
        op.family == ir::KernelFamily::Collective)
      continue;
    EXPECT_FALSE(kernel_templates_for(op.family).empty()) << op.name;
  }
}

TEST(KernelTemplateTable, DtypeAndActivationSpellingsRoundTrip) {
  for (const ir::DType d :
       {ir::DType::BF16, ir::DType::FP16, ir::DType::FP32, ir::DType::E4M3, ir::DType::E5M2}) {
    const std::string_view spelling = cuda_dtype_spelling(d);
    EXPECT_EQ(parse_cuda_dtype_spelling(spelling), d) << spelling;
    EXPECT_NE(readme().find("`" + std::string(spelling) + "`"), std::string::npos) << spelling;
  }
  EXPECT_EQ(cuda_dtype_spelling(ir::DType::BF16), "__nv_bfloat16");
  EXPECT_EQ(cuda_dtype_spelling(ir::DType::E5M2), "__nv_fp8_e5m2");
  EXPECT_FALSE(parse_cuda_dtype_spelling("bf16").has_value());
  for (const std::string_view functor : activation_spellings()) {
    EXPECT_NE(readme().find("`" + std::string(functor) + "`"), std::string::npos) << functor;
  }
  // ExampleIdentity, ExampleProduct (activation.cuh), ExampleRowL2 (row_expr.cuh).
  EXPECT_EQ(activation_spellings().size(), 3u);
}

}  // namespace
}  // namespace opfuse::codegen
