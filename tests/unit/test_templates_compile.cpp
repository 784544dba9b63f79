// The CUDA kernel templates (templates/) compiled through NVRTC: every family x arch (sm_89,
// sm_90a, sm_100a) x input dtype (bf16, fp16, fp32) with FP8 E4M3/E5M2 outputs and the main
// options, plus the seed MLP's kernels (hidden 4096, ffn 28672, bf16 in, FP8 out, sm_90a) one per
// compile with register budgets and no spills. Also: the launch rules codegen relies on, each
// header compiling on its own with nvcc, and the README naming every entry point.
//
// Time: one NVRTC program per (family, arch, dtype) holds all of that combination's
// instantiations, so headers are parsed once per case, not once per kernel: 96 NVRTC programs of
// 0.1-3 s and 22 nvcc header compiles of ~1.5-3 s; ~55 s with ctest -j2 on 2 cores (~115 s of
// CPU) before the block-scaled cast, whose 9 programs add ~20 s of CPU. Needs NVRTC (and nvcc for
// the header cases, skipped without it), not a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "../../runtime/jit/nvrtc_compiler.h"
#include "../../templates/common/launch_rules.h"
#include "ir/pointwise_ops.h"
#include "ir/row_expr.h"
#include "test_support.h"

namespace opfuse {
namespace {

namespace fs = std::filesystem;

struct TemplateCase {
  std::string name;  // gtest parameter name
  std::string header;
  std::vector<std::string> name_expressions;
  std::string arch;
  // > 0: the ptxas register count of every kernel of the case must stay within this budget.
  int register_budget = 0;
  std::string prelude = {};  // source after the header's #include (generated functors)
};

struct Dtype {
  std::string tag;   // for test names
  std::string type;  // CUDA spelling
  int hidden;        // norm width exercised for this dtype (see norm_case)
};

const std::vector<std::string>& archs() {
  static const std::vector<std::string> kArchs = {"sm_89", "sm_90a", "sm_100a"};
  return kArchs;
}

// Norm widths: bf16 4096 (the seed MLP, 32-row transposed tiles), fp16 1000 (not a multiple of
// the row group's vectors: idle slots), fp32 8192 (too wide for 32-row tiles: 16-row tiles).
const std::vector<Dtype>& input_dtypes() {
  static const std::vector<Dtype> kDtypes = {
      {"bf16", "__nv_bfloat16", 4096}, {"fp16", "__half", 1000}, {"fp32", "float", 8192}};
  return kDtypes;
}

constexpr const char* kE4m3 = "__nv_fp8_e4m3";
constexpr const char* kE5m2 = "__nv_fp8_e5m2";

std::string args(std::initializer_list<std::string> parts) {
  std::string joined;
  for (const std::string& part : parts) joined += (joined.empty() ? "" : ", ") + part;
  return joined;
}

TemplateCase norm_case(const std::string& arch, const Dtype& in) {
  const std::string h = std::to_string(in.hidden);
  const std::string t = in.type;
  TemplateCase c{"norm_" + in.tag + "_" + arch,
                 "norm.cuh",
                 {"opfuse::layernorm_fwd<" + args({t, t, h}) + ">",
                  "opfuse::layernorm_fwd<" + args({t, kE4m3, h, "false", "true"}) + ">",
                  "opfuse::layernorm_fwd<" + args({t, kE5m2, h, "true", "false"}) + ">",
                  "opfuse::rmsnorm_fwd<" + args({t, t, h, "true"}) + ">",
                  "opfuse::rmsnorm_fwd<" + args({t, kE4m3, h, "true", "true"}) + ">",
                  "opfuse::layernorm_bwd<" + args({t, h}) + ">",
                  "opfuse::rmsnorm_bwd<" + args({t, h, "true"}) + ">",
                  "opfuse::reduce_column_partials<" + t + ">"},
                 arch};
  // float8_block_scaling's norm: rows a multiple of 128 wide.
  c.name_expressions.push_back("opfuse::layernorm_block_fwd<" +
                               args({t, kE4m3, "1024", "false", "true"}) + ">");
  c.name_expressions.push_back("opfuse::rmsnorm_block_fwd<" +
                               args({t, kE5m2, "1024", "true", "false"}) + ">");
  // mxfp8_block_scaling's norm (the decoded 1 x 32 row-wise copy): rows a multiple of 32 wide.
  c.name_expressions.push_back("opfuse::layernorm_micro_fwd<" +
                               args({t, "0", "1024", "false", "true"}) + ">");
  c.name_expressions.push_back("opfuse::rmsnorm_micro_fwd<" +
                               args({t, "1", "640", "true", "false"}) + ">");
  return c;
}

// The generated functor of every pointwise op (compiler/ir/pointwise_ops.h) of one kind (plain or
// gated) with its default attributes: their names, and their sources to compile with the header.
std::vector<std::string> pointwise_functors(bool gated, std::string& sources) {
  std::vector<std::string> names;
  for (const ir::PointwiseDef* def : ir::pointwise_defs()) {
    if (def->gated != gated) continue;
    ir::AttrList attrs;
    for (const ir::AttrSpec& spec : def->attrs)
      attrs.push_back({std::string(spec.name), spec.default_value});
    names.push_back(ir::pointwise_functor_name(*def, attrs));
    sources += *ir::pointwise_functor_source(names.back());
  }
  return names;
}

// Every pointwise op in a plain or gated kernel, forward and backward, across outputs/options.
// Norm-like user-defined ops (templates/row_expr.cuh): the contract's example and a generated
// functor (an RMSNorm with a bf16 per-feature weight and a scalar fp32 offset: a mean, learned
// parameters forward and their column sums backward), into the input dtype and into fp32.
TemplateCase row_expr_case(const std::string& arch, const Dtype& in) {
  ir::scalar::Graph g;
  const ir::RowVars v{2};
  const ir::scalar::NodeId x = g.var(ir::RowVars::x());
  ir::RowProgram forward;
  forward.stages.push_back({ir::RowReduce::Mean, g.mul(x, x)});
  forward.outputs.push_back(g.add(
      g.mul(g.mul(g.var(v.param(0)), x), g.rsqrt(g.add(g.var(v.scalar(0)), g.constant(1e-5)))),
      g.var(v.param(1))));
  const ir::RowProgram backward = ir::derive_row_backward(g, forward, 2);
  const std::vector<ir::UserParam> params = {{"w", ir::DType::BF16, 64, 1.0},
                                             {"b", ir::DType::FP32, 0, 0.0}};
  const std::string functor = ir::row_functor_name(
      ir::user_row_attrs("rms", ir::encode_row_expression(g, forward, backward),
                         ir::encode_row_stages(forward.stages), ir::encode_user_params(params)));
  TemplateCase c{"row_expr_" + in.tag + "_" + arch, "row_expr.cuh", {}, arch};
  c.prelude = ir::row_functor_source(functor).value_or("#error no row functor\n");
  for (const std::string& f : {std::string("opfuse::ExampleRowL2"), functor}) {
    for (const std::string& out : {in.type, std::string("float")}) {
      c.name_expressions.push_back("opfuse::row_expr_fwd<" + args({f, in.type, out}) + ">");
      c.name_expressions.push_back("opfuse::row_expr_bwd<" + args({f, in.type, out}) + ">");
    }
  }
  return c;
}

TemplateCase activation_case(const std::string& arch, const Dtype& in, bool gated) {
  const std::string t = in.type;
  const std::string fwd = gated ? "opfuse::gated_activation_fwd<" : "opfuse::activation_fwd<";
  const std::string bwd = gated ? "opfuse::gated_activation_bwd<" : "opfuse::activation_bwd<";
  TemplateCase c{std::string(gated ? "gated_activation_" : "activation_") + in.tag + "_" + arch,
                 "activation.cuh",
                 {},
                 arch};
  // The options rotate over the ops so every op meets FP8 outputs, transposes and dbias.
  const std::vector<std::vector<std::string>> fwd_options = {
      {kE4m3, "true"}, {t}, {kE5m2, "false"}, {kE4m3, "false"}};
  const std::vector<std::vector<std::string>> bwd_options = {
      {kE5m2, "true", "true"}, {t, "false", "true"}, {kE5m2, "true", "false"}, {t}};
  const std::vector<std::string> functors = pointwise_functors(gated, c.prelude);
  for (size_t i = 0; i < functors.size(); ++i) {
    std::string f = functors[i] + ", " + t, b = f;
    for (const std::string& o : fwd_options[i % fwd_options.size()]) f += ", " + o;
    for (const std::string& o : bwd_options[i % bwd_options.size()]) b += ", " + o;
    c.name_expressions.push_back(fwd + f + ">");
    c.name_expressions.push_back(bwd + b + ">");
  }
  // mxfp8_block_scaling: the decoded 1 x 32 row-wise copy (E4M3 with the output, E5M2 without).
  const std::string micro =
      gated ? "opfuse::gated_activation_micro_fwd<" : "opfuse::activation_micro_fwd<";
  c.name_expressions.push_back(micro + functors.front() + ", " + t + ", 0, true>");
  c.name_expressions.push_back(micro + functors.back() + ", " + t + ", 1, false>");
  const std::string micro_bwd =
      gated ? "opfuse::gated_activation_micro_bwd<" : "opfuse::activation_micro_bwd<";
  c.name_expressions.push_back(micro_bwd + functors.front() + ", " + t + ", 1, true>");
  c.name_expressions.push_back(micro_bwd + functors.back() + ", " + t + ", 0, false>");
  if (!gated) {
    // A functor with a learned parameter (a user-defined op's params): read per column forward,
    // its gradient's column sums backward (with an FP8 output, its transpose and dbias), and the
    // scalar's final sum.
    c.name_expressions.push_back(fwd + "opfuse::ExampleLearnedScale, " + t + ", " + kE4m3 +
                                 ", true>");
    c.name_expressions.push_back(bwd + "opfuse::ExampleLearnedScale, " + t + ", " + kE5m2 +
                                 ", true, true>");
    c.name_expressions.push_back(bwd + "opfuse::ExampleLearnedScale, " + t + ", " + t + ">");
    c.name_expressions.push_back("opfuse::learned_scalar_sum<" + t + ">");
  }
  return c;
}

TemplateCase cast_case(const std::string& arch, const Dtype& in) {
  const std::string t = in.type;
  return {"cast_transpose_" + in.tag + "_" + arch,
          "cast_transpose.cuh",
          {"opfuse::cast_transpose<" + args({t, kE4m3, "true", "false"}) + ">",
           "opfuse::cast_transpose<" + args({t, kE5m2, "true", "true"}) + ">",
           "opfuse::cast_transpose<" + args({t, kE4m3, "false", "false"}) + ">",
           "opfuse::cast_transpose<" + args({t, "__nv_bfloat16", "false", "true"}) + ">",
           "opfuse::reduce_column_partials<" + t + ">"},
          arch};
}

TemplateCase bias_case(const std::string& arch, const Dtype& in) {
  const std::string t = in.type;
  return {"bias_" + in.tag + "_" + arch,
          "bias.cuh",
          {"opfuse::bias_add<" + args({t, kE4m3, "true", "true", "true"}) + ">",
           "opfuse::bias_add<" + args({t, t, "true", "false", "false"}) + ">",
           "opfuse::bias_add<" + args({t, kE5m2, "false", "true", "false"}) + ">",
           "opfuse::dbias_partial<" + t + ">", "opfuse::reduce_column_partials<" + t + ">"},
          arch};
}

// constant_scale (plain and FP8 + transposed copy) and fake_quantize through both FP8 formats.
TemplateCase scale_case(const std::string& arch, const Dtype& in) {
  const std::string t = in.type;
  return {"scale_" + in.tag + "_" + arch,
          "scale.cuh",
          {"opfuse::constant_scale<" + args({t, t}) + ">",
           "opfuse::constant_scale<" + args({t, kE4m3, "true"}) + ">",
           "opfuse::fake_quantize<" + args({t, kE4m3}) + ">",
           "opfuse::fake_quantize<" + args({t, kE5m2}) + ">"},
          arch};
}

// dropout: the training forward (mask drawn and written), its inference variant (y = x), the
// backward from the saved bits and the end-of-step counter advance.
TemplateCase dropout_case(const std::string& arch, const Dtype& in) {
  const std::string t = in.type;
  return {"dropout_" + in.tag + "_" + arch,
          "dropout.cuh",
          {"opfuse::dropout_fwd<" + args({t, "true"}) + ">",
           "opfuse::dropout_fwd<" + args({t, "false"}) + ">", "opfuse::dropout_bwd<" + t + ">",
           "opfuse::dropout_advance_step<>"},
          arch};
}

// Block-scaled casts (TE's Float8BlockScaling): 1-D and 2-D blocks into both FP8 formats with
// both copies, and without the column-wise copy, within the family's register budget.
TemplateCase block_cast_case(const std::string& arch, const Dtype& in) {
  const std::string t = in.type;
  TemplateCase c{"block_cast_" + in.tag + "_" + arch, "block_cast.cuh", {}, arch};
  for (const char* output : {kE4m3, kE5m2}) {
    for (const char* two_d : {"false", "true"}) {
      c.name_expressions.push_back("opfuse::block_cast_transpose<" + args({t, output, two_d}) +
                                   ">");
    }
  }
  c.name_expressions.push_back("opfuse::block_cast_transpose<" +
                               args({t, kE4m3, "false", "false"}) + ">");
  c.name_expressions.push_back("opfuse::block_cast_transpose<" + args({t, kE5m2, "true", "false"}) +
                               ">");
  c.register_budget = launch::block_cast_register_budget(t == "float" ? 4 : 2);
  return c;
}

// Block-scaled activations (float8_block_scaling with the cast folded into the activation):
// every pointwise op forward into E4M3 and backward into E5M2, with and without the column-wise
// copy and dbias, within the family's budgets (forward 80, plain backward 128, gated backward 64
// at 512 threads: a case each). 2-byte inputs only (block_activation.cuh).
std::vector<TemplateCase> block_activation_cases(const std::string& arch, const Dtype& in) {
  if (in.type == "float") return {};
  const std::string t = in.type;
  std::vector<TemplateCase> cases;
  for (const bool gated : {false, true}) {
    const std::string kind = gated ? "gated_" : "";
    TemplateCase fwd{"block_" + kind + "activation_fwd_" + in.tag + "_" + arch,
                     "block_activation.cuh",
                     {},
                     arch};
    fwd.register_budget = launch::block_activation_register_budget(false, 1);
    TemplateCase bwd{"block_" + kind + "activation_bwd_" + in.tag + "_" + arch,
                     "block_activation.cuh",
                     {},
                     arch};
    bwd.register_budget = launch::block_activation_register_budget(true, gated ? 2 : 1);
    const std::vector<std::string> functors = pointwise_functors(gated, fwd.prelude);
    bwd.prelude = fwd.prelude;
    for (size_t i = 0; i < functors.size(); ++i) {
      const std::string transpose = i % 2 == 0 ? "true" : "false";
      const std::string dbias = i % 3 == 0 ? "false" : "true";
      fwd.name_expressions.push_back("opfuse::block_" + kind + "activation_fwd<" +
                                     args({functors[i], t, kE4m3, transpose}) + ">");
      bwd.name_expressions.push_back("opfuse::block_" + kind + "activation_bwd<" +
                                     args({functors[i], t, kE5m2, "true", dbias}) + ">");
    }
    cases.push_back(std::move(fwd));
    cases.push_back(std::move(bwd));
  }
  return cases;
}

// Micro-scaled casts (MXFP8, NVFP4 emulated on Hopper): every format and copy, NVFP4's 2-D
// blocks, Hadamard transform and stochastic rounding, decoded-only casts, and the transformed
// copy's amax, within the family's register budget.
TemplateCase micro_scale_case(const std::string& arch, const Dtype& in) {
  const std::string t = in.type;
  const std::string bf16 = "__nv_bfloat16";
  TemplateCase c{"micro_scale_" + in.tag + "_" + arch, "micro_scale.cuh", {}, arch};
  const std::vector<std::vector<std::string>> options = {
      {t, "0", "false"},                                        // MXFP8 E4M3 rowwise
      {bf16, "0", "true"},                                      // MXFP8 E4M3 columnwise
      {t, "1", "false"},                                        // MXFP8 E5M2 rowwise
      {bf16, "1", "true", "false", "false", "false", "false"},  // columnwise, y only
      {t, "2", "false"},                                        // NVFP4 rowwise
      {bf16, "2", "true"},                                      // NVFP4 columnwise
      {bf16, "2", "false", "true"},                             // 2-D rowwise
      {t, "2", "true", "true"},                                 // 2-D columnwise
      {bf16, "2", "true", "false", "true"},                     // RHT
      {bf16, "2", "false", "false", "false", "true"},           // stochastic rowwise
      {t, "2", "true", "false", "true", "true"},                // RHT + stochastic
      {bf16, "2", "false", "true", "false", "true"},            // 2-D + stochastic
      {bf16, "2", "true", "false", "true", "true", "false"},    // RHT + stochastic, y only
  };
  for (const std::vector<std::string>& o : options) {
    std::string expression = "opfuse::micro_scale_cast<" + t;
    for (const std::string& part : o) expression += ", " + part;
    c.name_expressions.push_back(expression + ">");
  }
  c.name_expressions.push_back("opfuse::micro_scale_rht_amax<" + t + ">");
  // The largest budget of the case's kernels (RHT + stochastic rounding).
  c.register_budget = launch::micro_scale_register_budget(t == "float" ? 4 : 2, true, true);
  return c;
}

// Block summaries (runtime-owned, note "Block summaries"): both FP8 formats' copies with 1-D and
// 2-D blocks, every micro-scaled format and copy, NVFP4's 2-D and Hadamard blocks.
TemplateCase block_summary_case(const std::string& arch, const Dtype& in) {
  const std::string t = in.type;
  TemplateCase c{"block_summary_" + in.tag + "_" + arch,
                 "block_summary.cuh",
                 {},
                 arch,
                 launch::kSmallKernelRegisterBudget};
  // The Float8 kernel reads the FP8 copy: the same instantiations whatever the source dtype.
  for (const char* options : {"__nv_fp8_e4m3, false", "__nv_fp8_e4m3, true", "__nv_fp8_e5m2, false",
                              "__nv_fp8_e5m2, true"})
    c.name_expressions.push_back(std::string("opfuse::float8_block_summary<") + options + ">");
  for (const char* options :
       {"0, false, false, false", "0, true, false, false", "1, true, false, false",
        "2, false, false, false", "2, true, false, false", "2, false, true, false",
        "2, true, true, false", "2, true, false, true"})
    c.name_expressions.push_back("opfuse::micro_block_summary<" + t + ", " + options + ">");
  return c;
}

TemplateCase amax_case(const std::string& arch, const Dtype& in) {
  return {
      "amax_" + in.tag + "_" + arch, "amax.cuh", {"opfuse::amax_reduce<" + in.type + ">"}, arch};
}

// The seed MLP (RMSNorm -> fc1 -> SwiGLU -> fc2 with FP8 GEMMs): hidden 4096, ffn 28672, bf16
// activations, E4M3 forward, E5M2 gradients, on sm_90a. Budgets are the launch rules' own.
std::vector<TemplateCase> seed_mlp_cases() {
  const std::string bf16 = "__nv_bfloat16";
  const std::string silu_gated = ir::pointwise_functor_name(*ir::find_pointwise("swiglu"), {});
  struct Main {
    std::string name, header, expression;
    int budget;
  };
  const std::vector<Main> mains = {
      {"rmsnorm_fwd_e4m3_transpose", "norm.cuh",
       "opfuse::rmsnorm_fwd<" + args({bf16, kE4m3, "4096", "false", "true"}) + ">",
       launch::norm_fwd_register_budget(/*is_rms=*/true, /*write_transpose=*/true)},
      {"rmsnorm_fwd_e4m3", "norm.cuh",
       "opfuse::rmsnorm_fwd<" + args({bf16, kE4m3, "4096", "false", "false"}) + ">",
       launch::norm_fwd_register_budget(true, false)},
      {"layernorm_fwd_e4m3_transpose", "norm.cuh",
       "opfuse::layernorm_fwd<" + args({bf16, kE4m3, "4096", "false", "true"}) + ">",
       launch::norm_fwd_register_budget(false, true)},
      {"layernorm_fwd_bf16", "norm.cuh",
       "opfuse::layernorm_fwd<" + args({bf16, bf16, "4096"}) + ">",
       launch::norm_fwd_register_budget(false, false)},
      {"layernorm_block_fwd_e4m3_src", "norm.cuh",
       "opfuse::layernorm_block_fwd<" + args({bf16, kE4m3, "4096", "false", "true"}) + ">",
       launch::norm_fwd_register_budget(false, false)},
      {"rmsnorm_block_fwd_e4m3", "norm.cuh",
       "opfuse::rmsnorm_block_fwd<" + args({bf16, kE4m3, "4096", "false", "false"}) + ">",
       launch::norm_fwd_register_budget(true, false)},
      {"layernorm_micro_fwd_e4m3_src", "norm.cuh",
       "opfuse::layernorm_micro_fwd<" + args({bf16, "0", "4096", "false", "true"}) + ">",
       launch::norm_fwd_register_budget(false, false)},
      {"rmsnorm_bwd", "norm.cuh", "opfuse::rmsnorm_bwd<" + args({bf16, "4096"}) + ">",
       launch::kNormBwdRegisterBudget},
      {"layernorm_bwd", "norm.cuh", "opfuse::layernorm_bwd<" + args({bf16, "4096"}) + ">",
       launch::kNormBwdRegisterBudget},
      {"swiglu_fwd_e4m3_transpose", "activation.cuh",
       "opfuse::gated_activation_fwd<" + args({silu_gated, bf16, kE4m3, "true"}) + ">",
       launch::tile_register_budget(/*input_bytes=*/2, /*loads_per_element=*/2, /*transpose=*/true,
                                    /*dbias=*/false)},
      {"swiglu_micro_fwd_e4m3_src", "activation.cuh",
       "opfuse::gated_activation_micro_fwd<" + args({silu_gated, bf16, "0", "true"}) + ">",
       launch::tile_register_budget(2, 2, false, false)},
      {"swiglu_micro_bwd_e5m2_src", "activation.cuh",
       "opfuse::gated_activation_micro_bwd<" + args({silu_gated, bf16, "1", "true"}) + ">",
       launch::tile_register_budget(2, 3, false, false)},
      {"swiglu_bwd_e5m2_transpose", "activation.cuh",
       "opfuse::gated_activation_bwd<" + args({silu_gated, bf16, kE5m2, "true", "false"}) + ">",
       launch::tile_register_budget(2, 3, true, false)},
      {"swiglu_bwd_e5m2_transpose_dbias", "activation.cuh",
       "opfuse::gated_activation_bwd<" + args({silu_gated, bf16, kE5m2, "true", "true"}) + ">",
       launch::tile_register_budget(2, 3, true, true)},
      {"cast_transpose_e4m3", "cast_transpose.cuh",
       "opfuse::cast_transpose<" + args({bf16, kE4m3, "true", "false"}) + ">",
       launch::tile_register_budget(2, 1, true, false)},
      {"cast_transpose_dbias_e5m2", "cast_transpose.cuh",
       "opfuse::cast_transpose<" + args({bf16, kE5m2, "true", "true"}) + ">",
       launch::tile_register_budget(2, 1, true, true)},
      {"residual_add_e4m3", "bias.cuh",
       "opfuse::bias_add<" + args({bf16, kE4m3, "false", "true", "false"}) + ">",
       launch::tile_register_budget(2, 2, false, false)},
      {"reduce_column_partials", "norm.cuh", "opfuse::reduce_column_partials<" + bf16 + ">",
       launch::kSmallKernelRegisterBudget},
      {"amax_reduce", "amax.cuh", "opfuse::amax_reduce<" + bf16 + ">",
       launch::kSmallKernelRegisterBudget},
      {"update_scales", "scale_update.cuh", "opfuse::update_scales<256>",
       launch::kSmallKernelRegisterBudget},
      {"finish_current_scales", "scale_update.cuh", "opfuse::finish_current_scales<32>",
       launch::kSmallKernelRegisterBudget},
      {"tensor_stats_partial", "tensor_stats.cuh", "opfuse::tensor_stats_partial<" + bf16 + ">",
       launch::kTensorStatsRegisterBudget},
      {"tensor_stats_final", "tensor_stats.cuh", "opfuse::tensor_stats_final<256>",
       launch::kTensorStatsRegisterBudget},
      {"tensor_capture", "tensor_capture.cuh", "opfuse::tensor_capture<" + bf16 + ">",
       launch::kSmallKernelRegisterBudget},
      {"quant_stats_partial_e4m3", "quant_stats.cuh",
       "opfuse::quant_stats_partial<" + args({bf16, kE4m3}) + ">",
       launch::kTensorStatsRegisterBudget},
      {"quant_stats_partial_e5m2_fp32", "quant_stats.cuh",
       "opfuse::quant_stats_partial<" + args({"float", kE5m2}) + ">",
       launch::kTensorStatsRegisterBudget},
      {"quant_stats_final", "quant_stats.cuh", "opfuse::quant_stats_final<32>",
       launch::kTensorStatsRegisterBudget},
  };
  std::vector<TemplateCase> cases;
  const std::string swiglu_source = *ir::pointwise_functor_source(silu_gated);
  for (const Main& main : mains) {
    cases.push_back({"seed_mlp_" + main.name,
                     main.header,
                     {main.expression},
                     "sm_90a",
                     main.budget,
                     main.header == "activation.cuh" ? swiglu_source : ""});
  }
  return cases;
}

// The quantize op under block scaling (1 x 128 blocks, the default) and Float8 block scaling
// emulated where cuBLASLt has no block-scale modes (sm_89, sm_100a: 1 x 128, 128 x 1 and
// 128 x 128 blocks), through both FP8 formats.
TemplateCase block_fake_quantize_case(const std::string& arch, const Dtype& in) {
  const std::string t = in.type;
  return {"block_fake_quantize_" + in.tag + "_" + arch,
          "block_fake_quantize.cuh",
          {"opfuse::block_fake_quantize<" + args({t, kE4m3}) + ">",
           "opfuse::block_fake_quantize<" + args({t, kE5m2}) + ">",
           "opfuse::block_fake_quantize<" + args({t, kE5m2, "1"}) + ">",
           "opfuse::block_fake_quantize<" + args({t, kE4m3, "1"}) + ">",
           "opfuse::block_fake_quantize<" + args({t, kE4m3, "2"}) + ">"},
          arch};
}

std::vector<TemplateCase> all_cases() {
  std::vector<TemplateCase> cases = seed_mlp_cases();
  for (const std::string& arch : archs()) {
    for (const Dtype& in : input_dtypes()) {
      cases.push_back(norm_case(arch, in));
      cases.push_back(row_expr_case(arch, in));
      cases.push_back(activation_case(arch, in, /*gated=*/false));
      cases.push_back(activation_case(arch, in, /*gated=*/true));
      cases.push_back(cast_case(arch, in));
      cases.push_back(bias_case(arch, in));
      cases.push_back(scale_case(arch, in));
      cases.push_back(dropout_case(arch, in));
      cases.push_back(amax_case(arch, in));
      cases.push_back(block_cast_case(arch, in));
      for (TemplateCase& c : block_activation_cases(arch, in)) cases.push_back(std::move(c));
      cases.push_back(block_fake_quantize_case(arch, in));
      cases.push_back(micro_scale_case(arch, in));
      cases.push_back(block_summary_case(arch, in));
    }
    // Decoding a quantized tensor (opfuse::dequantize, runtime-owned): both formats, every scale
    // layout, to bf16 and fp32.
    {
      TemplateCase c{"dequantize_" + arch,
                     "quantized_tensor.cuh",
                     {},
                     arch,
                     launch::kSmallKernelRegisterBudget};
      for (const char* fp8 : {"__nv_fp8_e4m3", "__nv_fp8_e5m2"})
        for (const char* out : {"__nv_bfloat16", "float"})
          for (const char* blocks : {"0", "1", "2"})
            c.name_expressions.push_back(std::string("opfuse::dequantize<") + fp8 + ", " + out +
                                         ", " + blocks + ">");
      // MXFP8 (E4M3, E5M2) and NVFP4 copies of quantized inputs, both orientations.
      for (const char* out : {"__nv_bfloat16", "__half", "float"})
        for (const char* format : {"0", "1", "2"})
          for (const char* columnwise : {"false", "true"})
            c.name_expressions.push_back(std::string("opfuse::micro_dequantize<") + out + ", " +
                                         format + ", " + columnwise + ">");
      cases.push_back(std::move(c));
    }
    // The transposed copy of gathered FP8 codes (gather-fp8): one kernel per format.
    cases.push_back({"fp8_transpose_" + arch,
                     "cast_transpose.cuh",
                     {"opfuse::fp8_transpose<" + args({kE4m3, "true"}) + ">",
                      "opfuse::fp8_transpose<" + args({kE5m2, "true"}) + ">",
                      "opfuse::fp8_transpose<" + args({kE4m3, "false"}) + ">"},
                     arch,
                     launch::kTileRegisterBudget});
    cases.push_back({"scale_update_" + arch,
                     "scale_update.cuh",
                     {"opfuse::update_scales<256>", "opfuse::update_scales<128>",
                      "opfuse::finish_current_scales<32>"},
                     arch});
  }
  return cases;
}

bool is_elf(const std::vector<char>& binary) {
  return binary.size() > 4 && binary[0] == '\x7f' && binary[1] == 'E' && binary[2] == 'L' &&
         binary[3] == 'F';
}

// "kernel: registers, spills" for every kernel of a ptxas -v log, so a failure names the culprit.
std::string ptxas_summary(const std::string& log) {
  static const std::regex kEntry(R"(Compiling entry function '(\w+)')");
  static const std::regex kUsage(
      R"((\d+) bytes spill stores, (\d+) bytes spill loads[\s\S]*?Used (\d+) registers)");
  std::string summary;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), kEntry); it != std::sregex_iterator();
       ++it) {
    const std::string rest = log.substr(static_cast<std::size_t>(it->position() + it->length()));
    std::smatch usage;
    if (!std::regex_search(rest, usage, kUsage)) continue;
    summary += "  " + (*it)[1].str() + ": " + usage[3].str() + " registers, " + usage[1].str() +
               " B spill stores, " + usage[2].str() + " B spill loads\n";
  }
  return summary;
}

