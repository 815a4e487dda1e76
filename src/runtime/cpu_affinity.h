// Pinning a thread to one of the CPUs this process may use. Header-only, so the roofline probes (which do not
// link the runtime) pin their threads exactly as the CPU device pins its workers: a bandwidth figure measured
// with two threads sharing a core would not be the machine's.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <vector>

namespace moe::rt {

// The CPUs of this process's affinity mask, in order (empty if it cannot be read).
inline std::vector<int> allowed_cpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  return cpus;
}

// Pins `thread` to the index-th allowed CPU (modulo their number). Does nothing with fewer than two CPUs or
// when the system refuses (a restricted container): pinning is an optimisation, never a requirement.
inline void pin_thread(pthread_t thread, int index, const std::vector<int>& cpus) {
  if (cpus.size() < 2) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpus[static_cast<size_t>(index) % cpus.size()], &one);
  pthread_setaffinity_np(thread, sizeof one, &one);
}

}  // namespace moe::rt
