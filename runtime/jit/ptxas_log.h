// Reading NVRTC/ptxas logs and arch names without std::regex.
//
// libstdc++'s <regex> builds its matchers from std::locale facets; in a process that has also
// loaded PyTorch's wheels (which carry their own copies of parts of libstdc++) constructing a
// std::regex crashed (seen with torch 2.11: bench/peers/mlp_interleaved.py). An application that
// embeds opfuse beside libtorch must not depend on that, so these scanners use plain string
// searches and std::from_chars (no locale).
#ifndef OPFUSE_RUNTIME_JIT_PTXAS_LOG_H_
#define OPFUSE_RUNTIME_JIT_PTXAS_LOG_H_

#include <string>
#include <string_view>
#include <vector>

namespace opfuse::jit {

// "sm_" or "compute_", one or more digits, then optionally 'a' or 'f' (sm_90a, sm_100f,
// compute_90); nothing else.
bool is_arch_name(std::string_view arch);

// The largest N of "Used N registers" in a ptxas -v log; -1 when there is none.
int log_largest_registers(std::string_view log);

// The largest N and M of "N bytes spill stores, M bytes spill loads" lines; -1 each when none.
struct LogSpills {
  int store_bytes = -1;
  int load_bytes = -1;
};
LogSpills log_largest_spills(std::string_view log);

// Each "Function properties for NAME" block whose next non-blank line reads
// "N bytes stack frame, S bytes spill stores, L bytes spill loads".
struct LogFunctionSpills {
  std::string function;
  int store_bytes = 0;
  int load_bytes = 0;
};
std::vector<LogFunctionSpills> log_function_spills(std::string_view log);

}  // namespace opfuse::jit

#endif  // OPFUSE_RUNTIME_JIT_PTXAS_LOG_H_