void PrintTo(const TemplateCase& test_case, std::ostream* out) { *out << test_case.name; }

class TemplateCompileTest : public ::testing::TestWithParam<TemplateCase> {};

TEST_P(TemplateCompileTest, CompilesToCubinWithoutSpills) {
  const TemplateCase& test_case = GetParam();
  jit::CompileRequest request;
  request.kernel_name = test_case.name;
  request.source = "#include \"" + test_case.header + "\"\n" + test_case.prelude;
  request.name_expressions = test_case.name_expressions;
  request.arch = test_case.arch;

  jit::CompiledKernel kernel;
  try {
    kernel = jit::compile_kernel(request);
  } catch (const jit::JitError& error) {
    FAIL() << error.what();
  }
  EXPECT_FALSE(kernel.is_ptx);
  EXPECT_TRUE(is_elf(kernel.binary)) << "expected a cubin for " << test_case.arch;
  for (const std::string& expression : test_case.name_expressions) {
    const auto lowered = kernel.lowered_names.find(expression);
    ASSERT_NE(lowered, kernel.lowered_names.end()) << expression;
    EXPECT_EQ(lowered->second.rfind("_ZN6opfuse", 0), 0u)
        << expression << " -> " << lowered->second;
  }
  // ptxas -v figures (the largest over the program's kernels): every instantiation must fit its
  // register budget without spilling, or the kernel silently loses most of its bandwidth.
  ASSERT_GT(kernel.registers, 0) << "no ptxas register report in the log:\n" << kernel.log;
  const std::string summary = ptxas_summary(kernel.log);
  EXPECT_EQ(kernel.spill_store_bytes, 0) << summary;
  EXPECT_EQ(kernel.spill_load_bytes, 0) << summary;
  if (test_case.register_budget > 0) {
    EXPECT_LE(kernel.registers, test_case.register_budget) << summary;
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, TemplateCompileTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<TemplateCase>& info) {
                           return info.param.name;
                         });

