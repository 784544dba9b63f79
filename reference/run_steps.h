// The pieces of `fusec run --device cpu` (run_driver.h) that one rank's training loop and the
// simulated ranks' (run_ranks.h) share, so that both start from the same values and print the
// same report.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cpu_tensor.h"
#include "debug_config/routing.h"
#include "ir/graph.h"
#include "reference_executor.h"
#include "run_driver.h"

namespace opfuse::cpu {

// What one step reports, over the whole tensors.
struct StepReport {
  double sum_squares = 0;                                  // of the main output
  int64_t numel = 0;                                       // of the main output
  std::vector<std::pair<std::string, double>> grad_norms;  // per parameter, in executor order
  std::vector<QuantizerInfo> quantizers;                   // amax_history[0]: the amax of this step
  // Note "Block summaries" (runtime/cpu/block_summary.h): the block-scaled and micro-scaled
  // copies of this step; empty where they are not shown (tensor-parallel and debug runs).
  std::vector<BlockCopySummary> blocks;
};

double squared_norm(std::span<const float> values);
std::string format_run_header(const ir::Sequence& sequence, const RunOptions& options);
std::string format_step(int step, const StepReport& report);
// One copy's line of a step (`fusec run` prints the GPU's summaries through it too), e.g.
//   "  blocks fc1.input.rowwise  e4m3  1x128  64 blocks  scale_inv 1.95e-03 .. 7.81e-03  zero
//   blocks 0 (0.00%)", NVFP4 ending in "  tensor scale 2.688e+03"; with a newline.
std::string format_block_summary(const BlockCopySummary& copy);

// What the compiler makes of the sequence: the whole pipeline, fusions included (a fused op runs
// as its parts with rounding only where values leave it, like the GPU kernel); with a routing,
// that iteration's plan variant.
ir::Sequence lowered_for_run(const ir::Sequence& sequence, const debug::Routing* routing);

// Input `index` (signature order) of the unsharded sequence: a second stream of the seed per
// input, so that the inputs do not depend on the number of parameters.
Tensor<float> seeded_input(const std::vector<int64_t>& shape, uint64_t seed, size_t index);

}  // namespace opfuse::cpu
