// The execution plan of a compiled program (docs/codegen.md): per sequence, the steps forward and
// backward run in order (generated-kernel launches and cuBLASLt GEMMs), the quantizers
// they touch and every buffer with its size and lifetime; plus the generated kernels, each one
// template instantiation, shared by every step that launches it. Pure: no device, no files.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "codegen/sym_expr.h"
#include "ir/graph.h"
#include "support/source_manager.h"

namespace opfuse::codegen {

struct CodegenOptions {
  std::string arch = "sm_90a";  // the target the kernels are compiled for (never queried)
  // Turns op locations into `mlp.fuse:14`; nullptr leaves them out.
  const SourceManager* sources = nullptr;
  // FP8 GEMM accumulation, TE's defaults: fast (FP8-rate) accumulation in the forward GEMMs,
  // split (promoted to fp32 at intervals) in dgrad and wgrad, where gradients need the precision.
  bool fp8_fprop_fast_accum = true;
  bool fp8_backward_fast_accum = false;
};

// A user error: an op or fused group with no GPU kernel, or a shape the kernel templates cannot
// run. Carries the op's .fuse location for the diagnostics engine.
class CodegenError : public std::runtime_error {
 public:
  CodegenError(SourceLoc loc, const std::string& message, std::string hint = {})
      : std::runtime_error(message), loc_(loc), hint_(std::move(hint)) {}
  SourceLoc loc() const { return loc_; }
  const std::string& hint() const { return hint_; }

