// The CPU reference executor: runs one IR sequence forward and backward on the host with TE's
// semantics, rounding every op's result to its storage dtype (the unfused meaning) and emulating
// the FP8 recipes' GEMM operands (quantize -> dequantize with each quantizer's scale). It is the
// oracle the GPU executor and every fusion are checked against.
//
// T = float computes like the GPU kernels (fp32 arithmetic); T = double measures error.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cpu_quantizers.h"
#include "cpu_tensor.h"
#include "ir/graph.h"

namespace opfuse::cpu {

struct ReferenceOptions {
  // Round each op's result (and each gradient it produces) to the value's storage dtype.
  bool round_outputs = true;
  // Per op (indexed like Sequence::ops), overriding round_outputs: lets a fused group be run as a
  // composition with rounding only at its boundary. Empty: round_outputs for every op.
  std::vector<bool> round_after_op;
};

// A quantizer as shown to users and tests.
struct QuantizerInfo {
  std::string name;
  Fp8Format format;
  std::vector<float> amax_history;
  float scale;
  float scale_inv;
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
  // Parameters start at zero (set them with param()); the sequence must outlive the executor.
  ReferenceExecutor(const ir::Sequence& sequence, const Bindings& bindings,
                    const ReferenceOptions& options = {});
  ~ReferenceExecutor();
  ReferenceExecutor(ReferenceExecutor&&) noexcept;

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

  // Runs forward; returns the outputs in signature order. Saves what backward needs.
  std::vector<Tensor<T>> forward(const std::vector<Tensor<T>>& inputs);
  // Backward of the last forward, seeded with one gradient per output (an empty tensor = zero).
  Gradients<T> backward(const std::vector<Tensor<T>>& output_grads);
  // p -= lr * grad for every parameter, then params_changed().
  void sgd_step(const Gradients<T>& grads, double lr);

  // Every FP8 quantizer in op order ("<layer>.input", ".weight", ".grad_output"); empty under bf16.
  std::vector<QuantizerInfo> quantizers() const;
  // Ends a training step: delayed-scaling amax history roll + scale update of every quantizer.
  void step();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

extern template class ReferenceExecutor<float>;
extern template class ReferenceExecutor<double>;

}  // namespace opfuse::cpu
