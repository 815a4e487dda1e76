// The results of `moe-overlap bench` and their three renderings: a terminal table, JSON and an SVG plot of
// latency against tokens per schedule (with the bandwidth-bound time for reference).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "machine.h"

namespace moe::tools {

struct BenchResult {
  std::string schedule;  // as requested; `effective` says what ran when a policy changed it
  std::string effective;
  int64_t tokens = 0;
  double median_us = 0, p10_us = 0, p90_us = 0;
  int64_t bytes = 0;          // weight bytes the forward read (median over repetitions)
  int64_t active_experts = 0;
  double gbps = 0, bandwidth_fraction = 0;  // the fraction of read_gbps
  // The machine's read bandwidth measured just before and just after this token count's repetitions
  // (mean), and how far apart the two were (|after - before| / mean): this machine's bandwidth changes
  // between modes within a run, so a fraction is taken against the bandwidth of the moment.
  double read_gbps = 0, read_change = 0;
  double gflops = 0, peak_fraction = 0;
  double speedup_vs_serial = 0;
  double shared_alone_us = 0;  // the shared branch's own time (ops' union in a traced serial forward)
  double hidden_fraction = 0;  // (T_serial - T_schedule) / T_shared_alone
  double host_us = 0;          // host time to enqueue the forward (eager), median
};

struct BenchReport {
  std::string model;          // label of the layer
  std::string method;         // how weights were kept cold, repetitions, ...
  MachineFigures machine;
  int64_t peak_rss_bytes = 0;
  int64_t layer_bytes = 0;
  double huge_page_fraction = -1;  // of the weights' resident pages, in 2 MiB pages (-1: unknown)
  std::vector<BenchResult> results;
};

// A token count whose bandwidth probes before and after differ by more than this is marked in the table.
inline constexpr double kReadDrift = 0.15;

std::string bench_table(const BenchReport& r);
nlohmann::json bench_json(const BenchReport& r);
void write_bench_svg(const BenchReport& r, const std::string& path);

}  // namespace moe::tools