 private:
  SourceLoc loc_;
  std::string hint_;
};

// One IR op a step runs, as a reader finds it in the .fuse file.
struct OpRef {
  std::string op;        // "layernorm", "cast_fp8"
  std::string instance;  // "layernorm_0", "fc1.input"
  std::string location;  // "mlp.fuse:14"; empty without sources
};

enum class BufferRole : uint8_t {
  Input,       // a sequence input (the caller's)
  Param,       // a parameter (the caller's)
  OutputGrad,  // the gradient of a sequence output, given to backward (the caller's)
  Result,      // made by a step
  Workspace,   // scratch of one group (dbias/dgamma partial sums)
};
std::string_view buffer_role_name(BufferRole role);

struct Buffer {
  int id = 0;
  std::string name;  // the IR value's printed name (%0, %x, %fc1.weight, %dy); workspace: its use
  ir::ValueId value = ir::kNoValue;  // kNoValue for workspace
  BufferRole role = BufferRole::Result;
  ir::DType dtype = ir::DType::BF16;
  std::vector<SymExpr> shape;
  SymExpr bytes;
  int first_use = -1;  // step indices over the whole sequence; -1: no step touches it
  int last_use = -1;
  bool saved = false;  // touched in forward and in backward: kept alive in between
  int alias_of = -1;   // the buffer whose memory it views (make_extra_output, identity, reshape)
  int quantizer = -1;  // an FP8 copy: its quantizer (GEMMs read that quantizer's scale_inv)
  bool columnwise = false;             // the transposed FP8 copy ([k, rows...])
  std::vector<std::string> interface;  // "output y", "input_grad x", "param_grad fc1.weight"
};

// A quantizer and the QuantizerRecord fields its update needs (templates/README.md).
struct QuantizerPlan {
  int index = 0;
  std::string name;
  ir::QuantizerRole role = ir::QuantizerRole::Input;
  ir::DType format = ir::DType::E4M3;
  int source_buffer = -1;
  bool rowwise = false;
  bool columnwise = false;
  int mode = 0;  // 0 delayed/max, 1 delayed/most_recent, 2 current
  float fp8_max = 0;
  int history_length = 1;
  int margin = 0;
  double epsilon = 0;
  bool power_of_2_scale = false;
};

// What one field of a kernel's params struct is bound to.
struct ParamBinding {
  enum class Kind : uint8_t {
    Null,       // nullptr / unused
    Buffer,     // buffers[0]
    Buffers,    // an array field (reduce_column_partials' partials/outputs); -1 = nullptr
    Quantizer,  // a device scalar of quantizer `quantizer`: scale, scale_inv or amax
    Records,    // a device array of QuantizerRecord for the quantizers in `records`
    Int,        // a 4-byte int field
    Int64,      // a `long long` field (amax_reduce's element count)
    Float,
  };
  std::string field;
  Kind kind = Kind::Null;
  bool written = false;  // buffers the kernel writes (for lifetimes)
  std::vector<int> buffers;
  int quantizer = -1;
  // "scale", "scale_inv", or "amax": the amax slot a kernel raises (delayed: history slot 0;
  // current: the record's single amax).
  std::string quantizer_field;
  std::vector<int> records;
  SymExpr int_value;
  double float_value = 0;
};
std::string_view param_kind_name(ParamBinding::Kind kind);

// A launch grid as a named rule of templates/common/launch_rules.h and the sizes it reads.
struct GridRule {
  std::string rule;  // tile, norm_fwd, norm_fwd_transpose, norm_bwd, column_reduce, amax, ...
  SymExpr x = 1;
  SymExpr y = 1;
  std::vector<std::pair<std::string, SymExpr>> dims;  // e.g. {"rows", tokens}, {"cols", 4096}
};

struct LaunchStep {
  std::string kernel;           // Kernel::id
  std::string name_expression;  // the entry the launch calls
  int block_threads = 0;
  int dynamic_smem_bytes = 0;
  GridRule grid;
  std::vector<ParamBinding> params;  // the params struct's fields, in layout order
};

enum class GemmRole : uint8_t { Fprop, Dgrad, Wgrad };
std::string_view gemm_role_name(GemmRole role);

struct GemmOperand {
  int buffer = -1;
  ir::DType dtype = ir::DType::BF16;
  int quantizer = -1;            // FP8: its scale_inv is the A/B scale pointer
  bool columnwise_copy = false;  // the transposed FP8 copy of its quantizer
};

// D[m, n] = op(A)[m, k] op(B)[k, n] in row-major terms (note "Row-major GEMMs" in
// runtime/gpu/gemm_desc.h): A stored [m, k] or, a_transposed, [k, m]; B stored [k, n] or,
// b_transposed, [n, k]. FP8 GEMMs need a_transposed = false and b_transposed = true (cuBLASLt TN).
struct GemmStep {
  GemmRole role = GemmRole::Fprop;
  SymExpr m, n, k;
  GemmOperand a, b;
  bool a_transposed = false;
  bool b_transposed = true;
  int d = -1;
  ir::DType d_dtype = ir::DType::BF16;
  std::string epilogue = "none";  // runtime/gpu/gemm_desc.h's epilogue_name spellings
  int bias = -1;                  // bias/gelu_aux_bias: read [n]; dgelu_bias_grad: written
  int aux = -1;                   // gelu_aux_bias: written [m, n]; dgelu*: read
  bool accumulate = false;        // beta = 1: D = A B + C
  int c = -1;                     // C when accumulating (D's dtype and layout)
  bool fast_accum = false;        // FP8 fprop only (TE's defaults)
  int d_quantizer = -1;           // FP8 D: its scale and amax
};

// A forward launch as an inference forward (RunMode::Inference) runs it: another instantiation of
// the same op that leaves out the outputs only backward reads (the FP8 transposed copies), so an
// inference forward neither computes nor allocates them.
struct InferenceVariant {
  LaunchStep launch;
  std::vector<int> writes;  // the step's writes without the ones left out
};

struct Step {
  int index = 0;
  ir::Phase phase = ir::Phase::Forward;
  int group = -1;       // index of the IR op (fused or not) in Sequence::ops; -1: the scale update
  std::string pattern;  // the fusion pattern, empty for an unfused op
  std::vector<OpRef> ops;
  std::string what;  // one line for readers
  std::variant<LaunchStep, GemmStep> body;
  std::vector<int> reads;  // buffer ids
  std::vector<int> writes;
  // Forward launches whose outputs include some only backward reads; absent otherwise.
  std::optional<InferenceVariant> inference;
};

struct SequencePlan {
  std::string name;
  std::string recipe;  // recipe_string()
  bool fp8_weights = false;
  std::vector<std::string> symbols;  // bound at run time, plus num_sms
  std::vector<QuantizerPlan> quantizers;
  std::vector<Buffer> buffers;
  std::vector<Step> steps;  // forward steps, then backward; Step::index is the position
};

// One group that launches a kernel.
struct KernelUse {
  std::string sequence;
  ir::Phase phase = ir::Phase::Forward;
  std::string pattern;
  std::vector<OpRef> ops;
  std::string what;
  std::vector<std::string> quantizers;
};

// A generated kernel: one template instantiation, one NVRTC program.
struct Kernel {
  std::string id;  // file stem, e.g. "layernorm_fwd_bf16_e4m3_4096_t"
  std::string header;
  std::string template_name;
  std::vector<std::string> template_args;  // as spelled in CUDA
  std::string name_expression;
  std::string params_struct;  // "opfuse::NormFwdParams<__nv_bfloat16, __nv_fp8_e4m3>"
  std::vector<KernelUse> uses;
};

struct Plan {
  std::string source;  // the .fuse file's base name
  std::string arch;
  std::vector<SequencePlan> sequences;
  std::vector<Kernel> kernels;  // in order of first use

  const Kernel* find_kernel(std::string_view id) const;
};

// Throws CodegenError for the first op or group that has no GPU kernel.
Plan build_plan(const ir::Sequence& sequence, const CodegenOptions& options);
Plan build_plan(const ir::Program& program, const CodegenOptions& options);

// Reads plan.json back (`fusec build` output loaded by the runtime): the inverse of plan_to_json,
// so plan_json_text(plan_from_json(j)) == j's text. Throws std::invalid_argument naming the
// first missing or malformed field (e.g. "sequences[0].steps[3].gemm.m: ...").
Plan plan_from_json(const nlohmann::ordered_json& json);

// Deterministic JSON (goldens compare it): no times, no absolute paths.
nlohmann::ordered_json plan_to_json(const Plan& plan);  // keys in a fixed, readable order
std::string plan_json_text(const Plan& plan);           // two-space indented, ends with a newline

}  // namespace opfuse::codegen
