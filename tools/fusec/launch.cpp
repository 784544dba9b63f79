#include "launch.h"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common.h"
#include "opfuse/error.h"

extern char** environ;

namespace opfuse::fusec {

namespace {

std::vector<std::string>& process_args() {
  static std::vector<std::string> args;
  return args;
}

}  // namespace

void set_process_args(int argc, char** argv) { process_args().assign(argv, argv + argc); }

bool is_launched_rank() { return std::getenv("OPFUSE_WORLD_SIZE") != nullptr; }

ParallelOptions launched_rank() {
  ParallelOptions parallel = ParallelOptions::from_environment();
  if (const char* device = std::getenv("OPFUSE_LOCAL_DEVICE");
      device != nullptr && parallel.size > 1) {
    if (const cudaError_t rc = cudaSetDevice(std::atoi(device)); rc != cudaSuccess) {
      throw UsageError(fmt::format("rank {} of {}: cudaSetDevice({}): {}", parallel.rank,
                                   parallel.size, device, cudaGetErrorString(rc)));
    }
  }
  return parallel;
}

int launch_ranks(int nproc) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices < nproc) {
    std::fprintf(stderr,
                 "fusec: error: --nproc %d starts one process per GPU, but this machine has %d "
                 "GPU%s\n",
                 nproc, devices, devices == 1 ? "" : "s");
    return kExitUserError;
  }
  char pattern[] = "/tmp/opfuse-ranks.XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    std::perror("fusec: error: a directory for the ranks");
    return kExitUserError;
  }
  const std::filesystem::path dir = pattern;
  const std::string job =
      "run-" + std::to_string(getpid()) + "-" + std::to_string(std::time(nullptr));
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) base_env.emplace_back(*e);
  if (std::getenv("NCCL_NVLS_ENABLE") == nullptr) base_env.emplace_back("NCCL_NVLS_ENABLE=0");
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nproc; ++rank) {
    std::vector<std::string> env = base_env;
    env.push_back("OPFUSE_RANK=" + std::to_string(rank));
    env.push_back("OPFUSE_WORLD_SIZE=" + std::to_string(nproc));
    env.push_back("OPFUSE_LOCAL_DEVICE=" + std::to_string(rank));
    env.push_back("OPFUSE_BOOTSTRAP_DIR=" + dir.string());
    env.push_back("OPFUSE_JOB=" + job);
    std::vector<char*> envp, argv;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    for (std::string& a : process_args()) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = (dir / ("rank" + std::to_string(rank) + ".log")).string();
    if (rank > 0) {
      posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
    }
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      std::fprintf(stderr, "fusec: error: starting rank %d: %s\n", rank, std::strerror(rc));
      for (pid_t p : pids) kill(p, SIGTERM);
      return kExitUserError;
    }
    pids.push_back(pid);
  }
  int result = 0;
  int failed_rank = -1;
  for (std::size_t left = pids.size(); left > 0; --left) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, 0);
    if (done < 0) break;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && result == 0) {
      result = code;
      for (std::size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] == done)
          failed_rank = int(r);
        else
          kill(pids[r], SIGTERM);
      }
    }
  }
  if (failed_rank > 0) {
    std::ifstream in(dir / ("rank" + std::to_string(failed_rank) + ".log"));
    std::stringstream text;
    text << in.rdbuf();
    std::fprintf(stderr, "fusec: rank %d of %d failed (exit %d); its output:\n%s", failed_rank,
                 nproc, result, text.str().c_str());
  } else if (failed_rank == 0) {
    std::fprintf(stderr, "fusec: rank 0 of %d failed (exit %d)\n", nproc, result);
  }
  if (result == 0) std::filesystem::remove_all(dir);
  return result;
}

}  // namespace opfuse::fusec
