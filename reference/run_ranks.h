// `fusec run --device cpu --nproc N` (docs/parallel.md, "Running it"): a tensor-parallel
// sequence's N ranks simulated in one process (reference/collectives.h, one thread per rank).
// Every rank starts from its shard of the parameters the unsharded program (tp = 1) draws from
// the same seed and its share of the unsharded inputs; the report is one rank-0 report of the
// whole tensors (the joined output and parameter gradients, the amaxes reduced over the ranks),
// so it equals the unsharded run's up to the order of sums.
#pragma once

#include <string>

#include "ir/graph.h"
#include "run_driver.h"

namespace opfuse::cpu {

// Trains `sequence` (tensor-parallel: sequence.parallel.active()) like run_reference_training;
// throws ReferenceError for user errors (unbound or non-dividing sizes, a debug config).
std::string run_reference_ranks(const ir::Sequence& sequence, const RunOptions& options);

}  // namespace opfuse::cpu
