// Joining the ranks of an expert-parallel job (`--ep N` under mpirun) for the commands that run a layer.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "ep/communicator.h"
#include "model_source.h"
#include "runtime/runtime.h"

namespace moe::tools {

// --ep, --ep-mode and --ep-timeout-ms, shared by run and bench.
struct EpOptions {
  int ranks = 0;  // 0: one process
  std::string mode = "low-latency";
  int timeout_ms = 10000;
  ep::ExchangeMode exchange_mode() const {
    return mode == "normal" ? ep::ExchangeMode::kNormal : ep::ExchangeMode::kLowLatency;
  }
};
// `what`: the --ep flag's help for this command (what the ranks do).
void add_ep_options(CLI::App* cmd, EpOptions& o, const std::string& what);

// The MPI ranks of this job; std::invalid_argument when the world has a size other than `expected` (naming
// both) or when this build has no MPI (naming what to install).
std::unique_ptr<ep::Communicator> join_ranks(int expected, std::chrono::milliseconds timeout);

// The CPU device of this rank: `threads` workers (0: one per core), pinned from CPU rank * threads on, so that
// ranks sharing a machine do not pin their workers to the same cores.
rt::CpuDeviceOptions rank_device_options(const ep::Communicator& comm, int threads);

// This rank's share of --model: the router and the shared expert, and the routed experts it owns
// (ep::first_expert). std::invalid_argument when --experts is also given or the model has fewer experts than
// ranks.
LoadedModel load_rank_share(const ModelOptions& options, const ep::Communicator& comm);

// Runs `body`; on an exception prints one line naming this rank and ends every rank of the job (a rank that
// fails alone would leave its peers waiting in an exchange).
template <class F>
void on_every_rank(ep::Communicator& comm, F&& body);

}  // namespace moe::tools

#include <cstdio>
#include <exception>

template <class F>
void moe::tools::on_every_rank(ep::Communicator& comm, F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-overlap: error: rank %d of %d: %s\n", comm.rank(), comm.size(), e.what());
    std::fflush(stderr);
    comm.abort(1);
  }
}
