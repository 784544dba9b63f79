// Tensor captures of a plan variant (docs/debugging.md, "DumpTensors" and "C++ features"): which
// inspected tensors a routing captures, and what is done with them after each run of an
// iteration: DumpTensors writes them as .npy files, C++ features' inspect_tensor turns them into
// logged statistics. Used by the CPU run loop (reference/run_driver.cpp) and meant for the GPU
// loop (through compiler/debug_config/debug_run.h): after a run, add_run(slots, captures); at the
// end of the iteration, finish().
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "debug/capture.h"
#include "debug/stat_log.h"
#include "debug_config/routing.h"
#include "ir/graph.h"

namespace opfuse::debug {

// apply_routing's part for one inspector `f` of `tensor` of layer `l` that is neither
// LogTensorStats nor LogFp8TensorStats: adds the captures it needs to `seq.captures` (once per
// layer, tensor and kind): the high-precision tensor, and the FP8 copy its first GEMM reads
// (plan::CaptureSlot::quantized) for DumpTensors' quantized_tensor and for C++ features, when
// `quantized_by` says how that GEMM's copy is scaled this iteration (nullopt: it runs in high
// precision, so there is no copy, as in TE). A copy opfuse cannot capture yet is a message in
// `refused` for DumpTensors (an MXFP8 copy: none is made yet) and left out for C++ features.
void add_capture(ir::Sequence& seq, const LayerRouting& l, TensorKind tensor,
                 const FeatureConfig& f, std::optional<plan::ScalingKind> quantized_by,
                 std::vector<std::string>& refused);

// The FP8 bit pattern (E4M3 or E5M2, `format`) of `value`, which must be a number of that format
// exactly (a captured FP8 copy's values are); NaN gives the format's NaN with value's sign.
// nullopt for a value the format cannot hold exactly, or another format.
std::optional<uint8_t> fp8_code(float value, plan::DType format);

// The scale_inv of a quantized capture: the one value of a per-tensor scale, or the block grid
// row-major [row blocks][column blocks] of the capture's shape (a 1 x 128 grid arrives
// block-column major and is transposed), its shape in `shape` (empty for one value). Throws
// DebugLogError when the grid's size does not match the capture.
std::vector<float> scale_grid(const plan::CaptureSlot& slot, const CapturedTensor& tensor,
                              std::vector<int64_t>* shape);

// Where a rank's dumps go: {log_dir}/tensor_dumps/rank_{rank}.
std::filesystem::path dump_root(const std::filesystem::path& log_dir, int rank);
// The directory of one iteration's dumps: {dump_root}/iter_{iteration:06d}.
std::filesystem::path dump_dir(const std::filesystem::path& log_dir, int rank, int64_t iteration);

// True if any enabled section bound to a layer has an enabled DumpTensors.
bool dumps_tensors(const std::vector<LayerBinding>& bindings);
// Creates dump_root(log_dir, rank) and checks that a file can be written there: call before the
// first step. Throws DebugLogError "cannot write tensor dumps to '<dir>': <reason>".
void check_dump_dir(const std::filesystem::path& log_dir, int rank);

// The captures of one iteration, over its runs (micro-batches).
class IterationCaptures {
 public:
  // One run's captures, `captures[i]` for `slots[i]` (a sequence's Sequence::captures, or the
  // plan's SequencePlan::capture_slots).
  void add_run(std::span<const plan::CaptureSlot> slots, std::span<const CapturedTensor> captures);
  // More captures of the last run (its backward, after add_run() took its forward's).
  void add_to_last_run(std::span<const plan::CaptureSlot> slots,
                       std::span<const CapturedTensor> captures);
  // Does what the routing's features ask with every run's captures: DumpTensors writes
  // dump_dir(log_dir, rank, iteration)/{layer}_{tensor}.npy (float32, the tensor's shape) when
  // the iteration had one run, {layer}_{tensor}_mb{k}.npy for run k when it had several (a
  // weight once, from the first run), and for quantized_tensor {layer}_{tensor}_quantized.npy
  // (uint8: the FP8 bit patterns), {layer}_{tensor}_quantized_scale_inv.npy (float32, shape (),
  // or [row blocks, column blocks] for a block-scaled copy) and {layer}_{tensor}_quantized.json
  // (format, shape, scaling and block, the files, how to dequantize), with the
  // same _mb{k} rule; C++ features' inspect_tensor is called per run (a weight once), with the
  // quantized copy where one was captured, and its statistics returned, in order. Throws
  // DebugLogError for a dump that cannot be written.
  std::vector<StatRecord> finish(const Routing& routing, int64_t iteration,
                                 const std::filesystem::path& log_dir, int rank) const;
  bool empty() const { return runs_.empty(); }

 private:
  std::vector<std::vector<std::pair<plan::CaptureSlot, CapturedTensor>>> runs_;
};

}  // namespace opfuse::debug
