// The tuning table behind `--schedule auto`, as a JSON file: `bench --tune FILE` writes the fastest
// schedule it measured per token count, `--tuning FILE` on run/trace/bench reads it back.
//   {"model": "...", "cpu": "...", "threads": 2, "isa": "avx512",
//    "table": [{"tokens": 1, "schedule": "dual", "speedup_vs_serial": 1.017}, ...]}
#pragma once

#include <string>
#include <vector>

#include "bench_report.h"
#include "layer/schedule.h"

namespace moe::tools {

// Throws std::invalid_argument naming the file and the field on anything malformed; "" gives an empty table.
TuningTable read_tuning_file(const std::string& path);

// The fastest eager schedule per token count in `report` (a schedule a policy sent back to serial counts
// as serial); written atomically.
void write_tuning_file(const std::string& path, const BenchReport& report);

// One row of a tuning table as a benchmark measured it.
struct TuningEntry {
  int64_t tokens = 0;
  std::string schedule;  // the fastest schedule's name
  double speedup_vs_serial = 0;
};
// The table from rows already chosen (ascending tokens), with what they were measured on; written atomically.
void write_tuning_file(const std::string& path, const std::string& model, const std::string& cpu, int threads,
                       const std::string& isa, const std::vector<TuningEntry>& entries);

}  // namespace moe::tools
