// What `fusec build` and `fusec dump-kernels` share: their options, and the compile from a file to
// the plan.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "codegen/plan.h"
#include "common.h"

namespace opfuse::fusec {

struct BuildCommandOptions {
  std::string file;
  std::string out_dir;
  std::string arch = "sm_90a";
  std::vector<std::string> disable;  // passes to skip
  std::string sequence;
  bool emulate_block_scaling = false;  // driver::CompileOptions::emulate_block_scaling
};

// Adds the options build and dump-kernels have in common to `cmd`.
void add_build_options(CLI::App* cmd, BuildCommandOptions& opts, CommonOptions& common);

// The driver's options for these commands (passes, arch, sequence).
driver::CompileOptions build_driver_options(const BuildCommandOptions& opts,
                                            const CommonOptions& common);

// Runs the pass pipeline and builds the plan and the kernel requests of a program `load`ed with
// `options`; nullopt after printing the user errors.
std::optional<driver::CompileResult> compile_program(ir::Program program,
                                                     const driver::CompileOptions& options,
                                                     const SourceManager& sources);

// Removes kernel files an earlier build left in the directory: kernels this plan does not have
// and, after a build, binaries of the other kind (.cubin vs .ptx) than `binary_ext`.
void remove_stale_kernels(const std::string& kernels_dir, const codegen::Plan& plan,
                          const std::string& binary_ext = "");

}  // namespace opfuse::fusec
