// The opfuse embedding API (docs/embedding.md): compile a .fuse program once (Program), then run
// one of its sequences on a CUDA stream (Session): bind the symbolic sizes, give it tensors or
// let it own the parameters, run forward (training or inference), backward and step(), capture
// a CUDA graph, save and load parameters with the quantizer state.
//
// Every error is an opfuse::Error (opfuse/error.h) whose message says what to change; misuse
// (wrong names, unbound sizes, a size cuBLASLt FP8 cannot take, host, freed or too-small
// memory, misaligned pointers, no GPU) is a UsageError thrown before anything is enqueued; a
// faulted CUDA context is a ContextFaultError from every call (docs/embedding.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "opfuse/debug_feature.h"
#include "opfuse/error.h"

namespace opfuse {

// Whether a CUDA GPU and driver are usable here; `why` says what is missing when not.
bool gpu_available(std::string* why = nullptr);

// E2M1 (NVFP4's 4-bit values) is a quantizer's format (QuantizerStatus) and the format of an
// NVFP4 quantized tensor, whose codes are packed two per byte; E8M0 (a power of 2 in one byte)
// is the type of MXFP8's block scales.
enum class TensorDType : std::uint8_t { BF16, FP16, FP32, E4M3, E5M2, E2M1, E8M0 };
// "bf16", "fp16", "fp32", "e4m3", "e5m2", "e2m1", "e8m0"
std::string_view tensor_dtype_name(TensorDType dtype);
std::size_t tensor_dtype_bytes(TensorDType dtype);  // E2M1: 1 (two codes per byte when packed)

enum class TensorKind : std::uint8_t {
  Input,       // given by the application (set_tensor)
  Param,       // given by the application, or owned by the session (own_parameters)
  OutputGrad,  // the gradient of an output, given to backward (set_tensor)
  Output,      // written by forward
  InputGrad,   // written by backward: the gradient of an input
  ParamGrad,   // written by backward: the gradient of a parameter
};
std::string_view tensor_kind_name(TensorKind kind);

// A tensor of a sequence's interface, with its sizes under the session's bindings. Names are
// the .fuse program's: "x", "fc1.weight", "dy", "y". A gradient has the name of what it is the
// gradient of ("x", "fc1.weight") and its kind says which.
struct TensorInfo {
  std::string name;
  TensorKind kind = TensorKind::Input;
  TensorDType dtype = TensorDType::BF16;
  std::vector<std::int64_t> shape;
  std::size_t bytes = 0;
};

// A quantized input or output (docs/embedding.md, "Quantized tensors"; TE's QuantizedTensor):
// how its scale-inverses are laid out, what a bound session expects of one, and a view of one in
// device memory.
enum class ScaleLayout : std::uint8_t {
  Tensor,        // one FP32 scale_inv, shared by both copies (delayed and current scaling)
  Block1x128,    // Float8 block scaling: a grid per copy, 1 x 128 blocks along its stored rows
  Block128x128,  // a grid per copy of 128 x 128 blocks
  // MXFP8 (E4M3 codes): an E8M0 scale per 32 elements along the GEMM's K, row-wise 1 x 32
  // ([rows][cols / 32]), column-wise 32 x 1 ([rows / 32][cols]); both copies [rows, cols].
  Mxfp8,
  // NVFP4 (E2M1 codes, two per byte, element 2i in the low nibble): an E4M3 scale per 16
  // elements along the stored rows ([stored rows][stored cols / 16]) and an FP32 tensor scale
  // S_enc per copy; the column-wise copy is x transposed, Hadamard-transformed when the recipe
  // says so (runtime/cpu/micro_scaling.h).
  Nvfp4,
};
// "tensor", "block_1x128", "block_128x128", "mxfp8_1x32", "nvfp4_1x16"
std::string_view scale_layout_name(ScaleLayout layout);

struct QuantizedTensorInfo {
  std::string name;                     // "h"
  TensorKind kind = TensorKind::Input;  // Input or Output
  TensorDType format = TensorDType::E4M3;
  ScaleLayout scales = ScaleLayout::Tensor;
  std::vector<std::int64_t> shape;  // the logical tensor's; its matrix is [rows, cols]:
  std::int64_t rows = 0;            // the leading dims flattened
  std::int64_t cols = 0;            // the last dim
  bool rowwise = true;              // the copies it carries: row-wise [rows, cols],
  bool columnwise = false;          // column-wise [cols, rows] (x transposed; MXFP8: [rows, cols])
  std::size_t rowwise_bytes = 0;    // each copy's data (NVFP4: two codes per byte)
  std::size_t columnwise_bytes = 0;
  // Entries of each copy's scale_inv: 1 per tensor (shared), else the grid of the stored copy,
  // [outer, inner] with the padding cuBLASLt's block modes read past (docs/embedding.md); and
  // the bytes of one entry (FP32 4; MXFP8's E8M0 and NVFP4's E4M3 scales 1).
  std::int64_t scale_inv_entries = 1;
  std::int64_t columnwise_scale_inv_entries = 0;
  std::int64_t scale_grid[2] = {1, 1};
  std::int64_t columnwise_scale_grid[2] = {0, 0};
  std::size_t scale_entry_bytes = 4;
  bool tensor_scales = false;  // NVFP4: each copy also carries its FP32 tensor scale S_enc
  bool hadamard = false;       // NVFP4: the column-wise copy is Hadamard-transformed (the recipe's
                               // rht; quantize() makes it so with QuantizeOptions::hadamard)
};

struct QuantizedTensorView {
  TensorDType format = TensorDType::E4M3;
  ScaleLayout scales = ScaleLayout::Tensor;
  std::vector<std::int64_t> shape;
  const void* rowwise = nullptr;     // [rows, cols] codes, 16-byte aligned
  const void* columnwise = nullptr;  // [cols, rows]; null without (a consumer's backward needs it)
  const void* scale_inv = nullptr;   // Tensor: the one FP32 value; else the row-wise grid
  const void* columnwise_scale_inv = nullptr;  // the column-wise grid (not for Tensor)
  // Bytes of memory behind each scale pointer (checked against what the layout needs).
  std::size_t scale_inv_bytes = 0;
  std::size_t columnwise_scale_inv_bytes = 0;
  // NVFP4: each copy's S_enc, one FP32 value (4-byte aligned); null for the other layouts.
  const float* tensor_scale = nullptr;
  const float* columnwise_tensor_scale = nullptr;
};

// Quantized tensors outside sessions (docs/embedding.md, "Quantized tensors"), for applications
// and tests, on a stream of the current device.
//
// What a quantized tensor of `shape` (its matrix: the leading dims flattened, by the last) under
// `scales` holds: rows, cols and each copy's scale_inv entries and grid extents, so that its
// memory can be allocated (kind Input; format E4M3, E2M1 for Nvfp4; hadamard false).
QuantizedTensorInfo quantized_tensor_info(const std::vector<std::int64_t>& shape,
                                          ScaleLayout scales, bool columnwise = true);

// A quantized tensor's memory to be written (opfuse::quantize): the pointers of a
// QuantizedTensorView, writable.
struct QuantizedTensorBuffers {
  TensorDType format = TensorDType::E4M3;
  ScaleLayout scales = ScaleLayout::Tensor;
  std::vector<std::int64_t> shape;
  void* rowwise = nullptr;
  void* columnwise = nullptr;  // null: not made
  void* scale_inv = nullptr;
  void* columnwise_scale_inv = nullptr;  // layouts other than Tensor, with a column-wise copy
  std::size_t scale_inv_bytes = 0;
  std::size_t columnwise_scale_inv_bytes = 0;
  float* tensor_scale = nullptr;  // NVFP4
  float* columnwise_tensor_scale = nullptr;
  QuantizedTensorView view() const;  // the same memory, to read
};

struct QuantizeOptions {
  // Block layouts: scales rounded down to a power of 2 (float8_block_scaling's default); one scale
  // per tensor: current scaling's power_of_2_scale (default off). Both: the amax floor.
  std::optional<bool> power_of_2_scale;
  double amax_epsilon = 0.0;
  // NVFP4: the column-wise copy Hadamard-transformed (nvfp4_block_scaling's rht, its default).
  bool hadamard = true;
};

// Quantizes `input` (bf16, `into.shape`, 16-byte aligned device memory) into `into` as a
// sequence's final quantize() does under the matching recipe: ScaleLayout::Tensor with current
// scaling (TE's Float8CurrentScaling: scale = 448 / amax of the tensor), the block layouts with
// float8_block_scaling's blocks (x_block 1 or 2), Mxfp8 and Nvfp4 as mxfp8_block_scaling and
// nvfp4_block_scaling cast a linear's input; the column-wise copy when into.columnwise is set.
// E4M3 codes (E2M1 for Nvfp4). Compiles (through the kernel cache) and keeps one program per
// shape, layout and options for the process; enqueued on `stream`, no host synchronization.
// UsageError, before anything runs, for a format, shape, null or misaligned pointer or scale
// buffer the layout cannot take.
void quantize(const void* input, const QuantizedTensorBuffers& into, cudaStream_t stream,
              const QuantizeOptions& options = {});

// Decodes the row-wise copy of `from` (or, `columnwise`, the column-wise one as stored: [cols,
// rows], MXFP8 [rows, cols]) into `output` (bf16, 16-byte aligned): each code times its block's
// scale_inv in fp32 (NVFP4: (code * block scale) * (1 / S_enc)), rounded to bf16
// (cpu::dequantize_tensor's values, bit for bit). UsageError, before anything runs, for a view
// without that copy, a misaligned pointer or a scale buffer too small.
void dequantize(const QuantizedTensorView& from, void* output, cudaStream_t stream,
                bool columnwise = false);

// A precision-debug config (docs/debugging.md): TE's config.yaml schema, read when the program
// compiles (errors located in it, as CompileError), its routing resolved into plan variants that a
// Session switches between by iteration.
struct DebugConfigSource {
  std::string path;  // the config file; or, when empty,
  std::string text;  // its text, called `name` in diagnostics
  std::string name = "debug.yaml";
};

// A fusion pattern the application declares, as a `fusion` declaration does in a .fuse file
// (docs/language.md, "Declared fusions"; TE's register_forward_fusion and
// register_backward_fusion). Checked like one: a step that names no op, a phase an op cannot run
// in, or ops no kernel runs together are a CompileError located in the declaration's text,
// `fusion NAME(phase = ..., priority = N) { op; op?; ... }`, shown as <CompileOptions.fusions[i]>.
struct FusionDeclaration {
  enum class Phase { Forward, Backward };
  std::string name;  // an identifier, unique among the program's names
  Phase phase = Phase::Forward;
  int priority = 1;  // > 0: tried before the built-in patterns (priority 0); < 0: after them
  std::vector<std::string> ops;  // op names, in dataflow order; "bias?" marks an optional step
};

struct CompileOptions {
  std::string recipe;  // a recipe declared in the file, or "bf16"; empty: each sequence's own
  // NVRTC target, e.g. "sm_90a"; empty: the current GPU's, or sm_90a on a machine without one.
  std::string arch;
  // Kernel cache directory; empty: $OPFUSE_CACHE_DIR, else ~/.cache/opfuse. use_cache = false
  // compiles every kernel.
  std::string cache_dir;
  bool use_cache = true;
  std::vector<std::string> disabled_passes;  // pass names, as `fusec ir --disable-pass`
  // FP8 GEMM accumulation (TE's defaults): fast in the forward GEMMs, split in dgrad and wgrad.
  bool fp8_fprop_fast_accum = true;
  bool fp8_backward_fast_accum = false;
  int compile_threads = 0;  // <= 0: every core
  // float8_block_scaling emulated on sm_90a too (block-quantized copies decoded to BF16, BF16
  // GEMMs), to compare the two paths on one GPU; targets without cuBLASLt's block-scale modes
  // always emulate (docs/language.md, float8_block_scaling). `fusec build --emulate-block-scaling`.
  bool emulate_block_scaling = false;
  // Precision debugging: the plain plan compiles as without it; the variants an iteration's
  // features need compile (through the kernel cache) the first time a session runs them.
  std::optional<DebugConfigSource> debug_config;
  // The application's features (opfuse/debug_feature.h), usable in the config by name.
  std::vector<std::shared_ptr<const DebugFeature>> debug_features;
  // Fusion patterns beside the program's own `fusion` declarations.
  std::vector<FusionDeclaration> fusions;
};

struct BuildStats {
  int kernels = 0;
  int cache_hits = 0;
  int compiled = 0;
  double compile_ms = 0;  // wall time of the kernel stage (NVRTC or cache loads)
};

// A compiled program: the plan of every sequence and its kernels' binaries. Compiling needs no
// GPU (NVRTC compiles to cubin for `arch`). Cheap to copy (shared, immutable).
class Program {
 public:
  // From .fuse text; `file_name` is shown in diagnostics (`mlp.fuse:3:7: error: ...`). Throws
  // CompileError with every diagnostic for a program with errors, JitError when NVRTC fails.
  static Program compile(std::string_view source, std::string_view file_name,
                         const CompileOptions& options = {});
  static Program compile_file(const std::string& path, const CompileOptions& options = {});
  // A `fusec build FILE -o DIR` output: DIR/plan.json and the kernels' binaries, verified against
  // DIR/kernels.json (sizes, SHA-256); no NVRTC. Throws UsageError for a missing, damaged or
  // stale directory (what to rebuild). Its plan carries each parameter's initializer, so
  // own_parameters() works as for a compiled program.
  static Program load_build(const std::string& dir);

