// The NCCL layer's CPU-side pieces (runtime/comm): the unique id's hex form, the id exchange
// through a shared directory (ranks as threads, the id made by the test: no NCCL or GPU needed),
// its checks of corrupt, foreign and missing files, job names, the launcher's environment, and
// the NCCL loader (its error for a bad OPFUSE_NCCL_LIBRARY; the real library where one is found).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/nccl_library.h"
#include "opfuse/error.h"
#include "test_support.h"

namespace opfuse::comm {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test::contains;

UniqueId patterned_id(int seed) {
  UniqueId id;
  for (size_t i = 0; i < id.bytes.size(); ++i)
    id.bytes[i] = static_cast<char>(static_cast<size_t>(seed) * 31 + i * 7);
  return id;
}

// The message of the UsageError `f` throws; fails the test when it throws nothing.
template <typename F>
std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return {};
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// --- unique id text ------------------------------------------------------------------------------

TEST(CommUniqueIdHex, RoundTripsEveryByte) {
  const UniqueId id = patterned_id(3);  // covers bytes >= 0x80 (negative chars)
  const std::string hex = unique_id_hex(id);
  ASSERT_EQ(hex.size(), 256u);
  EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(unique_id_from_hex(hex), id);
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(unique_id_from_hex(upper), id);
  EXPECT_EQ(unique_id_hex(UniqueId{}), std::string(256, '0'));
}

TEST(CommUniqueIdHex, BadTextSaysWhatIsWrong) {
  const std::string hex = unique_id_hex(patterned_id(1));
  EXPECT_TRUE(contains(usage_error_of([&] { unique_id_from_hex(hex.substr(1)); }),
                       "expected 256 hex digits, got 255 characters"));
  EXPECT_TRUE(contains(usage_error_of([&] { unique_id_from_hex(""); }), "got 0 characters"));
  std::string bad = hex;
  bad[17] = 'g';
  EXPECT_TRUE(contains(usage_error_of([&] { unique_id_from_hex(bad); }),
                       "character 17 ('g') is not a hex digit"));
}

// --- exchange -----------------------------------------------------------------------------------

TEST(CommBootstrap, RanksInThreadsGetRankZerosId) {
  const fs::path dir = test::make_temp_dir("comm");
  std::atomic<int> made{0};
  const auto make = [&] {
    ++made;
    return patterned_id(7);
  };
  UniqueId got1, got2;
  std::string error1, error2;
  // Ranks 1 and 2 start first and must wait for rank 0's file.
  const auto waiter = [&](int rank, UniqueId* got, std::string* error) {
    try {
      *got = exchange_unique_id(dir, "job-1.a_b", rank, 3, 10s, make);
    } catch (const std::exception& e) {
      *error = e.what();
    }
  };
  std::thread rank1(waiter, 1, &got1, &error1);
  std::thread rank2(waiter, 2, &got2, &error2);
  std::this_thread::sleep_for(50ms);
  const UniqueId got0 = exchange_unique_id(dir, "job-1.a_b", 0, 3, 10s, make);
  rank1.join();
  rank2.join();
  EXPECT_EQ(error1, "");
  EXPECT_EQ(error2, "");
  EXPECT_EQ(got0, patterned_id(7));
  EXPECT_EQ(got1, got0);
  EXPECT_EQ(got2, got0);
  EXPECT_EQ(made, 1) << "only rank 0 makes the id";

  const fs::path file = dir / "job-1.a_b.ncclid";
  ASSERT_TRUE(fs::exists(file));
  const std::string text = read_file(file);
  EXPECT_TRUE(contains(text, "\"format\": \"opfuse-nccl-id\"")) << text;
  EXPECT_TRUE(contains(text, "\"version\": 1")) << text;
  EXPECT_TRUE(contains(text, "\"size\": 3")) << text;
  EXPECT_TRUE(contains(text, unique_id_hex(got0))) << text;
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename(), "job-1.a_b.ncclid") << "a temp file was left";
  }

  remove_unique_id_file(dir, "job-1.a_b");
  EXPECT_FALSE(fs::exists(file));
  remove_unique_id_file(dir, "job-1.a_b");  // already gone: nothing to do
}