// The shapes the README promises to codegen, for the seed MLP and the edge cases.
TEST(TemplateLaunchRules, NormShapesMatchTheReadme) {
  // bf16, hidden 4096: 512 vectors of 8; 4 per thread; 128 threads per row; 2 rows per block.
  EXPECT_EQ(launch::norm_vecs_per_thread(4096, 2, launch::kNormFwdMaxVecsPerThread), 4);
  EXPECT_EQ(launch::norm_threads_per_row(4096, 2, launch::kNormFwdMaxVecsPerThread), 128);
  EXPECT_EQ(launch::norm_fwd_rows_per_block(4096, 2, false), 2);
  EXPECT_EQ(launch::norm_fwd_block_threads(4096, 2, false), 256);
  // gamma/beta as fp32 in shared memory: 32 KiB per LayerNorm block (3 blocks of 256 threads per
  // SM at 80 registers), 16 KiB for RMSNorm; beside the transposed path's 131 KB tile too; not
  // for rows whose fp32 gamma/beta exceed 32 KiB.
  EXPECT_EQ(launch::norm_affine_shared_bytes(4096, 2, false, false), 32768);
  EXPECT_EQ(launch::norm_affine_shared_bytes(4096, 2, true, false), 16384);
  EXPECT_EQ(launch::norm_affine_shared_bytes(4096, 2, false, true), 32768);
  EXPECT_EQ(launch::norm_affine_shared_bytes(8192, 2, false, false), 0);
  EXPECT_EQ(launch::norm_affine_shared_bytes(8192, 2, true, false), 32768);
  // Transposed copy: 32-row tiles of 4100-byte rows, 4 row groups of 128 threads.
  EXPECT_EQ(launch::norm_transpose_tile_rows(4096), 32);
  EXPECT_EQ(launch::norm_fwd_rows_per_block(4096, 2, true), 4);
  EXPECT_EQ(launch::norm_fwd_block_threads(4096, 2, true), 512);
  EXPECT_EQ(launch::norm_fwd_dynamic_smem_bytes(4096, true), 32 * 4100);
  EXPECT_EQ(launch::norm_fwd_dynamic_smem_bytes(4096, false), 0);
  // Too wide for 32 staged rows: 16-row tiles.
  EXPECT_EQ(launch::norm_transpose_tile_rows(8192), 16);
  // Backward: one vector per thread, 512 threads for one bf16 row of 4096.
  EXPECT_EQ(launch::norm_bwd_block_threads(4096, 2), 512);
  EXPECT_EQ(launch::norm_bwd_rows_per_block(4096, 2), 1);
  // fp16, hidden 1000: 125 vectors -> 4 per thread, 32 threads (3 idle slots), 8 rows a block.
  EXPECT_EQ(launch::norm_threads_per_row(1000, 2, launch::kNormFwdMaxVecsPerThread), 32);
  EXPECT_EQ(launch::norm_fwd_block_threads(1000, 2, false), 256);
  EXPECT_EQ(launch::norm_fwd_rows_per_block(1000, 2, true), 16);
  // fp32, hidden 768: 192 vectors of 4 -> 4 per thread, 64 threads per row.
  EXPECT_EQ(launch::norm_threads_per_row(768, 4, launch::kNormFwdMaxVecsPerThread), 64);
}

