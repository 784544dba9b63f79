// The fusec subcommands, one file each: every add_*_command adds its subcommand (options, help) to
// `app` and returns it with the function that runs it; main.cpp dispatches to the parsed one.
#pragma once

#include "common.h"

namespace opfuse::fusec {

Command add_check_command(CLI::App& app, CommonOptions& common);
Command add_ir_command(CLI::App& app, CommonOptions& common);
Command add_run_command(CLI::App& app, CommonOptions& common);
Command add_build_command(CLI::App& app, CommonOptions& common);
Command add_dump_kernels_command(CLI::App& app, CommonOptions& common);
Command add_bench_command(CLI::App& app, CommonOptions& common);
Command add_debug_plan_command(CLI::App& app, CommonOptions& common);
Command add_debug_report_command(CLI::App& app, CommonOptions& common);
Command add_merge_state_command(CLI::App& app, CommonOptions& common);
Command add_split_state_command(CLI::App& app, CommonOptions& common);
Command add_train_command(CLI::App& app, CommonOptions& common);

}  // namespace opfuse::fusec
