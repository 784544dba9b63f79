#include "comm/bootstrap.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <thread>

#include "jit/sha256.h"
#include "opfuse/error.h"
#include "support/atomic_file.h"

namespace opfuse::comm {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kFormat = "opfuse-nccl-id";
constexpr int kVersion = 1;
constexpr auto kPollInterval = std::chrono::milliseconds(10);

void check_rank_and_size(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw UsageError(fmt::format(
        "bad rank {} of size {} for the NCCL id exchange: the size must be >= 1 and the rank in "
        "[0, size); check the launcher's OPFUSE_RANK and OPFUSE_WORLD_SIZE",
        rank, size));
  }
}

// The checksum of the fields other than "sha256": their compact JSON text. nlohmann::json keeps
// object keys sorted, so the text is canonical whatever order the writer used.
std::string checksum_of(json fields) {
  fields.erase("sha256");
  return jit::sha256_hex(fields.dump());
}

std::string file_text(std::string_view job, int size, const UniqueId& id) {
  json file = {{"format", kFormat},
               {"version", kVersion},
               {"job", std::string(job)},
               {"size", size},
               {"id", unique_id_hex(id)}};
  file["sha256"] = checksum_of(file);
  return file.dump(2) + "\n";
}

// Rank 0's side: a new file, never one left by an earlier launch (bootstrap.h, "Stale files").
UniqueId write_id_file(const fs::path& dir, std::string_view job, int size,
                       const std::function<UniqueId()>& make_id) {
  const fs::path path = unique_id_file(dir, job);
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    throw UsageError(
        fmt::format("rank 0 cannot create the bootstrap directory {} for the NCCL id: {}; set "
                    "OPFUSE_BOOTSTRAP_DIR to a directory every rank can reach and rank 0 can write",
                    dir.string(), error.message()));
  }
  if (fs::exists(path, error)) {
    throw UsageError(fmt::format(
        "{} already exists: it is left by an earlier launch with the job name '{}', or another "
        "launch with that name is running. Give each launch a job name of its own (OPFUSE_JOB), "
        "or remove the file if no launch is using it",
        path.string(), job));
  }
  const UniqueId id = make_id();
  if (const std::string why = write_file_atomically(path.string(), file_text(job, size, id));
      !why.empty()) {
    throw UsageError(
        fmt::format("rank 0 cannot write the NCCL id file {}: {}; check that {} is "
                    "writable and not full",
                    path.string(), why, dir.string()));
  }
  return id;
}

// Another rank's side: the file rank 0 wrote, checked field by field.
UniqueId read_id_file(const fs::path& path, std::string_view job, int rank, int size) {
  const auto bad = [&](const std::string& what) {
    return UsageError(fmt::format("bad NCCL id file {} (read by rank {} of {}): {}", path.string(),
                                  rank, size, what));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) throw bad("it exists but cannot be opened; check its permissions");
  std::stringstream text;
  text << in.rdbuf();

  json file = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (file.is_discarded() || !file.is_object()) {
    throw bad(
        "it is not a JSON object (truncated or not written by opfuse); rank 0 writes it "
        "whole, so another program wrote or changed it");
  }
  const auto field = [&](const char* name, bool integer) -> const json& {
    const auto it = file.find(name);
    if (it == file.end()) throw bad(fmt::format("the field \"{}\" is missing", name));
    if (integer ? !it->is_number_integer() : !it->is_string()) {
      throw bad(
          fmt::format("the field \"{}\" is not {}", name, integer ? "an integer" : "a string"));
    }
    return *it;
  };
  if (const auto format = field("format", false).get<std::string>(); format != kFormat) {
    throw bad(fmt::format("its format is \"{}\", not \"{}\"", format, kFormat));
  }
  if (const auto& version = field("version", true); version != kVersion) {
    throw bad(
        fmt::format("it has version {}, this opfuse reads version {}: the ranks run "
                    "different opfuse builds",
                    version.get<long long>(), kVersion));
  }
  const std::string checksum = field("sha256", false).get<std::string>();
  const std::string file_job = field("job", false).get<std::string>();
  const json& file_size = field("size", true);
  const json& file_id = field("id", false);
  if (checksum != checksum_of(file)) {
    throw bad(
        "its sha256 does not match its contents: the file was changed after rank 0 wrote "
        "it");
  }
  if (file_job != job) {
    throw bad(fmt::format("it was written for the job '{}', not '{}'", file_job, job));
  }
  if (file_size != size) {
    throw bad(fmt::format(
        "rank 0 wrote it for {} ranks, but this rank was started with size {}: the launcher "
        "started the ranks with different sizes (OPFUSE_WORLD_SIZE)",
        file_size.get<long long>(), size));
  }
  try {
    return unique_id_from_hex(file_id.get<std::string>());
  } catch (const UsageError& error) {
    throw bad(fmt::format("its \"id\" is bad: {}", error.what()));
  }
}