TEST(CommBootstrap, OneRankWritesNothing) {
  const fs::path dir = test::make_temp_dir("comm");
  EXPECT_EQ(exchange_unique_id(dir, "solo", 0, 1, 1s, [] { return patterned_id(2); }),
            patterned_id(2));
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(CommBootstrap, RankZeroCreatesTheDirectoryAndRefusesAStaleFile) {
  const fs::path dir = fs::path(test::make_temp_dir("comm")) / "sub" / "dir";
  const auto make = [] { return patterned_id(4); };
  exchange_unique_id(dir, "again", 0, 2, 1s, make);
  const std::string message =
      usage_error_of([&] { exchange_unique_id(dir, "again", 0, 2, 1s, make); });
  EXPECT_TRUE(contains(message, (dir / "again.ncclid").string() + " already exists")) << message;
  EXPECT_TRUE(contains(message, "job name of its own (OPFUSE_JOB)")) << message;
}

TEST(CommBootstrap, RankAndSizeAreChecked) {
  const fs::path dir = test::make_temp_dir("comm");
  const auto make = [] { return patterned_id(0); };
  for (const std::pair<int, int>& rank_size :
       {std::pair{0, 0}, std::pair{2, 2}, std::pair{-1, 2}}) {
    const std::string message = usage_error_of(
        [&] { exchange_unique_id(dir, "j", rank_size.first, rank_size.second, 1s, make); });
    EXPECT_TRUE(contains(message, "the size must be >= 1 and the rank in [0, size)")) << message;
  }
}

// Reads `text` as the file of job `job` on rank 1 of 2; returns the error.
std::string error_reading(const std::string& text, const std::string& job = "j") {
  const fs::path dir = test::make_temp_dir("comm");
  write_file(dir / (job + ".ncclid"), text);
  return usage_error_of([&] { exchange_unique_id(dir, job, 1, 2, 1s, [] { return UniqueId{}; }); });
}

// A valid file of job `job` for `size` ranks, as rank 0 writes it.
std::string valid_file(const std::string& job, int size) {
  const fs::path dir = test::make_temp_dir("comm");
  exchange_unique_id(dir, job, 0, size, 1s, [] { return patterned_id(9); });
  return read_file(dir / (job + ".ncclid"));
}

TEST(CommBootstrap, CorruptOrForeignFilesGiveTheirError) {
  const std::string good = valid_file("j", 2);
  {
    const std::string message = error_reading(good.substr(0, good.size() / 2));
    EXPECT_TRUE(contains(message, "bad NCCL id file ")) << message;
    EXPECT_TRUE(contains(message, "j.ncclid (read by rank 1 of 2)")) << message;
    EXPECT_TRUE(contains(message, "is not a JSON object")) << message;
  }
  {
    std::string changed = good;
    const size_t at = changed.find("\"id\": \"") + 7;
    changed[at] = changed[at] == '0' ? '1' : '0';
    const std::string message = error_reading(changed);
    EXPECT_TRUE(contains(message, "its sha256 does not match its contents")) << message;
  }
  {
    const std::string message = error_reading(valid_file("j", 3));
    EXPECT_TRUE(contains(message,
                         "rank 0 wrote it for 3 ranks, but this rank was started with "
                         "size 2: the launcher started the ranks with different sizes"))
        << message;
  }
  {
    const std::string message = error_reading(valid_file("other", 2), "j");
    EXPECT_TRUE(contains(message, "it was written for the job 'other', not 'j'")) << message;
  }
  {
    std::string changed = good;
    changed.replace(changed.find("opfuse-nccl-id"), 14, "something-else");
    const std::string message = error_reading(changed);
    EXPECT_TRUE(contains(message, "its format is \"something-else\", not \"opfuse-nccl-id\""))
        << message;
  }
  {
    std::string changed = good;
    changed.replace(changed.find("\"version\": 1"), 12, "\"version\": 2");
    const std::string message = error_reading(changed);
    EXPECT_TRUE(contains(message, "it has version 2, this opfuse reads version 1")) << message;
  }
  {
    std::string changed = good;
    changed.replace(changed.find("\"size\": 2"), 9, "\"size\": \"2\"");
    const std::string message = error_reading(changed);
    EXPECT_TRUE(contains(message, "the field \"size\" is not an integer")) << message;
  }
}

TEST(CommBootstrap, TimeoutNamesTheFileAndRankZero) {
  const fs::path dir = test::make_temp_dir("comm");
  const auto start = std::chrono::steady_clock::now();
  const std::string message = usage_error_of(
      [&] { exchange_unique_id(dir, "late", 1, 4, 50ms, [] { return UniqueId{}; }); });
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
  EXPECT_TRUE(contains(message, "rank 1 of 4 waited 0.05")) << message;
  EXPECT_TRUE(contains(message, (dir / "late.ncclid").string())) << message;
  EXPECT_TRUE(contains(message, "rank 0 did not start or failed; check its output")) << message;
}

TEST(CommBootstrap, JobNamesMustBePlain) {
  const fs::path dir = test::make_temp_dir("comm");
  const auto make = [] { return UniqueId{}; };
  for (const std::string bad : {"", "a/b", "../x", "a b", "job\n", "tab\t", "ü"}) {
    const std::string message =
        usage_error_of([&] { exchange_unique_id(dir, bad, 0, 2, 1s, make); });
    EXPECT_TRUE(contains(message, "bad job name")) << bad << ": " << message;
    EXPECT_TRUE(contains(usage_error_of([&] { remove_unique_id_file(dir, bad); }), "bad job name"));
  }
  EXPECT_TRUE(contains(usage_error_of([&] { check_job_name(std::string(101, 'a')); }),
                       "1 to 100 characters, got 101"));
  check_job_name(std::string(100, 'a'));
  check_job_name("Az09._-");
  EXPECT_TRUE(fs::is_empty(dir));
}

// --- launcher environment
// -------------------------------------------------------------------------

// Sets or unsets environment variables for one scope, restoring them afterwards.
class ScopedEnvironment {
 public:
  ScopedEnvironment() {
    for (const char* name : {"OPFUSE_RANK", "OPFUSE_WORLD_SIZE", "OPFUSE_LOCAL_DEVICE",
                             "OPFUSE_BOOTSTRAP_DIR", "OPFUSE_JOB"}) {
      set(name, nullptr);
    }
  }
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old != nullptr, old != nullptr ? old : ""});
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->was_set) {
        setenv(it->name.c_str(), it->value.c_str(), 1);
      } else {
        unsetenv(it->name.c_str());
      }
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  struct Saved {
    std::string name;
    bool was_set;
    std::string value;
  };
  std::vector<Saved> saved_;
};

