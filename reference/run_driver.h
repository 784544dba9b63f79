// `fusec run --device cpu`: trains one sequence for a few steps on the CPU reference from seeded
// random inputs and parameters, and reports per step the loss, every parameter gradient's norm
// and every quantizer's amax and scale. Same seed, same text, byte for byte. A tensor-parallel
// sequence runs as its tp ranks simulated in one process (`--nproc N`, run_ranks.h), started from
// their shards of the unsharded program's parameters and inputs and reported over the whole
// tensors, so its numbers are the unsharded program's up to the order of sums.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "cpu_tensor.h"
#include "debug/stat_log.h"
#include "debug_config/routing.h"
#include "ir/graph.h"
#include "reference_executor.h"

namespace opfuse::cpu {

// A precision-debug config applied to the run (docs/debugging.md): its layers bound to sections;
// each step runs the plan variant of that iteration's routing and logs its statistics to `log`.
struct DebugRunOptions {
  std::vector<debug::LayerBinding> bindings;
  debug::StatLog* log = nullptr;
  const SourceManager* sources = nullptr;  // names the config file in the debug log
  // Where DumpTensors writes ({log_dir}/tensor_dumps/rank_{rank}/...); needed by a config with
  // DumpTensors, and checked to be writable before the first step.
  std::filesystem::path log_dir;
  int rank = 0;
  int64_t start_iteration = 0;
};

struct RunOptions {
  Bindings bindings;
  int steps = 1;
  uint64_t seed = 0;
  double lr = 0.01;
  std::optional<DebugRunOptions> debug;
};

// The loss the driver trains on, for --help: 0.5 * mean(y^2) over the main output y.
inline constexpr const char* kRunLossDescription =
    "loss = 0.5 * mean(y^2) over the main output y (so dL/dy = y / numel(y)); extra outputs get "
    "a zero gradient";

// Parameters from the seed: linear weights ~ N(0, 0.02), norm weights 1 (0 when
// zero_centered_gamma), biases 0; then params_changed(). The executor of rank `rank` of a
// tensor-parallel sequence gets its shard of each (plan::ParamInitializer::fill_shard).
void init_params_from_seed(ReferenceExecutor<float>& executor, uint64_t seed, int rank = 0);
// Tensors of N(0, stddev) values from a seeded generator (platform-independent: Box-Muller on
// std::mt19937_64 bits, not std::normal_distribution).
Tensor<float> seeded_normal(const std::vector<int64_t>& shape, uint64_t seed, double stddev);

// Runs the training loop on the sequence as the pipeline compiles it (fused), a tensor-parallel
// one on its tp simulated ranks; throws ReferenceError for user errors (unbound symbols, bad
// --steps, a debug config for a tensor-parallel sequence).
std::string run_reference_training(const ir::Sequence& sequence, const RunOptions& options);

}  // namespace opfuse::cpu