// The norm backward's partial sums: shared memory within 32 KiB per block, and two rows per step
// only where they are there and a row is one vector per thread.
TEST(TemplateLaunchRules, NormBackwardPartialsAndRowsPerStep) {
  // bf16 4096: 512 threads x 8 elements x (dgamma, dbeta) x 4 bytes.
  EXPECT_EQ(launch::norm_bwd_partials_shared_bytes(4096, 2, /*is_rms=*/false), 32768);
  EXPECT_EQ(launch::norm_bwd_rows_per_step(4096, 2, false), 2);
  EXPECT_EQ(launch::norm_bwd_partials_shared_bytes(4096, 2, /*is_rms=*/true), 16384);
  // bf16 8192: 1024 threads, 64 KiB for LayerNorm: registers, one row per step; RMSNorm fits.
  EXPECT_EQ(launch::norm_bwd_partials_shared_bytes(8192, 2, false), 0);
  EXPECT_EQ(launch::norm_bwd_rows_per_step(8192, 2, false), 1);
  EXPECT_EQ(launch::norm_bwd_partials_shared_bytes(8192, 2, true), 32768);
  EXPECT_EQ(launch::norm_bwd_rows_per_step(8192, 2, true), 2);
  // fp32 8192: two vectors per thread; the RMSNorm partials fit, but one row per step.
  EXPECT_EQ(launch::norm_bwd_partials_shared_bytes(8192, 4, true), 32768);
  EXPECT_EQ(launch::norm_bwd_rows_per_step(8192, 4, true), 1);
}

