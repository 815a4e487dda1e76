// `bench --ep N`: the expert-parallel layer's latency per schedule against its exchange and shared expert.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "ep/communicator.h"
#include "kernels/linear.h"
#include "layer/schedule.h"
#include "model_source.h"

namespace moe::tools {

struct BenchEpOptions {
  ModelOptions model;
  int ranks = 0;
  ep::ExchangeMode mode = ep::ExchangeMode::kLowLatency;
  std::chrono::milliseconds timeout{10000};
  Isa isa = Isa::kScalar;
  std::vector<int64_t> tokens;     // per rank
  std::vector<Schedule> schedules;  // serial first, for the hidden fraction
  bool graph = false;               // also time replays of a captured forward per schedule
  TuningTable tuning;               // resolves Schedule::kAuto
  int threads = 0, repeats = 10, warmup = 2;
  std::string json;
  std::string tune;  // write the fastest eager schedule per token count (tuning_file.h)
};

// Under mpirun; rank 0 prints the table and writes the JSON and the tuning table.
void run_bench_ep(const BenchEpOptions& options);

}  // namespace moe::tools
