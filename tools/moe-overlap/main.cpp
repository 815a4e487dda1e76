// moe-overlap: run, bench, trace, check and inspect an MoE layer on the multi-stream runtime.
// Each subcommand lives in its own cmd_*.cpp and registers itself here.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"moe-overlap: the MoE layer with its shared expert overlapped on a second stream"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moe-overlap 0.1");
  moe::tools::add_run_command(app);
  moe::tools::add_bench_command(app);
  moe::tools::add_trace_command(app);
  moe::tools::add_check_command(app);
  moe::tools::add_info_command(app);
  moe::tools::add_make_checkpoint_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-overlap: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
