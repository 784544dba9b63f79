// The CPU reference executor: an interpreter of the training graph (docs/architecture.md,
// "Training graph"): forward() runs the forward ops, backward() the backward ops build-backward
// made. Every op's result is rounded to its storage dtype; a fused op runs its parts in order and
// rounds only the values that leave it (its meaning is the composition of its parts). cast_fp8
// makes real FP8 values and GEMMs apply the quantizers' scale_inv, as cuBLASLt does. It is the
// oracle the GPU executor and every fusion are checked against. Each op runs its kind's kernel
// (reference_kernels.h).
//
// A sequence straight from the front end is lowered here (build-backward, plan-quantization, no
// fusion); pass a sequence that went through the pipeline to run it as compiled.
//
// T = float computes like the GPU kernels (fp32 arithmetic); T = double measures error.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives.h"
#include "cpu_quantizers.h"
#include "cpu_tensor.h"
#include "debug/capture.h"
#include "debug/stats.h"
#include "ir/graph.h"
#include "quantized_tensor.h"

namespace opfuse::cpu {

struct ReferenceOptions {
  // Round each op's results to their storage dtype (false: keep every value in T, for measuring
  // the error of rounding itself).
  bool round_outputs = true;
  // A tensor-parallel sequence (`with parallel(tp = N)`): this rank's group of N
  // (reference/collectives.h), which the collectives and the FP8 amax reductions use. Every rank's
  // executor runs on its own thread and makes the same calls. Null for tp = 1.
  Collectives* group = nullptr;
  // The data-parallel group (TE's amax reduction group): replicas of this sequence (each rank of
  // a tensor-parallel one) that train on other data. step() max-reduces every delayed-scaling
  // quantizer's amax over it, after the tensor-parallel group's, so every replica updates the
  // same scales. Current scaling stays per replica (each casts its own tensors). Null: none.
  Collectives* amax_group = nullptr;
};

// A quantizer as shown to users and tests.
struct QuantizerInfo {
  std::string name;
  Fp8Format format;
  std::vector<float> amax_history;
  float scale;
  float scale_inv;
  // The spec's format ("e4m3", "e5m2", "e2m1") and whether the quantizer keeps a tensor scale at
  // all (Float8 block scaling and MXFP8 keep none: their scales are per block).
  std::string format_name = {};
  bool has_tensor_scale = true;
};

template <typename T>
struct Gradients {
  std::vector<Tensor<T>> inputs;  // one per sequence input, in signature order
  std::vector<Tensor<T>> params;  // one per parameter, in param_names() order
};

template <typename T>
class ReferenceExecutor {
 public:
  // Binds the symbolic dimensions; throws ReferenceError naming every unbound symbol or bad size.
  // Parameters start at zero (set them with param()). Keeps its own copy of the sequence.
  ReferenceExecutor(const ir::Sequence& sequence, const Bindings& bindings,
                    const ReferenceOptions& options = {});
  ~ReferenceExecutor();
  ReferenceExecutor(ReferenceExecutor&&) noexcept;

  // The training graph it runs (the given sequence, lowered if it had no backward).
  const ir::Sequence& sequence() const;
  // Concrete shapes of the sequence's inputs and outputs (signature order).
  std::vector<std::vector<int64_t>> input_shapes() const;
  std::vector<std::vector<int64_t>> output_shapes() const;

  // Parameters by IR name ("fc1.weight"). After changing one, call params_changed().
  const std::vector<std::string>& param_names() const;
  Tensor<T>& param(std::string_view name);
  // Rounds every parameter to its storage dtype; under fp8_weights, re-casts each linear weight
  // to FP8 with its weight quantizer and keeps only the dequantized FP8 value.
  void params_changed();

  // Runs forward; returns the outputs in signature order. Saves what backward needs. A quantized
  // main input (docs/language.md, "Quantized inputs and outputs") is read from
  // set_quantized_input() and its entry in `inputs` is ignored (it may be empty); a quantized
  // main output is returned decoded (its row-wise copy times its scale_inv), its copies by
  // quantized_output().
  std::vector<Tensor<T>> forward(const std::vector<Tensor<T>>& inputs);
  // The quantized main input's copies for the next forwards (kept until set again). Throws
  // ReferenceError when the sequence has no quantized input, or `q` has another format, scale
  // layout or shape than the input's spec and bound shape, or lacks a copy it declares.
  void set_quantized_input(const QuantizedTensor& q);
  // Quantizes x (the input's logical [rows, cols] values) as a producer's final quantize() under
  // this sequence's recipe would (per tensor: current scaling's scale of x's amax; blocks and
  // MXFP8 / NVFP4: their own scales) and sets the copies (fusec run of a consumer sequence).
  void quantize_input(const Tensor<T>& x);
  // The quantized main output's copies as the last forward made them (an inference forward
  // makes no column-wise copy). Throws ReferenceError without one or before a forward.
  QuantizedTensor quantized_output() const;
  // An inference forward (PyTorch's eval mode): dropout passes its input through. Backward
  // cannot follow it.
  std::vector<Tensor<T>> forward_inference(const std::vector<Tensor<T>>& inputs);
  // Backward of the last forward, seeded with one gradient per output (an empty tensor = zero).
  Gradients<T> backward(const std::vector<Tensor<T>>& output_grads);
  // p -= lr * grad for every parameter, then params_changed().
  void sgd_step(const Gradients<T>& grads, double lr);

  // Every FP8 quantizer in the order plan-quantization made them ("<layer>.input", ".weight",
  // ".grad_output"); empty under bf16.
  std::vector<QuantizerInfo> quantizers() const;
  // Ends a training step: delayed-scaling amax history roll + scale update of every quantizer.
  // Tensor-parallel: first the max of every quantizer's amax over the ranks (one reduction), so
  // every rank scales with the amax of the whole tensor, as the unsharded run would.
  void step();
  // The training step dropout's Philox counter reads (0 at the first; step() adds one), and a
  // dropout op's mask of the last training forward as packed bits (bit c % 32 of word
  // [row, c / 32] is element [row, c]: 1 kept), by the op's instance name; throws
  // ReferenceError for an instance with no dropout mask.
  uint32_t dropout_step() const;
  const std::vector<uint32_t>& dropout_mask(std::string_view instance) const;
  // Takes over the state (history, scale, scale_inv) of the quantizers in `states` with the same
  // name, format and history length; the others keep theirs. For a plan variant that continues
  // another's training (compiler/debug_config/instrument.h).
  void set_quantizer_states(const std::vector<QuantizerInfo>& states);

  // Note "Block summaries" (runtime/cpu/block_summary.h): every copy of a block-scaled or
  // micro-scaled quantizer cast since construction, as its latest cast made it, in quantizer
  // order (the row-wise copy first). Empty for per-tensor recipes.
  std::vector<BlockCopySummary> block_summaries() const;

  // The statistics records (debug/stats.h) the last forward and backward filled, one per slot of
  // sequence().inspections; empty for a sequence without (the plain plan).
  const std::vector<debug::TensorMoments>& stat_records() const;
  // The tensors the last forward and backward captured, per slot of sequence().captures; empty for
  // a sequence without (the plain plan).
  const std::vector<debug::CapturedTensor>& captures() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

extern template class ReferenceExecutor<float>;
extern template class ReferenceExecutor<double>;

}  // namespace opfuse::cpu