TEST(CommLaunchEnv, UnsetWorldSizeIsNoLaunch) {
  ScopedEnvironment env;
  env.set("OPFUSE_RANK", "1");  // ignored without OPFUSE_WORLD_SIZE
  EXPECT_FALSE(launch_env_from_environment().has_value());
}

TEST(CommLaunchEnv, ReadsEveryVariable) {
  ScopedEnvironment env;
  env.set("OPFUSE_WORLD_SIZE", "4");
  env.set("OPFUSE_RANK", "3");
  env.set("OPFUSE_BOOTSTRAP_DIR", "/tmp/x");
  env.set("OPFUSE_JOB", "run-17");
  std::optional<LaunchEnv> launch = launch_env_from_environment();
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->size, 4);
  EXPECT_EQ(launch->rank, 3);
  EXPECT_EQ(launch->local_device, 3) << "the device defaults to the rank";
  EXPECT_EQ(launch->dir, fs::path("/tmp/x"));
  EXPECT_EQ(launch->job, "run-17");
  env.set("OPFUSE_LOCAL_DEVICE", "0");
  launch = launch_env_from_environment();
  ASSERT_TRUE(launch.has_value());
  EXPECT_EQ(launch->local_device, 0);
}

TEST(CommLaunchEnv, MalformedValuesNameTheVariable) {
  struct Case {
    const char* name;
    const char* value;
    const char* expected;
  };
  const Case cases[] = {
      {"OPFUSE_WORLD_SIZE", "2x", "OPFUSE_WORLD_SIZE='2x' is not a whole number in [1, "},
      {"OPFUSE_WORLD_SIZE", "", "OPFUSE_WORLD_SIZE='' is not a whole number"},
      {"OPFUSE_WORLD_SIZE", "0", "OPFUSE_WORLD_SIZE='0' is not a whole number in [1, "},
      {"OPFUSE_WORLD_SIZE", " 2", "OPFUSE_WORLD_SIZE=' 2' is not a whole number"},
      {"OPFUSE_RANK", "2", "OPFUSE_RANK='2' is not a whole number in [0, 1]"},
      {"OPFUSE_RANK", "-1", "OPFUSE_RANK='-1' is not a whole number in [0, 1]"},
      {"OPFUSE_RANK", nullptr, "OPFUSE_RANK is not set, but OPFUSE_WORLD_SIZE is"},
      {"OPFUSE_LOCAL_DEVICE", "gpu1", "OPFUSE_LOCAL_DEVICE='gpu1' is not a whole number"},
      {"OPFUSE_BOOTSTRAP_DIR", nullptr, "OPFUSE_BOOTSTRAP_DIR is not set, but OPFUSE_WORLD_SIZE"},
      {"OPFUSE_BOOTSTRAP_DIR", "", "OPFUSE_BOOTSTRAP_DIR is empty"},
      {"OPFUSE_JOB", nullptr, "OPFUSE_JOB is not set"},
      {"OPFUSE_JOB", "a/b", "OPFUSE_JOB: bad job name 'a/b'"},
  };
  for (const Case& c : cases) {
    ScopedEnvironment env;
    env.set("OPFUSE_WORLD_SIZE", "2");
    env.set("OPFUSE_RANK", "1");
    env.set("OPFUSE_BOOTSTRAP_DIR", "/tmp/x");
    env.set("OPFUSE_JOB", "j");
    env.set(c.name, c.value);
    const std::string message = usage_error_of([] { launch_env_from_environment(); });
    EXPECT_TRUE(contains(message, c.expected)) << c.name << ": " << message;
  }
}

