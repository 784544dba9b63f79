#include "build_common.h"

#include <cstdio>
#include <filesystem>

#include "jit/ptxas_log.h"
#include "support/diagnostics.h"

namespace opfuse::fusec {

namespace fs = std::filesystem;

void add_build_options(CLI::App* cmd, BuildCommandOptions& opts, CommonOptions& common) {
  cmd->add_option("file", opts.file, ".fuse file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--output", opts.out_dir, "output directory (created if missing)")->required();
  cmd->add_option("--arch", opts.arch,
                  "target: sm_XX[a|f] for a cubin, compute_XX for PTX (never queried from a "
                  "device)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& arch) -> std::string {
            return jit::is_arch_name(arch)
                       ? ""
                       : "'" + arch + "' is not an arch: use sm_90a, sm_89, compute_90, ...";
          },
          "ARCH"));
  cmd->add_option("--sequence", opts.sequence, "build only this sequence");
  cmd->add_flag("--emulate-block-scaling", opts.emulate_block_scaling,
                "run float8_block_scaling emulated (decoded copies, BF16 GEMMs) even where the "
                "arch has cuBLASLt's block-scale modes");
  cmd->add_option("--disable-pass", opts.disable,
                  "skip this pass (repeatable), e.g. fuse-forward to build every op unfused")
      ->allow_extra_args(false);
  add_common(cmd, common);
  cmd->footer(kExitCodeHelp);
}

driver::CompileOptions build_driver_options(const BuildCommandOptions& opts,
                                            const CommonOptions& common) {
  driver::CompileOptions options = driver_options(common);
  options.sequence = opts.sequence;
  options.disabled_passes.insert(opts.disable.begin(), opts.disable.end());
  options.arch = opts.arch;
  options.emulate_block_scaling = opts.emulate_block_scaling;
  return options;
}

std::optional<driver::CompileResult> compile_program(ir::Program program,
                                                     const driver::CompileOptions& options,
                                                     const SourceManager& sources) {
  // A fresh engine: load() printed the front end's warnings already.
  DiagnosticEngine diags(sources);
  driver::CompileResult result = driver::compile_ir(std::move(program), &sources, &diags, options);
  std::fputs(diags.format_all().c_str(), stderr);  // errors, or notes (an emulated recipe)
  if (result.ok()) return result;
  return std::nullopt;
}

void remove_stale_kernels(const std::string& kernels_dir, const codegen::Plan& plan,
                          const std::string& binary_ext) {
  std::error_code error;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(kernels_dir, error)) {
    const fs::path& path = entry.path();
    const std::string ext = path.extension().string();
    if (ext != ".cu" && ext != ".cubin" && ext != ".ptx") continue;
    if (plan.find_kernel(path.stem().string()) == nullptr ||
        (!binary_ext.empty() && ext != ".cu" && ext != binary_ext))
      stale.push_back(path);
  }
  for (const fs::path& path : stale) fs::remove(path, error);
}

}  // namespace opfuse::fusec
