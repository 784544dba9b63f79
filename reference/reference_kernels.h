// The CPU reference of every op kind: one kernel per kind, found by reference_kernel(kind), so the
// executor (reference_executor.cpp) never switches on kinds. This is the reference half of an
// op's registry entry (compiler/ir/op_table.h): the reference library builds on the compiler, so
// the op table cannot name these kernels itself, and tests/unit/test_op_registry.cpp checks that
// every kind has one. A kernel reads its operands and writes its results unrounded; the executor
// rounds what leaves a top-level op. The math is in reference_ops.h.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "collectives.h"
#include "cpu_quantizers.h"
#include "cpu_tensor.h"
#include "debug/capture.h"
#include "debug/stats.h"
#include "ir/graph.h"

namespace opfuse::cpu {

// In place: the values as a tensor of `dtype` stores them (bf16 and fp16 round; fp32 keeps them).
// A fused kernel quantizes (or takes statistics of) its producer's value as the unfused pair
// stores and reads it, and a run's inputs are rounded as the GPU run stores them (note "Block
// summaries": their lines agree where the values do); rounding is idempotent, so values that
// were stored already do not move.
void round_as_stored(std::span<float> values, ir::DType dtype);

// A block-scaled FP8 value as its cast made it: the stored copy's FP8 bits and scale_inv grid
// (note "Block scale grids" in runtime/cpu/block_quantization.h), what the GEMMs reading it take.
struct BlockScaled {
  BlockQuantizedCopy copy;
  bool two_d = false;
};

// What a kernel sees of the executor's state: the graph, every value, and what FP8 values carry.
template <typename T>
struct ReferenceContext {
  ir::Sequence seq;
  std::vector<std::vector<int64_t>> shapes;  // per value id
  std::vector<Tensor<T>> values;             // per value id; parameters live here too
  std::vector<float> scale_inv;              // per value id: FP8 values' scale_inv at cast time
  std::vector<bool> transposed;              // per value id: a column-wise FP8 copy
  std::map<ir::ValueId, BlockScaled> block_scaled;  // block-scaled FP8 values: their copies
  // MXFP8 / NVFP4 codes of quantized boundaries (note "Quantized boundaries"): the copies a
  // quantized output's casts made, or a quantized input's caller gave.
  std::map<ir::ValueId, MicroCopy> micro_codes;
  // Note "Block summaries": per (quantizer, column-wise) copy of a block-scaled or micro-scaled
  // quantizer, its latest cast's (the GEMM operands' casts; not the quantize op's).
  std::map<std::pair<int, bool>, BlockCopySummary> block_summaries;
  std::vector<Quantizer> quantizers;  // like seq.quantizers
  // fp8_weights: per weight param, the FP8 codes and scale_inv cast in params_changed() (block
  // scaling: the weight's values at that change, and 0).
  std::map<ir::ValueId, std::pair<std::vector<float>, float>> weight_codes;
  // The statistics records of the last run, per slot of seq.inspections (tensor_stats ops).
  std::vector<debug::TensorMoments> stat_records;
  // The tensors captured by the last run, per slot of seq.captures (tensor_capture ops).
  std::vector<debug::CapturedTensor> captures;
  // The rank's group in a tensor-parallel sequence (reference/collectives.h); null with tp = 1.
  Collectives* group = nullptr;
  // Dropout (note "Dropout" in docs/language.md): a training forward draws masks, an inference
  // forward passes x through; `step` is the training step the Philox counter reads (step() of
  // the executor advances it); each forward dropout's mask as packed 32-bit words, by its mask
  // value (the result backward reads), exactly as the GPU writes them (values[] holds them as
  // numbers too, which float cannot keep exactly).
  bool training = true;
  uint32_t step = 0;
  std::map<ir::ValueId, std::vector<uint32_t>> dropout_masks;

  Tensor<T> zeros_like(ir::ValueId id) const { return Tensor<T>::zeros(shapes[id]); }
  const Tensor<T>& in(const ir::Operation& op, size_t i) const { return values[op.operands[i]]; }
  // The op's i-th result, zeroed to its shape.
  Tensor<T>& out(const ir::Operation& op, size_t i) {
    values[op.results[i]] = zeros_like(op.results[i]);
    return values[op.results[i]];
  }
  // A GEMM operand's FP8 scale_inv (1 for high-precision operands).
  T operand_scale(const ir::Operation& op, size_t i) const {
    return seq.value(op.operands[i]).quantizer >= 0 ? T(scale_inv[op.operands[i]]) : T(1);
  }
};

template <typename T>
using ReferenceKernel = void (*)(ReferenceContext<T>& ctx, const ir::Operation& op);

// Every fixed kind but Fused (the executor runs a fusion's parts), and every pointwise and
// pointwise-backward kind (one kernel each, evaluating the kind's definition); nullptr otherwise.
template <typename T>
ReferenceKernel<T> reference_kernel(ir::OpKind kind);

extern template ReferenceKernel<float> reference_kernel<float>(ir::OpKind);
extern template ReferenceKernel<double> reference_kernel<double>(ir::OpKind);

}  // namespace opfuse::cpu