  std::vector<std::string> sequences() const;
  const std::string& arch() const;
  // The recipe a sequence compiled with, e.g. "delayed_scaling(format = hybrid, ...)" or "bf16".
  std::string recipe(std::string_view sequence = {}) const;
  std::string plan_json() const;  // docs/codegen.md
  const BuildStats& build_stats() const;
  // Warnings of the compile (formatted like errors), e.g. a debug-config section that matches no
  // layer; empty when there were none.
  const std::string& warnings() const;
  bool has_debug_config() const;

  struct Impl;  // runtime/api/program_impl.h

 private:
  friend class Session;
  explicit Program(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Diagnostics of a .fuse program, formatted as `file:line:col: error: ...` with the line and a
// caret, in what().
class CompileError : public Error {
 public:
  using Error::Error;
};

enum class RunMode : std::uint8_t { Training, Inference };

// What Session::save writes and Session::load reads (docs/state_files.md): the parameters with
// the quantizer state and step count (a checkpoint), or the quantizer state and step count
// alone (what a framework keeps beside parameters it holds itself: opfuse.torch's extra state).
enum class StateParts : std::uint8_t { All, Quantizers };

// One FP8 quantizer of a sequence ("fc1.input", "fc1.weight", "fc1.grad_output") as it is now.
struct QuantizerStatus {
  std::string name;
  TensorDType format = TensorDType::E4M3;
  std::vector<float> amax_history;  // slot 0: the amax of the step in progress
  float scale = 1;                  // the scale the step's casts use
  float scale_inv = 1;
};

// One quantized copy of a block-scaled or micro-scaled quantizer (float8_block_scaling,
// mxfp8_block_scaling, nvfp4_block_scaling), which keep no tensor scale to show in
// QuantizerStatus (NVFP4 keeps one, and many block scales), as its latest cast made it
// (SessionOptions::block_summaries; docs/architecture.md, note "Block summaries").
struct BlockSummaryStatus {
  std::string quantizer;  // "fc1.input"
  bool columnwise = false;
  TensorDType format = TensorDType::E4M3;
  // The block, in the source's orientation: 1 x 128 row-wise, 128 x 1 column-wise, 128 x 128,
  // 1 x 32, 32 x 1, 1 x 16, 16 x 1, 16 x 16.
  int block_rows = 0;
  int block_cols = 0;
  std::int64_t blocks = 0;       // the padding of a scale grid is no block
  std::int64_t zero_blocks = 0;  // blocks whose amax is 0
  // The least and greatest block decode scale: Float8's FP32 scale_inv, MXFP8's 2^(e - 127),
  // NVFP4's E4M3 block scale (its tensor scale comes on top).
  float scale_inv_min = 0;
  float scale_inv_max = 0;
  bool has_tensor_scale = false;  // NVFP4
  float tensor_scale = 0;         // NVFP4: the S_enc the copy was cast with
};

struct MemoryStats {
  std::size_t live_bytes = 0;  // the session's activations and workspaces now
  std::size_t peak_bytes = 0;  // most at once since the session began or reset_peak_memory()
  // The device allocation the activations and workspaces are placed in (at least the peak of
  // the run mode used; made by the first forward, kept until the binding changes).
  std::size_t reserved_bytes = 0;
  std::size_t owned_bytes = 0;  // parameters the session owns
};

// One statistic of a precision-debug feature, as logged (TE's `{layer}_{tensor}_{stat}` at an
// iteration; `gemm` names the GEMM for statistics of a GEMM's operand, else empty).
struct DebugStat {
  std::string layer, tensor, gemm, stat;
  std::int64_t iteration = 0;
  double value = 0;
};

// How a session of a program compiled with a debug config runs it (docs/debugging.md).
struct DebugSessionOptions {
  // TE's log layout (statistics log, debug log) plus one JSON object per statistic, under this
  // directory; empty: no files. An unwritable directory is a UsageError from the constructor.
  std::string log_dir;
  int rank = 0;                      // the log files' global rank
  int precision = 4;                 // decimals of the text log's values (TE prints 4); 0 to 30
  std::int64_t start_iteration = 0;  // the iteration of the first step (a resumed run)
  // Called with each statistic of an ended iteration, in log order and iteration order, on the
  // calling thread of the session call that logs it (Session::step).
  std::function<void(const DebugStat&)> on_stat;
};

// Tensor parallelism (docs/parallel.md): a sequence built `with parallel(tp = N)` runs as N
// processes, one GPU each, every one with its own Session; this process is rank `rank` of `size`
// (= N). The ranks meet through NCCL: give every rank the id rank 0 made with
// new_parallel_id() (distributed by the application), or leave `nccl_id` empty and name a
// directory all ranks share plus a job name unique to this launch, through which rank 0 hands it
// out. `fusec run --nproc N` starts the ranks and sets OPFUSE_RANK, OPFUSE_WORLD_SIZE,
// OPFUSE_LOCAL_DEVICE, OPFUSE_BOOTSTRAP_DIR and OPFUSE_JOB, which from_environment() reads. Set
// the rank's CUDA device before creating the Session. A one-rank sequence (size 1) runs its
// collectives as copies without NCCL, unless `nccl_id` is set: then through a one-rank NCCL
// communicator, the calls N ranks make (the same results; a check of the NCCL path on one GPU).
struct ParallelOptions {
  int rank = 0;
  int size = 1;
  std::string nccl_id;        // new_parallel_id()'s text; empty: through bootstrap_dir
  std::string bootstrap_dir;  // shared by the ranks
  std::string job;            // [A-Za-z0-9._-], unique per launch
  int timeout_s = 300;        // how long a rank waits for rank 0's id
  // The launcher's variables; a one-rank ParallelOptions when OPFUSE_WORLD_SIZE is unset.
  // Throws UsageError for malformed values.
  static ParallelOptions from_environment();
};
// A new NCCL unique id as text, for ParallelOptions::nccl_id (rank 0 makes it, every rank uses
// it). Throws UsageError when NCCL cannot be loaded.
std::string new_parallel_id();

struct SessionOptions {
  // Time the first candidates cuBLASLt's heuristic offers for each GEMM at its first run and
  // keep the fastest, instead of taking the heuristic's first. The first forward/backward then
  // waits for the GPU once per GEMM shape; the choice holds for the whole process (sessions in
  // one process compute bit-identical results), but another process may choose another
  // algorithm (results may differ in the last bits). Accumulating GEMMs keep the heuristic's.
  bool gemm_autotune = false;
  // Inference forwards whose inputs total at most 4 MiB are host-bound (each cuBLASLt call and
  // launch costs microseconds of CPU time): from the third such forward with the same parameter
  // pointers on, the session records the forward into a CUDA graph once and replays it, copying
  // the inputs into the recording's own buffers (a few us of device time). Same results; false
  // runs every forward step by step.
  bool auto_graph = true;
  // Inference forwards run an FP8 GEMM with the gated activation after it (SwiGLU, GeGLU, ReGLU,
  // QGeGLU, SReGLU with their E4M3 cast under delayed scaling) in the GEMM's epilogue, one CUTLASS
  // kernel instead of cuBLASLt's GEMM and the activation kernel, where the plan marks the pair
  // and the GPU is an sm_90 (docs/architecture.md, "Fused GEMM epilogues"). The same values up to
  // the GEMM's FP32 summation order; it keeps one more copy of that weight (n x k bytes). Off by
  // default: measured correctly (after the fix of its output's memory placement) it is slower
  // than the two steps on the H200 so far (bench/RESULTS.md).
  bool fused_epilogues = false;
  // Training forwards too, with the kernel that also writes the activation's transposed copy and
  // the GEMM's BF16 output for backward. Off by default: on the H200 it is slower than the two
  // steps it replaces (bench/RESULTS.md). Needs fused_epilogues.
  bool fused_training_epilogues = false;
  // Used when the program was compiled with a debug config: each iteration (from one step() to
  // the next) runs the plan variant its routing asks for, and step() logs its statistics.
  DebugSessionOptions debug;
  // This process's rank of a tensor-parallel sequence; size must equal the sequence's tp.
  ParallelOptions parallel;
  // The data-parallel group (TE's amax reduction group): this process's place among replicas of
  // the sequence (one per data-parallel rank, each a rank of the tensor-parallel group when the
  // sequence has one) that train on other data. step() max-reduces every delayed-scaling amax over
  // it too (one more NCCL all-reduce of the one amax array), so all replicas keep the same
  // scales and their FP8 casts agree; current scaling stays per replica. size 1 (the default):
  // none. Its own NCCL id (or bootstrap file with its own job name), not `parallel`'s.
  ParallelOptions amax_group;
  // Summarize every block-scaled or micro-scaled copy right after the step that makes it (one
  // small launch per copy; block_summaries() reads them). Off: nothing is compiled or launched
  // for it. Refused (UsageError) for a tensor-parallel sequence and with a debug config.
  bool block_summaries = false;
};

// One sequence of a program on the current CUDA device. Not thread-safe; one stream at a time
// per call (calls on different streams must be ordered by the application). The session frees
// its device memory in stream order on the stream of the call that allocated it (the
// constructor's, bind()'s): destroy the session before that stream (examples/embed/main.cpp).
class Session {
 public:
  // `sequence` may be empty when the program has one. Throws UsageError without a GPU, for an
  // unknown sequence, or for kernels compiled for another arch than the current GPU's.
  explicit Session(const Program& program, std::string_view sequence = {},
                   cudaStream_t stream = nullptr, const SessionOptions& options = {});
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  const std::string& sequence() const;

  // Sets the symbolic sizes ({"tokens", 4096}). Throws UsageError for a missing or unknown
  // name, a size < 1 or a GEMM size cuBLASLt cannot take (naming the .fuse line).
  void bind(const std::map<std::string, std::int64_t>& sizes);
  std::vector<TensorInfo> tensors() const;

  // Allocates every parameter on the device and fills it as `fusec run` does from `seed`, each as
  // its op declares (linear weights ~ N(0, 0.02), norm weights 1 or 0 when zero-centered, biases
  // 0); waits for the copies. The session owns them; parameter() gives their pointers. Call after
  // bind().
  void own_parameters(std::uint64_t seed, cudaStream_t stream = nullptr);
  // Allocates every parameter zero-filled (to load() a checkpoint into); the session owns them.
  void allocate_parameters(cudaStream_t stream = nullptr);
  void* parameter(std::string_view name) const;  // UsageError unless owned

  // The application's device memory for an input, parameter or output gradient (16-byte
  // aligned, laid out row-major as tensors() says). A new pointer is asked of CUDA: it must be
  // device memory of this GPU or managed memory, with room for the tensor from that address
  // (UsageError otherwise). Replacing a parameter invalidates the FP8 weight copies.
  void set_tensor(std::string_view name, const void* device_ptr);
  // Quantized inputs and outputs (docs/embedding.md, "Quantized tensors"): what each one of this
  // sequence is under the bindings; an input's copies and scales (checked against that: format,
  // scale layout, shape, 16-byte alignment, the scale buffers' sizes; UsageError before anything
  // runs); an output's, valid until the next forward (its per-tensor scale_inv until the next
  // forward or step(); an inference forward makes no column-wise copy: null there). A plain
  // set_tensor() of a quantized input is a UsageError.
  std::vector<QuantizedTensorInfo> quantized_tensors() const;
  void set_tensor(std::string_view name, const QuantizedTensorView& view);
  QuantizedTensorView quantized_output(std::string_view name) const;
  // The parameters' contents changed (an optimizer step): the FP8 weight copies are recast at the
  // next forward (under `with fp8_weights` while a graph is held: now, on the graph's stream).
  void parameters_changed();

  void forward(cudaStream_t stream, RunMode mode = RunMode::Training);
  void backward(cudaStream_t stream);
  // Ends a training step: every quantizer's amax history and scale updated in one launch; the
  // FP8 weight copies are recast at the next forward. Under `with fp8_weights` they are the
  // weights: recast only after parameters_changed(), set_tensor() of a parameter or load().
  // With a debug config it also ends the debug iteration: the next forward runs the next
  // iteration's variant. The iteration's statistics (copied to the host as its forwards and
  // backwards ran) are logged and handed to DebugSessionOptions::on_stat once the GPU has
  // finished it, without draining the stream: at a later forward, backward or step(), at the
  // next step() at the latest (which waits for the iteration before the one it ends), at
  // flush_debug_stats() or when the session is destroyed. Logs trail by at most one iteration.
  void step(cudaStream_t stream);
  // Waits for the statistics of every iteration step() ended and logs them (files, on_stat);
  // throws Error when the log files cannot be written. Nothing to do without a debug config.
  void flush_debug_stats();
  // The debug iteration the next forward belongs to (DebugSessionOptions::start_iteration plus
  // the steps since); UsageError without a debug config.
  std::int64_t debug_iteration() const;

  // Results, device memory the session owns: outputs valid until the next forward, gradients
  // until the next forward or backward.
  const void* output(std::string_view name) const;
  const void* input_grad(std::string_view name) const;
  const void* param_grad(std::string_view name) const;

  // Parameters (owned or given) and the quantizer state, to a versioned, checksummed file
  // written atomically (docs/state_files.md). load() checks the file against this sequence and
  // refuses, loading nothing, a damaged or mismatched one. Both wait for `stream`. With
  // StateParts::Quantizers, save() writes the quantizer state and step count alone and load()
  // reads only those (from such a file or a whole checkpoint), leaving the parameters as they
  // are; a quantizers-only file is refused by a load of StateParts::All.
  void save(const std::string& path, cudaStream_t stream, StateParts parts = StateParts::All);
  void load(const std::string& path, cudaStream_t stream, StateParts parts = StateParts::All);

  // CUDA graphs, for fixed sizes and tensor pointers: capture() records one inference forward
  // or one whole training step (forward, backward, step()) on `stream` (not the legacy default
  // stream) without running it; replay() launches the recording: one call, no per-kernel host
  // work. The recording casts the FP8 weights itself, so parameters may change between replays
  // (under `with fp8_weights` the casts stay outside it: call parameters_changed()).
  // Until release_graph(), forward/backward/step/bind/set_tensor/load throw UsageError (they
  // would disagree with the recording); outputs and gradients are read as after eager calls.
  // A session with a debug config cannot capture (its plan changes by iteration; TE runs debug
  // iterations without graphs too): UsageError.
  enum class GraphScope : std::uint8_t { InferenceForward, TrainingStep };
  void capture(cudaStream_t stream, GraphScope scope);
  void replay(cudaStream_t stream);
  void release_graph();
  bool has_graph() const;

  // Every per-tensor quantizer (plan order), copied to the host after waiting for `stream`; block
  // scaling (float8_block_scaling) keeps its scales with each FP8 copy and is not listed.
  std::vector<QuantizerStatus> quantizers(cudaStream_t stream) const;
  // Every copy of a block-scaled or micro-scaled quantizer made so far (plan order, the row-wise
  // copy first), each as its latest cast made it, copied to the host after waiting for `stream`;
  // empty for other recipes. UsageError without SessionOptions::block_summaries.
  std::vector<BlockSummaryStatus> block_summaries(cudaStream_t stream) const;

  MemoryStats memory() const;
  void reset_peak_memory();

 private:
  // runtime/api/session_access.h: the runtime's own tools (fusec bench) reach the executor.
  friend struct SessionAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace opfuse
