// The execution plan of a compiled program (docs/codegen.md): per sequence, the steps forward and
// backward run in order (generated-kernel launches and cuBLASLt GEMMs), the quantizers
// they touch and every buffer with its size and lifetime; plus the generated kernels, each one
// template instantiation, shared by every step that launches it. The contract between codegen,
// which writes it, and the runtime, which only reads it: this library depends on neither. Pure:
// no device, no files.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "plan/capture_slot.h"
#include "plan/enums.h"
#include "plan/parallel.h"
#include "plan/param_init.h"
#include "plan/quant_spec.h"
#include "plan/stat_slot.h"
#include "plan/sym_expr.h"

namespace opfuse::plan {

// One IR op a step runs, as a reader finds it in the .fuse file.
struct OpRef {
  std::string op;        // "layernorm", "cast_fp8"
  std::string instance;  // "layernorm_0", "fc1.input"
  std::string location;  // "mlp.fuse:14"; empty without sources
};

inline constexpr uint32_t kNoValue = ~uint32_t(0);

// A quantized value's scale-inverse: today's per-tensor specs keep it as a device scalar of the
// quantizer's state; a block-scaled copy will name the buffer holding its scale grid.
struct ScaleInvRef {
  int quantizer = -1;  // per-tensor: this quantizer's scale_inv scalar
  int buffer = -1;     // block scales: the grid's buffer
  bool present() const { return quantizer >= 0 || buffer >= 0; }
  friend bool operator==(const ScaleInvRef&, const ScaleInvRef&) = default;
};

// One thing the caller of a sequence reads back: an output, or the gradient of an input or a
// parameter, by its signature / parameter name.
struct InterfaceTag {
  InterfaceKind kind = InterfaceKind::Output;
  std::string name;  // "y", "x", "fc1.weight"
  friend bool operator==(const InterfaceTag&, const InterfaceTag&) = default;
};
std::string interface_string(const InterfaceTag& tag);  // "output y", "param_grad fc1.weight"

// The steps between which a buffer's memory holds a value in one run mode (note "Executor
// buffers" in docs/architecture.md): the first and the last step touching it, -1 for none.
struct Lifetime {
  int first = -1;
  int last = -1;
  friend bool operator==(const Lifetime&, const Lifetime&) = default;
};

struct Buffer {
  int id = 0;
  std::string name;  // the IR value's printed name (%0, %x, %fc1.weight, %dy); workspace: its use
  uint32_t value = kNoValue;  // the IR value (ir::ValueId); kNoValue for workspace
  BufferRole role = BufferRole::Result;
  DType dtype = DType::BF16;
  std::vector<SymExpr> shape;
  SymExpr bytes;
  int first_use = -1;  // step indices over the whole sequence; -1: no step touches it
  int last_use = -1;
  bool saved = false;  // touched in forward and in backward: kept alive in between
  int alias_of = -1;   // the buffer whose memory it views (make_extra_output, identity, reshape)
  // Computed once by codegen, only read by the executor: the buffer whose memory it is (itself
  // unless a view), and on roots the memory's lifetime per run mode (Training: every step;
  // Inference: the forward steps as their inference variants run) and whether a weight-cast
  // group writes it (note "Weight cache": it lives as long as the executor).
  int root = -1;
  Lifetime training;
  Lifetime inference;
  bool weight_cache = false;
  ParamInit init;   // Param buffers: how Session::own_parameters fills it (its op's declaration)
  ShardSpec shard;  // Param buffers of a tensor-parallel sequence: how the whole one is cut
  // A quantized copy: the quantizer that made it, which of its copies it is and how that copy
  // is laid out, and where its scale-inverse lives (GEMMs and dequantizing readers take it).
  int quantizer = -1;
  CopyUsage usage = CopyUsage::Rowwise;
  CopyLayout layout = CopyLayout::AsIs;
  ScaleInvRef scale_inv;
  // An emulated MXFP8 / NVFP4 copy (note "Emulated micro-scaling" in docs/architecture.md): the
  // decoded values of this quantizer's `usage` copy, which GEMMs read as any high-precision value
  // (`quantizer` stays -1); -1 for every other buffer. Block summaries find the copies by it.
  int emulated_quantizer = -1;
  std::vector<InterfaceTag> interface;  // what the caller reads back from it
};

// A quantizer: its spec (how it scales), the copies it makes and how the column-wise one is laid
// out, and the buffer it casts (templates/README.md, "Quantizer records", for its device state).
struct QuantizerPlan {
  int index = 0;
  std::string name;
  QuantizerRole role = QuantizerRole::Input;
  QuantSpec spec;
  Usages usages;
  CopyLayout columnwise_layout = CopyLayout::Transposed;
  int source_buffer = -1;
  // A quantized input's (note "Quantized boundaries" in docs/architecture.md): its copies and
  // scale_inv are Input buffers the caller gives; it casts nothing (source_buffer -1), is in no
  // scale update, and its device state goes unused.
  bool boundary = false;
  DType format() const { return spec.format; }
};

// What one field of a kernel's params struct is bound to.
struct ParamBinding {
  std::string field;
  ParamKind kind = ParamKind::Null;
  bool written = false;  // buffers the kernel writes (for lifetimes)
  // The column-wise copy of a quantizer (y_t, dx_t): an inference forward drops it where only
  // backward reads it (note "Inference variants" in compiler/codegen/plan_variants.cpp).
  bool columnwise_copy = false;
  std::vector<int> buffers;
  int quantizer = -1;
  QuantizerValue quantizer_value = QuantizerValue::Scale;
  std::vector<int> records;
  SymExpr int_value;  // Int, Int64; StatRecord, Capture: the slot
  double float_value = 0;
};

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

struct GemmOperand {
  int buffer = -1;
  DType dtype = DType::BF16;
  ScaleInvRef scale_inv;                 // FP8: the A/B scale pointer
  CopyUsage usage = CopyUsage::Rowwise;  // FP8: which copy of its quantizer
};

// An epilogue for an FP8 fprop GEMM whose BF16 output only a gated activation reads in the
// forward, which casts it to E4M3 with a per-tensor scale (note "Fused GEMM epilogues" in
// docs/architecture.md): the GEMM computes that step's output itself (runtime/cutlass/
// fused_gemm.h) and the step runs nothing, where the runtime has the kernel for this GPU and
// product; elsewhere both run as planned. An inference forward's (GemmStep::inference_epilogue)
// writes the E4M3 output only; a training forward's (GemmStep::training_epilogue) also its
// transposed copy and the GEMM's own BF16 output, which backward reads.
struct GatedEpilogue {
  std::string activation;  // the functor, "opfuse::pointwise_swiglu"
  int step = -1;           // the activation step it folds in
  int output = -1;         // that step's E4M3 output (rows of n / 2)
  int output_t = -1;       // training: that step's transposed copy ([n / 2, m]); else -1
  int quantizer = -1;      // whose scale it casts with and whose amax it raises
  friend bool operator==(const GatedEpilogue&, const GatedEpilogue&) = default;
};

// D[m, n] = op(A)[m, k] op(B)[k, n] in row-major terms (note "Row-major GEMMs" in
// runtime/gpu/gemm_desc.h): A stored [m, k] or, a_transposed, [k, m]; B stored [k, n] or,
// b_transposed, [n, k]. FP8 GEMMs on TN-only architectures need a_transposed = false and
// b_transposed = true (plan/gemm_caps.h).
struct GemmStep {
  GemmRole role = GemmRole::Fprop;
  SymExpr m, n, k;
  GemmOperand a, b;
  bool a_transposed = false;
  bool b_transposed = true;
  int d = -1;
  DType d_dtype = DType::BF16;
  GemmEpilogue epilogue = GemmEpilogue::None;
  int bias = -1;            // bias/gelu_aux_bias: read [n]; dgelu_bias_grad: written
  int aux = -1;             // gelu_aux_bias: written [m, n]; dgelu*: read
  bool accumulate = false;  // beta = 1: D = A B + C
  int c = -1;               // C when accumulating (D's dtype and layout)
  bool fast_accum = false;  // FP8 fprop only (TE's defaults)
  int d_quantizer = -1;     // FP8 D: its scale and amax
  std::optional<GatedEpilogue> inference_epilogue;  // absent from plan.json when absent
  std::optional<GatedEpilogue> training_epilogue;   // likewise
};

// A collective over the sequence's tensor-parallel group (runtime/comm, NCCL), enqueued on the
// session's stream between the launches and GEMMs around it. `count` is the elements this rank
// sends: the whole tensor (all_reduce, reduce_scatter) or its share (all_gather); dim 0 is the
// gathered or scattered one, which every rank holds contiguously.
struct CollectiveStep {
  CollectiveKind kind = CollectiveKind::AllReduce;
  DType dtype = DType::BF16;
  SymExpr count;
  int input = -1;
  int output = -1;
};

// A forward launch as an inference forward (RunMode::Inference) runs it: another instantiation of
// the same op that leaves out the outputs only backward reads (the FP8 transposed copies), so an
// inference forward neither computes nor allocates them.
struct InferenceVariant {
  LaunchStep launch;
  std::vector<int> writes;  // the step's writes without the ones left out
  // One line for readers: what the variant writes (the step's `what` names the training launch's
  // outputs); empty in plans written before it was recorded.
  std::string what;
};

// Forward steps whose reads are all parameters (the FP8 casts of a weight, with their amax step
// under current scaling): the executor skips them while their outputs are cached (note "Weight
// cache" in docs/architecture.md). Computed once by codegen.
struct WeightCacheGroup {
  std::vector<int> steps;       // step indices
  std::vector<int> params;      // the parameter buffers (roots) they read
  std::vector<int> quantizers;  // the quantizers of the FP8 copies they write
};

struct Step {
  int index = 0;
  Phase phase = Phase::Forward;
  int group = -1;       // index of the IR op (fused or not) in Sequence::ops; -1: the scale update
  std::string pattern;  // the fusion pattern, empty for an unfused op
  std::vector<OpRef> ops;
  std::string what;  // one line for readers
  std::variant<LaunchStep, GemmStep, CollectiveStep> body;
  std::vector<int> reads;  // buffer ids
  std::vector<int> writes;
  // Forward launches whose outputs include some only backward reads; absent otherwise.
  std::optional<InferenceVariant> inference;
  int weight_cache_group = -1;  // index into SequencePlan::weight_cache_groups
};

// Every buffer a step names (its reads and writes, its params' and its GEMM's buffers, and that
// mode's fused epilogue's outputs, which the GEMM may write) as it runs in an inference forward
// (`inference`: its inference variant where it has one) or otherwise, sorted and without
// duplicates. A variant with an empty grid runs nothing and names none.
std::vector<int> buffers_named_by(const Step& step, bool inference);

struct SequencePlan {
  std::string name;
  std::string recipe;  // recipe_string()
  bool fp8_weights = false;
  // `with parallel(...)`: the plan is one rank's of tp (absent from plan.json when tp = 1). Every
  // symbol a shape divides (`tokens / 2`) must be bound to a multiple of its divisor.
  ParallelSpec parallel;
  std::vector<std::pair<std::string, int64_t>> symbol_divisors;
  std::vector<std::string> symbols;  // bound at run time, plus num_sms
  std::vector<QuantizerPlan> quantizers;
  std::vector<Buffer> buffers;
  std::vector<Step> steps;  // forward steps, then backward; Step::index is the position
  std::vector<WeightCacheGroup> weight_cache_groups;
  // An instrumented variant's statistics records (empty in the plain plan, and then absent from
  // plan.json, so a program without debug features compiles to the same bytes).
  std::vector<StatSlot> stat_slots;
  // Its tensor captures (DumpTensors, C++ features' inspect_tensor), likewise absent when empty.
  std::vector<CaptureSlot> capture_slots;
};

// One group that launches a kernel.
struct KernelUse {
  std::string sequence;
  Phase phase = Phase::Forward;
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

// plan.json's "version": bumped when a field changes meaning or disappears (adding a field does
// not bump it). A plan.json of another version is refused with a message saying to rebuild it.
inline constexpr int kPlanFormatVersion = 3;

// Reads plan.json back (`fusec build` output loaded by the runtime): the inverse of plan_to_json,
// so plan_json_text(plan_from_json(j)) == j's text. Throws std::invalid_argument naming the
// first missing or malformed field (e.g. "sequences[0].steps[3].gemm.m: ...").
Plan plan_from_json(const nlohmann::ordered_json& json);

// Deterministic JSON (goldens compare it): no times, no absolute paths.
nlohmann::ordered_json plan_to_json(const Plan& plan);  // keys in a fixed, readable order
std::string plan_json_text(const Plan& plan);           // two-space indented, ends with a newline
// One sequence's part of plan.json (what `fusec ir --after PLAN_PASS` prints).
nlohmann::ordered_json sequence_plan_json(const SequencePlan& sequence);

}  // namespace opfuse::plan
