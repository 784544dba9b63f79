// `--nproc N` (fusec run): one process per GPU for a tensor-parallel sequence (docs/parallel.md).
#pragma once

#include <string>
#include <vector>

#include "opfuse/program.h"

namespace opfuse::fusec {

// fusec's own command line, kept by main() for the launcher to start its ranks with.
void set_process_args(int argc, char** argv);

// True in a process the launcher started (OPFUSE_WORLD_SIZE is set): it runs as one rank.
bool is_launched_rank();

// Starts `nproc` copies of this fusec command on GPUs 0..nproc-1, each with OPFUSE_RANK,
// OPFUSE_WORLD_SIZE, OPFUSE_LOCAL_DEVICE, OPFUSE_BOOTSTRAP_DIR (a fresh directory) and OPFUSE_JOB
// (unique to this launch) set, and NCCL_NVLS_ENABLE=0 unless set. Rank 0 writes to this
// process's stdout and stderr; rank r > 0 to rank<r>.log in the directory, printed if it fails.
// When a rank fails the others are stopped (a survivor would wait in NCCL forever). Returns the
// first failing rank's exit code, else 0; an error message and 1 when fewer GPUs than nproc.
int launch_ranks(int nproc);

// This process's place in the group: ParallelOptions::from_environment(), after making the
// rank's GPU (OPFUSE_LOCAL_DEVICE) the current device in a launched rank. A one-rank
// ParallelOptions outside a launch. Throws opfuse::Error for malformed variables or a device that
// cannot be selected.
ParallelOptions launched_rank();

}  // namespace opfuse::fusec
