#include "run_steps.h"

#include <fmt/format.h>

#include <cmath>

#include "driver/compile.h"
#include "numerics.h"

namespace opfuse::cpu {

double squared_norm(std::span<const float> values) {
  double sum = 0;
  for (float v : values) sum += double(v) * double(v);
  return sum;
}

std::string format_run_header(const ir::Sequence& sequence, const RunOptions& options) {
  std::string bindings;
  for (const auto& [name, size] : options.bindings) bindings += fmt::format(" {}={}", name, size);
  std::string out =
      fmt::format("sequence {}  recipe {}{}\nbindings{}  steps {}  seed {}  lr {}\n", sequence.name,
                  ir::recipe_string(sequence.recipe), sequence.fp8_weights ? "  fp8_weights" : "",
                  bindings.empty() ? " (none)" : bindings, options.steps, options.seed, options.lr);
  if (sequence.parallel.active())
    out += fmt::format(
        "ranks: tp = {}{}, simulated in one process from the unsharded parameters and inputs; "
        "every value below is of the whole tensors\n",
        sequence.parallel.tp, sequence.parallel.sp ? ", sp" : "");
  out += fmt::format(
      "{}; SGD on every parameter\nquantizers: amax of this step (history slot 0) and the scale "
      "used in it\n",
      kRunLossDescription);
  return out;
}

std::string format_step(int step, const StepReport& report) {
  const double loss = 0.5 * report.sum_squares / double(report.numel);
  std::string out = fmt::format("\nstep {:>4}  loss {:.6e}  |y| {:.6e}\n", step, loss,
                                std::sqrt(report.sum_squares));
  for (const auto& [name, norm] : report.grad_norms)
    out += fmt::format("  grad   {:<32} |g| {:.6e}\n", name, norm);
  for (const QuantizerInfo& q : report.quantizers) {
    if (!q.has_tensor_scale) continue;  // block scales: one per block, none for the tensor
    out += fmt::format("  quant  {:<32} {}  amax {:.6e}  scale {:.6e}\n", q.name, q.format_name,
                       q.amax_history[0], q.scale);
  }
  for (const BlockCopySummary& copy : report.blocks) out += format_block_summary(copy);
  return out;
}

std::string format_block_summary(const BlockCopySummary& copy) {
  const BlockSummary& s = copy.summary;
  const double zero_percent =
      s.blocks == 0 ? 0.0 : 100.0 * double(s.zero_blocks) / double(s.blocks);
  std::string line = fmt::format(
      "  blocks {:<32} {}  {:<7} {:>8} blocks  scale_inv {:.6e} .. {:.6e}  zero blocks {} "
      "({:.2f}%)",
      copy.quantizer + (copy.columnwise ? ".columnwise" : ".rowwise"), copy.format_name,
      block_shape_name(copy.block_rows, copy.block_cols), s.blocks, s.scale_inv_min,
      s.scale_inv_max, s.zero_blocks, zero_percent);
  if (copy.has_tensor_scale) line += fmt::format("  tensor scale {:.6e}", copy.tensor_scale);
  return line + "\n";
}

ir::Sequence lowered_for_run(const ir::Sequence& sequence, const debug::Routing* routing) {
  if (sequence.has_backward) {
    if (routing) throw ReferenceError("a debug config needs the sequence as written, not lowered");
    return sequence;
  }
  ir::Program program;
  program.sequences.push_back(sequence);
  driver::CompileOptions passes_only;
  passes_only.last_stage = driver::Stage::Passes;
  passes_only.debug_routing = routing;
  driver::CompileResult r = driver::compile_ir(std::move(program), nullptr, nullptr, passes_only);
  if (!r.ok()) throw ReferenceError(r.error);
  return std::move(r.program.sequences.at(0));
}

Tensor<float> seeded_input(const std::vector<int64_t>& shape, uint64_t seed, size_t index) {
  return seeded_normal(shape, seed ^ (0x9E3779B97F4A7C15ull + index), 1.0);
}

}  // namespace opfuse::cpu