// --- the NCCL loader
// ------------------------------------------------------------------------------

TEST(CommNcclLibrary, VersionText) {
  EXPECT_EQ(nccl_version_text(22803), "2.28.3");
  EXPECT_EQ(nccl_version_text(21900), "2.19.0");
  EXPECT_EQ(nccl_version_text(2804), "2.8.4");
}

TEST(CommNcclLibrary, ABadExplicitPathIsAnErrorNamingIt) {
  NcclSearchInputs inputs;
  inputs.library_env = "/nonexistent/libnccl.so.2";
  const std::string message = usage_error_of([&] { load_nccl_library(inputs); });
  EXPECT_TRUE(contains(message, "cannot load OPFUSE_NCCL_LIBRARY=/nonexistent/libnccl.so.2"))
      << message;
  EXPECT_TRUE(contains(message, "unset it")) << message;
}

// nccl_library() caches its result for the process: a child process sets the variable.
[[noreturn]] void bad_library_env_child() {
  setenv("OPFUSE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  try {
    nccl_library();
    std::fprintf(stderr, "child: loaded\n");
    std::_Exit(1);
  } catch (const UsageError& e) {
    const std::string message = e.what();
    if (!contains(message, "OPFUSE_NCCL_LIBRARY=/nonexistent/libnccl.so.2")) {
      std::fprintf(stderr, "child: wrong message: %s\n", message.c_str());
      std::_Exit(1);
    }
  }
  try {  // a failed load is retried, and fails the same way
    nccl_library();
    std::_Exit(1);
  } catch (const UsageError&) {
  }
  // The same with a Communicator: its rank checks come before NCCL is needed.
  try {
    Communicator comm(UniqueId{}, 2, 2);
    std::_Exit(1);
  } catch (const UsageError& e) {
    if (!contains(e.what(), "bad communicator rank 2 of size 2")) std::_Exit(1);
  }
  std::fprintf(stderr, "child: ok\n");
  std::_Exit(0);
}

TEST(CommNcclLibrary, ABadEnvironmentPathFailsTheProcessLoad) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(bad_library_env_child(), ::testing::ExitedWithCode(0), "child: ok");
}

TEST(CommNcclLibrary, LoadsTheInstalledLibrary) {
  if (std::getenv("OPFUSE_NCCL_LIBRARY") == nullptr) {
    // Only where the search can find one (the loader's path or the CUDA toolkit's lib64).
    std::string message;
    try {
      nccl_library();
    } catch (const UsageError& e) {
      message = e.what();
    }
    if (!message.empty()) GTEST_SKIP() << "no NCCL on this machine: " << message;
  }
  const NcclLibrary& nccl = nccl_library();
  std::printf("NCCL %s from %s\n", nccl_version_text(nccl.version).c_str(), nccl.path.c_str());
  EXPECT_GE(nccl.version, kMinNcclVersion) << nccl_version_text(nccl.version);
  EXPECT_FALSE(nccl.path.empty());
  EXPECT_EQ(&nccl, &nccl_library()) << "loaded once";
  int version = 0;
  ASSERT_EQ(nccl.get_version(&version), ncclSuccess);
  EXPECT_EQ(version, nccl.version);
  const char* text = nccl.get_error_string(ncclSystemError);
  ASSERT_NE(text, nullptr);
  EXPECT_NE(std::string(text), "");
}

}  // namespace
}  // namespace opfuse::comm
