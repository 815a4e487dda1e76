#include "bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <map>
#include <sstream>

#include "output_file.h"

namespace moe::tools {

std::string bench_table(const BenchReport& r) {
  std::ostringstream s;
  char line[512];
  s << r.model << "\n" << r.method << "\n";
  char avx2_peak[64] = "";  // the AVX2 kernels' own peak where it is not the machine's
  if (r.machine.on_256bit_vectors() && r.machine.avx2_fp32_gflops > 0 &&
      r.machine.avx2_fp32_gflops != r.machine.fp32_gflops)
    std::snprintf(avx2_peak, sizeof avx2_peak, " (256-bit: %.0f, the kernels' peak)", r.machine.avx2_fp32_gflops);
  const std::string kernels =
      r.machine.isa_build.empty() ? r.machine.isa : r.machine.isa + " (" + r.machine.isa_build + ")";
  std::snprintf(line, sizeof line,
                "machine: %s, %d threads: read %.1f GB/s at start (%s read loop, %s), best %.1f GB/s in the run, fp32 "
                "FMA %.0f GFLOP/s%s, bf16 dot %.0f GFLOP/s, kernels %s\n",
                r.machine.cpu.c_str(), r.machine.threads, r.machine.read_gbps, r.machine.read_isa.c_str(),
                r.machine.read_pattern.c_str(),
                r.best_read_gbps, r.machine.fp32_gflops, avx2_peak, r.machine.bf16_gflops, kernels.c_str());
  s << line;
  std::snprintf(line, sizeof line, "%7s %-13s %10s %10s %10s %8s %9s %8s %7s %7s %8s %7s %8s %7s %6s\n", "tokens",
                "schedule", "median_us", "p10_us", "p90_us", "MB_read", "GB/s", "read_now", "of_bw", "of_best", "GFLOP/s",
                "of_pk", "vs_serial", "hidden", "exprt");
  s << line;
  bool drifted = false;
  for (const BenchResult& b : r.results) {
    std::string sched = b.schedule == b.effective ? b.schedule : b.schedule + "*";
    const bool drift = b.read_spread > kReadDrift || (r.sweep_measures && b.read_calls == 0);
    drifted |= drift;
    std::snprintf(line, sizeof line,
                  "%7lld %-13s %10.1f %10.1f %10.1f %8.1f %9.1f %8.1f %5.0f%%%c %6.0f%% %8.1f %6.1f%% %8.3fx %6.0f%% %6lld\n",
                  static_cast<long long>(b.tokens), sched.c_str(), b.median_us, b.p10_us, b.p90_us,
                  static_cast<double>(b.bytes) / 1e6, b.gbps, b.read_gbps, 100 * b.bandwidth_fraction,
                  drift ? '~' : ' ', 100 * b.best_fraction, b.gflops, 100 * b.peak_fraction, b.speedup_vs_serial, 100 * b.hidden_fraction,
                  static_cast<long long>(b.active_experts));
    s << line;
  }
  if (r.sweep_measures)
    s << "read_now: the read bandwidth of the cache-evicting sweep just before each call (median); of_bw: the "
         "median over the calls of each call's GB/s over its sweep's\n";
  else
    s << "read_now: the read bandwidth measured at the start (no sweep of " << kMeasuringSweepMib
      << " MiB or more measured it during the run); of_bw is GB/s over it\n";
  std::snprintf(line, sizeof line,
                "of_best: GB/s over the best read bandwidth of the run, %.1f GB/s (the start probe and every sweep; "
                "%s read loop, %s)\n",
                r.best_read_gbps, r.machine.read_isa.c_str(), r.machine.read_pattern.c_str());
  s << line;
  std::snprintf(line, sizeof line,
                "of_pk: GFLOP/s over the best probe of the kernels' arithmetic peak in the run, %.0f GFLOP/s (at the "
                "start and after each token count)\n",
                r.best_peak_gflops);
  s << line;
  if (drifted)
    s << "~ the read bandwidth spread by more than " << static_cast<int>(100 * kReadDrift)
      << "% between this token count's calls (or no sweep had all workers at once): its fraction is less certain\n";
  // Graph mode: the host time a call costs eagerly vs replayed, same schedule and tokens.
  for (const BenchResult& g : r.results) {
    if (g.schedule.size() < 6 || g.schedule.compare(g.schedule.size() - 6, 6, "+graph") != 0) continue;
    for (const BenchResult& e : r.results)
      if (e.tokens == g.tokens && e.schedule + "+graph" == g.schedule) {
        std::snprintf(line, sizeof line, "  tokens %lld %s: host time per call eager %.1f us, graph %.1f us (%.1f us saved)\n",
                      static_cast<long long>(g.tokens), e.schedule.c_str(), e.host_us, g.host_us, e.host_us - g.host_us);
        s << line;
      }
  }
  bool fell_back = false;
  for (const BenchResult& b : r.results) fell_back |= b.schedule != b.effective;
  if (fell_back) s << "* a policy ran this call serial (MOE_OVERLAP_TOKEN_THRESHOLD, decode-only...; --no-policy runs it as asked)\n";
  std::snprintf(line, sizeof line, "peak RSS %.1f MiB (layer weights %.1f MiB; also the eviction buffer and workspaces)\n",
                static_cast<double>(r.peak_rss_bytes) / 1048576.0, static_cast<double>(r.layer_bytes) / 1048576.0);
  s << line;
  return s.str();
}

nlohmann::json bench_json(const BenchReport& r) {
  nlohmann::json results = nlohmann::json::array();
  for (const BenchResult& b : r.results) {
    nlohmann::json calls = nlohmann::json::array();
    for (const BenchCall& c : b.calls) calls.push_back({{"us", c.us}, {"bytes", c.bytes}, {"sweep_gbps", c.sweep_gbps}});
    results.push_back({{"schedule", b.schedule},
                       {"effective_schedule", b.effective},
                       {"tokens", b.tokens},
                       {"median_us", b.median_us},
                       {"p10_us", b.p10_us},
                       {"p90_us", b.p90_us},
                       {"bytes", b.bytes},
                       {"active_experts", b.active_experts},
                       {"gbps", b.gbps},
                       {"bandwidth_fraction", b.bandwidth_fraction},
                       {"read_gbps", b.read_gbps},
                       {"read_spread", b.read_spread},
                       {"read_calls", b.read_calls},
                       {"best_fraction", b.best_fraction},
                       {"gflops", b.gflops},
                       {"peak_fraction", b.peak_fraction},
                       {"speedup_vs_serial", b.speedup_vs_serial},
                       {"shared_alone_us", b.shared_alone_us},
                       {"hidden_fraction", b.hidden_fraction},
                       {"host_enqueue_us", b.host_us},
                       {"calls", calls}});
  }
  nlohmann::json machine = r.machine.to_json();
  machine["peak_rss_bytes"] = r.peak_rss_bytes;
  return {{"model", r.model},
          {"method", r.method},
          {"layer_bytes", r.layer_bytes},
          {"huge_page_fraction", r.huge_page_fraction},
          {"sweep_measures_bandwidth", r.sweep_measures},
          {"best_read_gbps", r.best_read_gbps},
          {"best_peak_gflops", r.best_peak_gflops},
          {"machine", machine},
          {"results", results}};
}

namespace {

// Each schedule's speed-up over serial per token count (serial's median over the schedule's), with the
// schedule's run-to-run spread as a bar (serial's median over its p90 and p10): on one log axis of latency
// the schedules' lines coincide, and what the overlap gains is only visible as this ratio.
template <class Px>
void speedup_panel(std::ostringstream& s, const std::map<std::string, std::vector<const BenchResult*>>& series,
                   double left, double top, double w, double h, const Px& px, const char* const* colours) {
  const auto serial = series.find("serial");
  if (serial == series.end()) return;
  std::map<int64_t, double> base;
  for (const BenchResult* b : serial->second) base[b->tokens] = b->median_us;
  double lo = 0.95, hi = 1.05;
  for (const auto& [name, pts] : series)
    for (const BenchResult* b : pts)
      if (base.count(b->tokens) && b->p10_us > 0 && b->p90_us > 0) {
        lo = std::min(lo, base[b->tokens] / b->p90_us);
        hi = std::max(hi, base[b->tokens] / b->p10_us);
      }
  lo = std::max(lo, 0.0);
  auto py = [&](double y) { return top + h - h * (y - lo) / (hi - lo); };
  s << "<text x='10' y='" << top - 10 << "' font-size='13'>speed-up over serial (bars: p10-p90 of the repeats)</text>\n"
    << "<rect x='" << left << "' y='" << top << "' width='" << w << "' height='" << h << "' fill='none' stroke='#888'/>\n";
  for (double y : {lo, 1.0, hi})
    s << "<line x1='" << left << "' x2='" << left + w << "' y1='" << py(y) << "' y2='" << py(y) << "' stroke='"
      << (y == 1.0 ? "#999" : "#eee") << "'/><text x='5' y='" << py(y) + 4 << "'>" << std::setprecision(3) << y
      << "x</text>\n";
  int i = 0;
  for (const auto& [name, pts] : series) {
    const char* colour = colours[i++ % 5];
    s << "<polyline fill='none' stroke='" << colour << "' stroke-width='2' points='";
    for (const BenchResult* b : pts)
      if (base.count(b->tokens) && b->median_us > 0) s << px(static_cast<double>(b->tokens)) << "," << py(base[b->tokens] / b->median_us) << " ";
    s << "'/>\n";
    for (const BenchResult* b : pts)
      if (base.count(b->tokens) && b->p10_us > 0 && b->p90_us > 0) {
        const double x = px(static_cast<double>(b->tokens));
        s << "<line x1='" << x << "' x2='" << x << "' y1='" << py(base[b->tokens] / b->p90_us) << "' y2='"
          << py(base[b->tokens] / b->p10_us) << "' stroke='" << colour << "'/>\n";
      }
  }
  s << "<text x='" << left + w / 2 - 20 << "' y='" << top + h + 30 << "'>tokens</text>\n";
}

}  // namespace

void write_bench_svg(const BenchReport& r, const std::string& path) {
  std::map<std::string, std::vector<const BenchResult*>> series;
  double tmin = 1e300, tmax = 0, ymin = 1e300, ymax = 0;
  for (const BenchResult& b : r.results) {
    series[b.schedule].push_back(&b);
    const double t = std::max<double>(1, static_cast<double>(b.tokens));
    tmin = std::min(tmin, t);
    tmax = std::max(tmax, t);
    ymin = std::min({ymin, b.median_us, static_cast<double>(b.bytes) / (r.machine.read_gbps * 1e3)});
    ymax = std::max(ymax, b.median_us);
  }
  if (series.empty()) throw std::runtime_error("no results to plot");
  if (tmax <= tmin) tmax = tmin * 2;
  ymin = std::max(ymin * 0.8, 1e-3);
  ymax *= 1.25;
  const double left = 70, top = 40, w = 640, h = 380;
  auto px = [&](double t) { return left + w * std::log(std::max(1.0, t) / tmin) / std::log(tmax / tmin); };
  auto py = [&](double y) { return top + h - h * std::log(y / ymin) / std::log(ymax / ymin); };
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  const double top2 = top + h + 80, h2 = 220;  // the second panel: speed-up over serial
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << left + w + 190 << "' height='" << top2 + h2 + 50
    << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' fill='white'/>\n"
    << "<text x='10' y='20' font-size='13'>latency per layer call vs tokens (" << r.machine.threads
    << " threads)</text>\n<rect x='" << left << "' y='" << top << "' width='" << w << "' height='" << h
    << "' fill='none' stroke='#888'/>\n";
  for (double t = tmin; t <= tmax * 1.001; t *= 2)
    s << "<text x='" << px(t) - 8 << "' y='" << top + h + 15 << "'>" << static_cast<long long>(t) << "</text>\n";
  for (double y = std::pow(10, std::floor(std::log10(ymin))); y <= ymax; y *= 10)
    if (y >= ymin)
      s << "<line x1='" << left << "' x2='" << left + w << "' y1='" << py(y) << "' y2='" << py(y)
        << "' stroke='#eee'/><text x='5' y='" << py(y) + 4 << "'>" << static_cast<long long>(y) << " us</text>\n";
  s << "<text x='" << left + w / 2 - 20 << "' y='" << top + h + 35 << "'>tokens</text>\n";
  const char* colours[] = {"#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1"};
  int i = 0;
  auto polyline = [&](const std::vector<std::pair<double, double>>& pts, const char* colour, const char* dash,
                      const std::string& label) {
    s << "<polyline fill='none' stroke='" << colour << "' stroke-width='2' stroke-dasharray='" << dash << "' points='";
    for (const auto& [t, y] : pts) s << px(t) << "," << py(y) << " ";
    s << "'/>\n<text x='" << left + w + 10 << "' y='" << top + 15 + 16 * i << "' fill='" << colour << "'>" << label
      << "</text>\n";
    ++i;
  };
  for (const auto& [name, pts] : series) {
    std::vector<std::pair<double, double>> p;
    for (const BenchResult* b : pts) p.emplace_back(static_cast<double>(b->tokens), b->median_us);
    polyline(p, colours[i % 5], "", name);
  }
  std::vector<std::pair<double, double>> roof;
  for (const BenchResult* b : series.begin()->second)
    roof.emplace_back(static_cast<double>(b->tokens), static_cast<double>(b->bytes) / (r.machine.read_gbps * 1e3));
  polyline(roof, "#999", "5,4", "bandwidth bound");
  speedup_panel(s, series, left, top2, w, h2, px, colours);
  s << "</svg>\n";
  write_file_atomically(path, s.str());
}

}  // namespace moe::tools