TEST(TemplateLaunchRules, TileAndReductionGrids) {
  EXPECT_EQ(launch::tile_grid_x(28672), 448);
  EXPECT_EQ(launch::tile_grid_x(200), 4);   // partial last column tile
  EXPECT_EQ(launch::tile_grid_y(1000), 8);  // 128-row tiles
  EXPECT_EQ(launch::tile_grid_y(0), 1);
  EXPECT_EQ(launch::tile_grid_y(1LL << 40), launch::kTileMaxGridY);
  // Passes whose loads are in flight together: 64 bytes per thread, at least 2 passes.
  EXPECT_EQ(launch::tile_passes_per_batch(/*passes=*/4, /*loads_per_element=*/1), 4);
  EXPECT_EQ(launch::tile_passes_per_batch(8, 1), 4);  // fp32 input
  EXPECT_EQ(launch::tile_passes_per_batch(4, 3), 2);  // SwiGLU backward
  EXPECT_EQ(launch::column_reduce_grid_x(4096), 32);
  EXPECT_EQ(launch::min_blocks(256, 64), 4);
  EXPECT_EQ(launch::min_blocks(256, 80), 3);
  EXPECT_EQ(launch::min_blocks(512, 128), 1);
  // The seed MLP's budgets: 64 (4 blocks/SM) where it fits, 80 or 128 where measured necessary;
  // the transposed cast takes 80 for its 4 passes in flight (20 bytes spilled at 64).
  EXPECT_EQ(launch::tile_register_budget(2, 1, false, false), 64);  // cast bf16 -> FP8
  EXPECT_EQ(launch::tile_register_budget(2, 1, true, false), 80);   // cast_transpose bf16 -> FP8
  EXPECT_EQ(launch::tile_register_budget(2, 2, true, false), 80);   // SwiGLU forward + transpose
  EXPECT_EQ(launch::tile_register_budget(2, 3, true, true), 128);   // SwiGLU backward
  EXPECT_EQ(launch::norm_fwd_register_budget(true, false), 64);
  EXPECT_EQ(launch::norm_fwd_register_budget(false, false), 80);  // LayerNorm: 6 blocks per SM
}

