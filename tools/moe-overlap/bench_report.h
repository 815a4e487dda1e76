// The results of `moe-overlap bench` and their three renderings: a terminal table, JSON and an SVG plot of
// latency against tokens per schedule (with the bandwidth-bound time for reference).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/roofline.h"
#include "machine.h"

namespace moe::tools {

// One timed call: its time, the weight bytes its routing read, and the bandwidth of the sweep just before it
// (0 where that sweep did not measure: too small to leave the caches, or its slices were not read at once).
struct BenchCall {
  double us = 0;
  int64_t bytes = 0;
  double sweep_gbps = 0;
};

struct BenchResult {
  std::string schedule;  // as requested; `effective` says what ran when a policy changed it
  std::string effective;
  int64_t tokens = 0;
  double median_us = 0, p10_us = 0, p90_us = 0;
  int64_t bytes = 0;          // weight bytes the forward read (median over repetitions)
  int64_t active_experts = 0;
  // GB/s: median bytes over median time. bandwidth_fraction: the median over the calls of each call's GB/s
  // over the bandwidth its sweep measured (read_calls of them); without any, gbps / read_gbps.
  double gbps = 0, bandwidth_fraction = 0;
  // The read bandwidth of the moment: the median over this token count's timed calls of the cache-evicting
  // sweep each call follows (read_calls of them measured it; without any, the figure from the start), and
  // its spread, (p90 - p10) / median. This machine's bandwidth changes between modes within a run, so each
  // call is compared with the bandwidth of its own moment.
  double read_gbps = 0, read_spread = 0;
  int read_calls = 0;
  // gbps over BenchReport::best_read_gbps: against the best the memory delivered in this run, so a slow
  // moment does not flatter the call (of_bw can reach 100% in a slow mode that the whole machine is in).
  double best_fraction = 0;
  // peak_fraction: gflops over BenchReport::best_peak_gflops.
  double gflops = 0, peak_fraction = 0;
  double speedup_vs_serial = 0;
  double shared_alone_us = 0;  // the shared branch's own time (ops' union in a traced serial forward)
  double hidden_fraction = 0;  // (T_serial - T_schedule) / T_shared_alone
  double host_us = 0;          // host time to enqueue the forward (eager), median
  std::vector<BenchCall> calls;  // every timed call, in the order run: the figures above are their medians
};

struct BenchReport {
  std::string model;          // label of the layer
  std::string method;         // how weights were kept cold, repetitions, ...
  MachineFigures machine;
  int64_t peak_rss_bytes = 0;
  int64_t layer_bytes = 0;
  double huge_page_fraction = -1;  // of the weights' resident pages, in 2 MiB pages (-1: unknown)
  bool sweep_measures = false;     // the eviction sweep measured the read bandwidth (BenchResult::read_gbps)
  // The highest read bandwidth measured in the run: the start probe and every sweep that measured (the
  // timed calls', the settle phase's, the shared branch's traced calls'), all with machine.read_isa's loop.
  double best_read_gbps = 0;
  // The highest peak of the kernels' arithmetic (MachineFigures::kernel_peak_gflops) measured in the run: at
  // the start and after each token count's calls. The host can slow the cores for a while, as it can the
  // memory; a probe in such a moment would flatter every of_pk against it.
  double best_peak_gflops = 0;
  std::vector<BenchResult> results;
};

// A sweep this large reads from DRAM, so timing it measures the read bandwidth (kernels/roofline.h).
inline constexpr int64_t kMeasuringSweepMib = static_cast<int64_t>(kDramReadBytes >> 20);
// A token count whose sweeps' bandwidth spreads by more than this is marked in the table.
inline constexpr double kReadDrift = 0.15;

std::string bench_table(const BenchReport& r);
nlohmann::json bench_json(const BenchReport& r);
void write_bench_svg(const BenchReport& r, const std::string& path);

}  // namespace moe::tools
