// `fusec run --device gpu`: the CPU reference driver's training loop (reference/run_driver.h)
// on the GPU through the embedding API, with the same seeded parameters and inputs, the same
// loss and the same report, so the two devices' reports can be compared line by line; plus the
// device's peak memory. The loss, dL/dy and the SGD update are computed on the host (this is a
// checking tool, not a trainer); forward, backward and step run on the GPU with no host sync.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "opfuse/program.h"

namespace opfuse::api {

struct GpuRunOptions {
  std::string sequence;  // empty: the program's only one
  std::map<std::string, std::int64_t> bindings;
  int steps = 1;
  std::uint64_t seed = 0;
  double lr = 0.01;
  // For a program compiled with a debug config: where and how its session logs.
  DebugSessionOptions debug;
  // A rank of `fusec run --nproc N` (docs/parallel.md); its GPU is already the current device.
  ParallelOptions parallel;
};

// Throws opfuse::Error (UsageError for misuse such as unbound sizes or steps < 1).
std::string run_gpu_training(const Program& program, const GpuRunOptions& options);

}  // namespace opfuse::api