// Block-scaled cast: one 256-thread block per 128 x 128 tile, an idle block for empty tensors,
// and the scale_inv grids of runtime/cpu/block_quantization.h (note "Block scale grids").
TEST(TemplateLaunchRules, BlockCastGridsAndScaleGrids) {
  EXPECT_EQ(launch::kBlockCastThreads, 256);
  EXPECT_EQ(launch::block_cast_grid_x(4096), 32);
  EXPECT_EQ(launch::block_cast_grid_x(144), 2);  // a partial last column tile
  EXPECT_EQ(launch::block_cast_grid_x(0), 1);
  EXPECT_EQ(launch::block_cast_grid_y(16384), 128);
  EXPECT_EQ(launch::block_cast_grid_y(300), 3);
  EXPECT_EQ(launch::block_cast_grid_y(0), 1);
  EXPECT_EQ(launch::block_cast_grid_y(1LL << 40), launch::kBlockCastMaxGridY);
  EXPECT_EQ(launch::block_cast_register_budget(2), 64);
  EXPECT_EQ(launch::block_cast_register_budget(4), 128);
  // 1-D, a stored [300, 272] copy: [ceil(272 / 128)][roundup(300, 4)] = [3][300]; [5, 16]: [1][8].
  EXPECT_EQ(launch::block_scale_grid_outer(300, 272, false), 3);
  EXPECT_EQ(launch::block_scale_grid_inner(300, 272, false), 300);
  EXPECT_EQ(launch::block_scale_grid_outer(5, 16, false), 1);
  EXPECT_EQ(launch::block_scale_grid_inner(5, 16, false), 8);
  // 2-D: [ceil(rows / 128)][roundup(ceil(cols / 128), 4)]: [300, 272] -> [3][4]; [272, 300] too.
  EXPECT_EQ(launch::block_scale_grid_outer(300, 272, true), 3);
  EXPECT_EQ(launch::block_scale_grid_inner(300, 272, true), 4);
  EXPECT_EQ(launch::block_scale_grid_inner(128, 640, true), 8);  // 5 column blocks -> 8
  EXPECT_EQ(launch::block_scale_grid_outer(0, 128, true), 0);
}