std::string environment_value(const char* name, bool* set) {
  const char* value = std::getenv(name);
  *set = value != nullptr;
  return value == nullptr ? std::string() : std::string(value);
}

// A decimal integer in [min, max] from the variable `name`; `fallback` when unset (nullopt: the
// variable is required).
int environment_int(const char* name, int min, int max, std::optional<int> fallback) {
  bool set = false;
  const std::string text = environment_value(name, &set);
  if (!set) {
    if (fallback) return *fallback;
    throw UsageError(fmt::format(
        "{} is not set, but OPFUSE_WORLD_SIZE is: a multi-GPU launcher sets OPFUSE_RANK, "
        "OPFUSE_WORLD_SIZE, OPFUSE_BOOTSTRAP_DIR and OPFUSE_JOB for every rank",
        name));
  }
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) {
    throw UsageError(
        fmt::format("{}='{}' is not a whole number in [{}, {}]", name, text, min, max));
  }
  return value;
}

std::string environment_text(const char* name) {
  bool set = false;
  std::string text = environment_value(name, &set);
  if (!set || text.empty()) {
    throw UsageError(fmt::format(
        "{} is {}, but OPFUSE_WORLD_SIZE is set: a multi-GPU launcher sets OPFUSE_RANK, "
        "OPFUSE_WORLD_SIZE, OPFUSE_BOOTSTRAP_DIR and OPFUSE_JOB for every rank",
        name, set ? "empty" : "not set"));
  }
  return text;
}

}  // namespace

void check_job_name(std::string_view job) {
  constexpr size_t kMaxLength = 100;
  const auto plain = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  };
  if (job.empty() || job.size() > kMaxLength) {
    throw UsageError(fmt::format(
        "bad job name '{}' for the NCCL id exchange: it must be 1 to {} characters, got {}", job,
        kMaxLength, job.size()));
  }
  for (const char c : job) {
    if (!plain(c)) {
      throw UsageError(fmt::format(
          "bad job name '{}' for the NCCL id exchange: '{}' is not one of A-Z a-z 0-9 . _ -; the "
          "name becomes a file name, so it must be a plain one",
          job, c));
    }
  }
}

fs::path unique_id_file(const fs::path& dir, std::string_view job) {
  return dir / (std::string(job) + ".ncclid");
}

UniqueId exchange_unique_id(const fs::path& dir, std::string_view job, int rank, int size,
                            std::chrono::milliseconds timeout) {
  return exchange_unique_id(dir, job, rank, size, timeout, new_unique_id);
}

UniqueId exchange_unique_id(const fs::path& dir, std::string_view job, int rank, int size,
                            std::chrono::milliseconds timeout,
                            const std::function<UniqueId()>& make_id) {
  check_job_name(job);
  check_rank_and_size(rank, size);
  if (size == 1) return make_id();  // nobody to tell
  if (rank == 0) return write_id_file(dir, job, size, make_id);

  const fs::path path = unique_id_file(dir, job);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::error_code error;
    // The rename makes the whole file appear at once: existing means complete.
    if (fs::exists(path, error)) return read_id_file(path, job, rank, size);
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= timeout) {
      throw UsageError(fmt::format(
          "rank {} of {} waited {:.3g} s for the NCCL id file {}, which rank 0 writes: rank 0 did "
          "not start or failed; check its output (and that every rank has the same "
          "OPFUSE_BOOTSTRAP_DIR on a file system they share, and the same OPFUSE_JOB)",
          rank, size, std::chrono::duration<double>(waited).count(), path.string()));
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(kPollInterval, timeout - waited));
  }
}

void remove_unique_id_file(const fs::path& dir, std::string_view job) {
  check_job_name(job);
  const fs::path path = unique_id_file(dir, job);
  std::error_code error;
  fs::remove(path, error);
  if (error) {
    throw UsageError(
        fmt::format("cannot remove the NCCL id file {}: {}; remove it by hand (a later "
                    "launch with the same job name would refuse to start)",
                    path.string(), error.message()));
  }
}

std::optional<LaunchEnv> launch_env_from_environment() {
  bool set = false;
  environment_value("OPFUSE_WORLD_SIZE", &set);
  if (!set) return std::nullopt;
  LaunchEnv env;
  env.size = environment_int("OPFUSE_WORLD_SIZE", 1, 1 << 20, std::nullopt);
  env.rank = environment_int("OPFUSE_RANK", 0, env.size - 1, std::nullopt);
  env.local_device = environment_int("OPFUSE_LOCAL_DEVICE", 0, 1 << 16, env.rank);
  env.dir = environment_text("OPFUSE_BOOTSTRAP_DIR");
  env.job = environment_text("OPFUSE_JOB");
  try {
    check_job_name(env.job);
  } catch (const UsageError& error) {
    throw UsageError(fmt::format("OPFUSE_JOB: {}", error.what()));
  }
  return env;
}

}  // namespace opfuse::comm
