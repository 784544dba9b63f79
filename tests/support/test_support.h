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

// The seed MLP at a small size under delayed scaling (amax history 16), as `mlp.fuse`-named
// tests compile it: the program the bench, misuse and other small GPU tests run.
inline constexpr const char* kSmallFp8Mlp = R"(recipe fp8 = delayed_scaling(amax_history = 16)
sequence mlp(x: bf16[tokens, 256]) -> (y: bf16[tokens, 256]) uses fp8 {
  layernorm(256)
  linear(256, 1024, bias = false) as fc1
  swiglu()
  linear(512, 256, bias = false) as fc2
}
)";

// fusec train's test model (tests/unit/test_fusec_train.cpp, tests/gpu/test_train_gpu.cpp): two
// blocks of the seed MLP at hidden 32 (tests/unit/test_convergence.cpp's size).
inline constexpr const char* kTrainStack = R"(recipe fp8 = delayed_scaling(amax_history = 16)
recipe cur = current_scaling()
sequence stack(x: bf16[tokens, 32]) -> (y: bf16[tokens, 32]) {
  layernorm(32) as ln0
  linear(32, 128, bias = false) as fc1_0
  swiglu()
  linear(64, 32, bias = false) as fc2_0
  layernorm(32) as ln1
  linear(32, 128, bias = false) as fc1_1
  swiglu()
  linear(64, 32, bias = false) as fc2_1
}
)";

}  // namespace opfuse::test