// Block-scaled activations: 256 threads per output plane (the gated backward's two planes cast
// at once by two groups), and two blocks of each per SM within the registers and the 228 KiB of
// shared memory an sm_90 SM has (1 KiB of it reserved per block).
TEST(TemplateLaunchRules, BlockActivationsKeepTwoBlocksPerSm) {
  EXPECT_EQ(launch::block_activation_threads(1), launch::kBlockCastThreads);
  EXPECT_EQ(launch::block_activation_threads(2), 2 * launch::kBlockCastThreads);
  EXPECT_EQ(launch::block_activation_register_budget(false, 1), 80);
  EXPECT_EQ(launch::block_activation_register_budget(true, 1), 128);
  EXPECT_EQ(launch::block_activation_register_budget(true, 2), 64);
  EXPECT_EQ(launch::block_activation_smem_bytes(3, 2, false), 96 * 1024);
  // dbias: 16 warps x 2 planes x 128 columns of fp32 sums.
  EXPECT_EQ(launch::block_activation_smem_bytes(3, 2, true), 96 * 1024 + 16 * 2 * 128 * 4);
  EXPECT_EQ(launch::block_activation_smem_bytes(2, 1, true), 64 * 1024 + 8 * 128 * 4);
  for (const bool dbias : {false, true}) {
    for (const int planes : {1, 2}) {
      const int loads = planes == 2 ? 3 : 2;
      const int blocks = launch::block_activation_min_blocks(true, planes);
      EXPECT_EQ(blocks, 2) << planes << " planes";
      EXPECT_LE(blocks * (launch::block_activation_smem_bytes(loads, planes, dbias) + 1024),
                228 * 1024)
          << planes << " planes, dbias " << dbias;
    }
  }
}

