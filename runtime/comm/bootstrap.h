// Hands every rank of a multi-GPU run the same NCCL UniqueId through a file in a directory the
// ranks share (one process per GPU, started by a launcher). Rank 0 makes the id and writes
// <dir>/<job>.ncclid; the other ranks wait for the file, read it and check it:
//
//   const LaunchEnv env = *launch_env_from_environment();
//   cudaSetDevice(env.local_device);
//   const UniqueId id = exchange_unique_id(env.dir, env.job, env.rank, env.size, 60s);
//   Communicator comm(id, env.rank, env.size);  // blocks until every rank has joined
//   if (env.rank == 0) remove_unique_id_file(env.dir, env.job);
//
// Stale files. A file left by an earlier launch (one that crashed before removing it) would hand
// waiting ranks an id nobody listens on: their init would hang. The launcher avoids that by
// passing a job name unique per launch (e.g. a timestamp and the launcher's pid); rank 0 refuses
// to start when the file already exists, so a reused name fails loudly on rank 0.
//
// The file is JSON: {"format": "opfuse-nccl-id", "version": 1, "job", "size", "id" (hex),
// "sha256"}, the checksum covering the other fields (their JSON text with sorted keys, compact).
// It is written to a temporary file in the same directory and renamed, so a reader never sees a
// partial file.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "comm/communicator.h"

namespace opfuse::comm {

// Rank 0 makes a new id (new_unique_id()) and writes <dir>/<job>.ncclid (creating `dir` when
// missing); the other ranks poll for it every 10 ms up to `timeout`, then read and check it.
// Returns the id. With size 1 rank 0 returns a new id and writes nothing. Throws UsageError for
// a bad job name, rank or size; a file rank 0 cannot write or finds already there; a file that
// is not a valid id file or was written for another job or size (the launcher started the ranks
// with different sizes); a timeout (naming the file, the rank, the seconds waited: rank 0 did not
// start or failed).
UniqueId exchange_unique_id(const std::filesystem::path& dir, std::string_view job, int rank,
                            int size, std::chrono::milliseconds timeout);

// The same with the id made by `make_id` on rank 0 (tests: no NCCL needed).
UniqueId exchange_unique_id(const std::filesystem::path& dir, std::string_view job, int rank,
                            int size, std::chrono::milliseconds timeout,
                            const std::function<UniqueId()>& make_id);

// Removes <dir>/<job>.ncclid; nothing when it does not exist. Rank 0 calls it once every rank has
// initialised, i.e. after its Communicator is built (ncclCommInitRank returns only when all ranks
// have joined, so every rank has read the file by then). Throws UsageError for a bad job name or
// a file that cannot be removed.
void remove_unique_id_file(const std::filesystem::path& dir, std::string_view job);

// <dir>/<job>.ncclid.
std::filesystem::path unique_id_file(const std::filesystem::path& dir, std::string_view job);

// Throws UsageError unless `job` is a plain name: 1 to 100 of [A-Za-z0-9._-].
void check_job_name(std::string_view job);

// What a launcher tells each rank through the environment.
struct LaunchEnv {
  int rank = 0;               // OPFUSE_RANK, in [0, size)
  int size = 1;               // OPFUSE_WORLD_SIZE, >= 1
  int local_device = 0;       // OPFUSE_LOCAL_DEVICE (the CUDA device), default: the rank
  std::filesystem::path dir;  // OPFUSE_BOOTSTRAP_DIR
  std::string job;            // OPFUSE_JOB, a plain name unique per launch
};

// nullopt when OPFUSE_WORLD_SIZE is unset (not a multi-process launch). Otherwise OPFUSE_RANK,
// OPFUSE_BOOTSTRAP_DIR and OPFUSE_JOB must be set too; a missing, empty or malformed value (not
// a decimal integer, out of range, a bad job name) throws UsageError naming the variable.
std::optional<LaunchEnv> launch_env_from_environment();

}  // namespace opfuse::comm
