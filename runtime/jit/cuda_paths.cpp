#include "jit/cuda_paths.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "jit/nvrtc_compiler.h"

namespace opfuse::jit {

namespace {

namespace fs = std::filesystem;

std::string environment_value(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

bool is_directory(const std::string& path) {
  std::error_code error;
  return !path.empty() && fs::is_directory(path, error);
}

// Why a candidate CUDA root was rejected, or "" when it holds the headers NVRTC needs.
std::string reject_reason(const std::string& root) {
  if (!is_directory(root)) return "no such directory";
  std::error_code error;
  if (!fs::is_regular_file(fs::path(root) / "include" / "cuda_runtime.h", error)) {
    return "no include/cuda_runtime.h";
  }
  return {};
}

JitPaths paths_for_cuda_root(const std::string& root) {
  JitPaths paths;
  paths.cuda_root = root;
  paths.cuda_include_dir = (fs::path(root) / "include").string();
  const std::string cccl = (fs::path(root) / "include" / "cccl").string();
  if (is_directory(cccl)) paths.cccl_include_dir = cccl;
  return paths;
}

JitPaths find_cuda(const JitPathInputs& inputs) {
  struct Candidate {
    std::string label;
    std::string root;
  };
  const std::vector<Candidate> candidates = {
      {"CUDA_HOME", inputs.cuda_home},
      {"CUDA_PATH", inputs.cuda_path},
      {"default", inputs.default_cuda_root},
  };
  std::string tried;
  for (const Candidate& candidate : candidates) {
    if (!tried.empty()) tried += "; ";
    if (candidate.root.empty()) {
      tried += candidate.label + " (not set)";
      continue;
    }
    const std::string why = reject_reason(candidate.root);
    if (why.empty()) return paths_for_cuda_root(candidate.root);
    tried += fmt::format("{} {} ({})", candidate.label, candidate.root, why);
  }
  throw JitError(fmt::format(
      "cannot find the CUDA toolkit headers that NVRTC needs; tried {}. Set CUDA_HOME to the "
      "toolkit's root directory (the one holding include/cuda_runtime.h)",
      tried));
}

std::string find_templates(const JitPathInputs& inputs) {
  if (!inputs.templates_env.empty()) {
    if (!is_directory(inputs.templates_env)) {
      throw JitError(fmt::format(
          "OPFUSE_TEMPLATES_DIR={} is not a directory; point it at opfuse's templates/ directory "
          "or unset it",
          inputs.templates_env));
    }
    return inputs.templates_env;
  }
  if (is_directory(inputs.source_templates_dir)) return inputs.source_templates_dir;
  if (is_directory(inputs.install_templates_dir)) return inputs.install_templates_dir;
  return {};
}

}  // namespace

JitPathInputs JitPathInputs::from_environment() {
  JitPathInputs inputs;
  inputs.cuda_home = environment_value("CUDA_HOME");
  inputs.cuda_path = environment_value("CUDA_PATH");
  inputs.templates_env = environment_value("OPFUSE_TEMPLATES_DIR");
#ifdef OPFUSE_SOURCE_TEMPLATES_DIR
  inputs.source_templates_dir = OPFUSE_SOURCE_TEMPLATES_DIR;
#endif
#ifdef OPFUSE_INSTALL_TEMPLATES_DIR
  inputs.install_templates_dir = OPFUSE_INSTALL_TEMPLATES_DIR;
#endif
  return inputs;
}

JitPaths find_jit_paths(const JitPathInputs& inputs) {
  JitPaths paths = find_cuda(inputs);
  paths.templates_dir = find_templates(inputs);
  return paths;
}

}  // namespace opfuse::jit