// Micro-scaled casts: row blocks (one scale block per thread) or 64-column patches.
TEST(TemplateLaunchRules, MicroScaleGrids) {
  EXPECT_EQ(launch::micro_scale_block_size(launch::kMicroScaleE4M3), 32);
  EXPECT_EQ(launch::micro_scale_block_size(launch::kMicroScaleE2M1), 16);
  // Rowwise MXFP8 [4096, 4096]: 4096 * 128 blocks over 256 threads.
  EXPECT_EQ(launch::micro_scale_grid_x(4096, 4096, launch::kMicroScaleE4M3, false, false), 2048);
  EXPECT_EQ(launch::micro_scale_grid_y(4096, launch::kMicroScaleE4M3, false, false), 1);
  EXPECT_EQ(launch::micro_scale_grid_x(0, 4096, launch::kMicroScaleE2M1, false, false), 1);
  // Columnwise NVFP4 [300 -> 304, 100]: ceil(100 / 64) strips, 19 row groups of 16 over 8 warps.
  EXPECT_EQ(launch::micro_scale_grid_x(304, 100, launch::kMicroScaleE2M1, true, false), 2);
  EXPECT_EQ(launch::micro_scale_grid_y(304, launch::kMicroScaleE2M1, true, false), 3);
  // 2-D rowwise uses patches too; MXFP8 columnwise groups are 32 rows.
  EXPECT_EQ(launch::micro_scale_grid_y(256, launch::kMicroScaleE2M1, false, true), 2);
  EXPECT_EQ(launch::micro_scale_grid_y(256, launch::kMicroScaleE5M2, true, false), 1);
  EXPECT_EQ(launch::micro_scale_grid_y(1LL << 40, launch::kMicroScaleE2M1, true, false),
            launch::kMicroScaleMaxGridY);
  EXPECT_EQ(launch::micro_scale_rht_amax_grid_x(4096), 64);
  EXPECT_EQ(launch::micro_scale_rht_amax_grid_y(4096), 32);
  EXPECT_EQ(launch::micro_scale_register_budget(2, false, false), 64);
  EXPECT_EQ(launch::micro_scale_register_budget(2, false, true), 64);
  EXPECT_EQ(launch::micro_scale_register_budget(2, true, false), 96);
  EXPECT_EQ(launch::micro_scale_register_budget(2, true, true), 128);
  EXPECT_EQ(launch::micro_scale_register_budget(4, false, false), 128);
}

std::vector<std::string> template_headers() {
  std::vector<std::string> headers;
  for (const auto& entry : fs::recursive_directory_iterator(test::source_path("templates"))) {
    const std::string extension = entry.path().extension().string();
    if (extension == ".cuh" || extension == ".h") {
      headers.push_back(fs::relative(entry.path(), test::source_path("templates")).string());
    }
  }
  std::sort(headers.begin(), headers.end());
  return headers;
}

std::string nvcc_path() {
  for (const char* variable : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* root = std::getenv(variable);
    if (root != nullptr && fs::exists(fs::path(root) / "bin/nvcc")) {
      return (fs::path(root) / "bin/nvcc").string();
    }
  }
  return fs::exists("/usr/local/cuda/bin/nvcc") ? "/usr/local/cuda/bin/nvcc" : "";
}

class TemplateHeaderTest : public ::testing::TestWithParam<std::string> {};

// Tools (clangd, nvcc -E, reviewers) read each header on its own: it must compile alone.
TEST_P(TemplateHeaderTest, CompilesOnItsOwnWithNvcc) {
  const std::string nvcc = nvcc_path();
  if (nvcc.empty()) GTEST_SKIP() << "nvcc not found (CUDA_HOME, CUDA_PATH, /usr/local/cuda)";
  const std::string header = test::source_path("templates/" + GetParam());
  const std::string object = test::make_temp_dir("template-header") + "/header.o";
  const test::CommandResult result =
      test::run_command("'" + nvcc + "' -std=c++17 -arch=sm_90a -Werror all-warnings -c -x cu '" +
                        header + "' -o '" + object + "' 2>&1");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(fs::exists(object));
}

INSTANTIATE_TEST_SUITE_P(Templates, TemplateHeaderTest, ::testing::ValuesIn(template_headers()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

// Kernel entry points: the `name(SomethingParams` of every __global__ template in templates/.
std::set<std::string> kernel_entry_points() {
  static const std::regex kEntry(R"((\w+)\(\s*(\w+Params)\b)");
  std::set<std::string> names;
  for (const std::string& header : template_headers()) {
    const std::string text = test::read_text(test::source_path("templates/" + header));
    if (text.find("__global__") == std::string::npos) continue;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kEntry);
         it != std::sregex_iterator(); ++it) {
      names.insert((*it)[1].str());
    }
  }
  return names;
}

TEST(TemplateCoverage, EveryEntryPointIsDocumentedAndCompiled) {
  const std::set<std::string> entries = kernel_entry_points();
  ASSERT_GE(entries.size(), 12u) << "entry point scan found too few kernels";
  const std::string readme = test::read_text(test::source_path("templates/README.md"));
  std::string expressions;
  for (const TemplateCase& test_case : all_cases()) {
    for (const std::string& expression : test_case.name_expressions)
      expressions += expression + "\n";
  }
  for (const std::string& entry : entries) {
    EXPECT_TRUE(std::regex_search(readme, std::regex("\\b" + entry + "\\b")))
        << "templates/README.md does not document " << entry;
    EXPECT_NE(expressions.find("opfuse::" + entry + "<"), std::string::npos)
        << entry << " is in no compile case of this test";
  }
}

}  // namespace
}  // namespace opfuse
