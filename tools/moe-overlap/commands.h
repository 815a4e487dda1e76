// The subcommands of moe-overlap. Each add_*_command registers its flags and a callback that does the work;
// callbacks throw on error and main() turns the exception into one line and a non-zero exit.
#pragma once

#include <CLI/CLI.hpp>

namespace moe::tools {

void add_run_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_trace_command(CLI::App& app);
void add_check_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_make_checkpoint_command(CLI::App& app);

}  // namespace moe::tools
