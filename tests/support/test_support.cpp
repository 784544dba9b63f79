#include "test_support.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace opfuse::test {

namespace fs = std::filesystem;

std::string source_path(const std::string& relative) {
  return std::string(OPFUSE_SOURCE_DIR) + "/" + relative;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return {};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {
struct TempDirs {
  std::vector<fs::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) {
      // Make read-only test directories removable again.
      fs::permissions(d, fs::perms::owner_all, fs::perm_options::add, ec);
      for (auto it = fs::recursive_directory_iterator(d, ec);
           it != fs::recursive_directory_iterator(); it.increment(ec)) {
        fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
      }
      fs::remove_all(d, ec);
    }
  }
};
TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}
}  // namespace

std::string make_temp_dir(const std::string& tag) {
  std::string pattern = (fs::temp_directory_path() / ("opfuse-" + tag + "-XXXXXX")).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed for " << pattern;
    return {};
  }
  temp_dirs().dirs.emplace_back(buf.data());
  return buf.data();
}

CommandResult run_command(const std::string& command_line) {
  CommandResult result;
  const std::string full = command_line + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string fusec_path() { return OPFUSE_FUSEC_PATH; }

CommandResult fusec(const std::string& args) { return run_command(fusec_path() + " " + args); }

std::string shell_quoted(const std::string& s) { return "'" + s + "'"; }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

}  // namespace opfuse::test
