#include "ep_launch.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#ifdef MOE_HAVE_MPI
#include "ep/mpi_communicator.h"
#endif

namespace moe::tools {

void add_ep_options(CLI::App* cmd, EpOptions& o, const std::string& what) {
  cmd->add_option("--ep", o.ranks, "expert parallelism over N MPI ranks (under mpirun -n N): " + what)
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--ep-mode", o.mode, "exchange: normal (counts, then rows) or low-latency (one round)")
      ->check(CLI::IsMember({"normal", "low-latency"}))
      ->capture_default_str();
  cmd->add_option("--ep-timeout-ms", o.timeout_ms,
                  "an exchange waiting longer than this for a peer fails, naming the peer (a dead or stalled rank)")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
}

rt::CpuDeviceOptions rank_device_options(const ep::Communicator& comm, int threads) {
  rt::CpuDeviceOptions o{.num_workers = threads, .first_cpu = comm.rank() * std::max(threads, 1)};
  // Ranks are placed as if they shared this machine. Where their workers outnumber its CPUs, a worker
  // spinning while its peers run tiles would spin on a core another rank's worker needs.
  const int cpus = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (comm.size() * (threads > 0 ? threads : cpus) > cpus) o.spin_while_running_us = 0;
  return o;
}

LoadedModel load_rank_share(const ModelOptions& options, const ep::Communicator& comm) {
  const int r = comm.rank(), n = comm.size();
  if (options.experts >= 0)
    throw std::invalid_argument("--experts and --ep exclude each other: under --ep every rank maps its own share");
  const int64_t num_experts = model_num_experts(options);
  if (num_experts < n)
    throw std::invalid_argument("--ep " + std::to_string(n) + ": the model has only " + std::to_string(num_experts) +
                                " experts");
  ModelOptions mine = options;
  mine.first_expert = ep::first_expert(num_experts, n, r);
  mine.experts = ep::first_expert(num_experts, n, r + 1) - mine.first_expert;
  return load_model(mine);
}

std::unique_ptr<ep::Communicator> join_ranks(int expected, std::chrono::milliseconds timeout) {
#ifdef MOE_HAVE_MPI
  std::unique_ptr<ep::Communicator> comm = ep::MpiCommunicator::init(nullptr, nullptr, timeout);
  if (comm->size() != expected)
    throw std::invalid_argument("--ep " + std::to_string(expected) + ": the MPI world has " +
                                std::to_string(comm->size()) + " rank(s); start it with mpirun -n " +
                                std::to_string(expected));
  return comm;
#else
  (void)timeout;
  throw std::invalid_argument("--ep " + std::to_string(expected) +
                              ": this build has no MPI (install openmpi-bin and libopenmpi-dev, e.g. with "
                              "scripts/install-deps.sh, and rebuild)");
#endif
}

}  // namespace moe::tools
