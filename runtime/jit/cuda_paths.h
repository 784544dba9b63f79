// Where the JIT finds the CUDA headers and opfuse's kernel templates (docs/design.md, "JIT").
#pragma once

#include <string>

namespace opfuse::jit {

// The environment and build settings the search reads; from_environment() fills them from the
// process environment and the build's compile definitions, tests fill them by hand.
struct JitPathInputs {
  std::string cuda_home;  // $CUDA_HOME, "" when unset
  std::string cuda_path;  // $CUDA_PATH, "" when unset
  std::string default_cuda_root = "/usr/local/cuda";
  std::string templates_env;          // $OPFUSE_TEMPLATES_DIR, "" when unset
  std::string source_templates_dir;   // the source tree's templates/ (build-tree runs)
  std::string install_templates_dir;  // share/opfuse/templates (installed runs)

  static JitPathInputs from_environment();
};

struct JitPaths {
  std::string cuda_root;         // e.g. /usr/local/cuda
  std::string cuda_include_dir;  // <cuda_root>/include
  std::string cccl_include_dir;  // <cuda_root>/include/cccl; "" for toolkits without it (< 13)
  std::string templates_dir;     // "" when no templates directory exists
};

// CUDA: the first of CUDA_HOME, CUDA_PATH, /usr/local/cuda that holds include/cuda_runtime.h.
// Templates: OPFUSE_TEMPLATES_DIR if set, else the source tree's templates/ if it exists, else the
// installed one if it exists, else none. Throws JitError naming every place tried when no CUDA
// toolkit is found, or when OPFUSE_TEMPLATES_DIR is set but is not a directory.
JitPaths find_jit_paths(const JitPathInputs& inputs = JitPathInputs::from_environment());

}  // namespace opfuse::jit
