// Helpers shared by the test programs.
#pragma once

#include <string>

namespace opfuse::test {

// Absolute path of a file in the source tree, e.g. source_path("dsl_examples/mlp.fuse").
std::string source_path(const std::string& relative);
// Whole file as a string; fails the current test (and returns "") when unreadable.
std::string read_text(const std::string& path);
// A fresh, empty temporary directory removed at process exit.
std::string make_temp_dir(const std::string& tag);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs a shell command line and captures its output.
CommandResult run_command(const std::string& command_line);
// Path of the built fusec.
std::string fusec_path();
// Runs `fusec ARGS` (ARGS already quoted for the shell).
CommandResult fusec(const std::string& args);
// `s` in single quotes, for a shell command line (test paths hold no single quote).
std::string shell_quoted(const std::string& s);
bool contains(const std::string& haystack, const std::string& needle);
// How often `needle` occurs in `haystack`, overlapping occurrences included.
size_t count(const std::string& haystack, const std::string& needle);

}  // namespace opfuse::test
