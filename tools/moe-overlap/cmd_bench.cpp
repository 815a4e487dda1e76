// `moe-overlap bench`: latency of each schedule over token counts, next to this machine's measured bandwidth
// and arithmetic peak, with the speed-up over serial and the fraction of the shared expert's time hidden.
//
// Honest measurement: every repetition uses a new input (so routing, and the experts read, change), the
// caches are evicted before every timed call (a 256 MiB sweep, several times a server CPU's last-level
// cache), schedules are interleaved within a repetition so that each sees the same inputs and conditions, and
// the bandwidth and peak are measured in the same process run. Times are device times (see DeviceTimer).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <utility>
#include <unistd.h>
#include <cstdio>

#include "bench_report.h"
#include "commands.h"
#include "io/rss.h"
#include "kernels/roofline.h"
#include "layer/moe_layer.h"
#include "bench_ep.h"
#include "ep_launch.h"
#include "layer_cost.h"
#include "model/host_buffer.h"
#include "model_source.h"
#include "tuning_file.h"
#include "output_file.h"
#include "overlap_stats.h"

namespace moe::tools {

namespace {

struct BenchOptions {
  ModelOptions model;
  std::string tokens = "1,2,4,8,16,32,64,128,256,512";
  std::string schedules = "serial,dual,phased,fused";
  int threads = 0, repeats = 10, warmup = 2, settle_ms = 3000;
  int64_t evict_mib = 256;
  bool no_policy = false, graph = false;
  std::string json, svg, tune;
  std::string read_isa;  // the read loop of the probe and sweeps; empty: the widest (read_isa())
  EpOptions ep;  // expert parallelism (bench_ep.cpp)
};

// One thing timed: a schedule, run eagerly or as a replayed graph.
struct Variant {
  Schedule schedule;
  bool graph;
  std::string name() const { return std::string(schedule_name(schedule)) + (graph ? "+graph" : ""); }
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  const double f = pos - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void store_max(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load();
  while (cur < v && !a.compare_exchange_weak(cur, v)) {
  }
}

void store_min(std::atomic<int64_t>& a, int64_t v) {
  int64_t cur = a.load();
  while (cur > v && !a.compare_exchange_weak(cur, v)) {
  }
}

// Device time of one call, as CUDA events around a kernel measure it: from the end of the operation ahead of
// the call to the end of a stamp operation behind it, both timestamped by the workers. Ahead of the call runs
// either a cache eviction (the workers read every byte of a buffer far larger than the last-level cache, so
// the call finds no weights there, as after the previous layer) or a gate the host opens once the whole call
// is enqueued. Either way the host enqueues while the device is busy, as a serving loop does, and neither
// worker wake-up nor host enqueue time is counted; the host's enqueue cost is reported on its own.
//
// The eviction sweep is also the bandwidth probe of the moment: each worker reads one slice with the probe's
// loop (on `read_loop`, in the pattern the start-up probe found fastest: set_read_pattern), and the sweep
// is timed. This machine's bandwidth changes between modes within a
// fraction of a second, so a probe run before and after a token count can miss a change that a whole token
// count sees. The timer also keeps the best sweep it measured.
class DeviceTimer {
 public:
  DeviceTimer(int64_t evict_mib, int workers, Isa read_loop)
      : evict_(static_cast<size_t>(evict_mib) << 20),
        read_loop_(read_loop),
        num_tiles_(workers),
        slice_(evict_.size() / static_cast<size_t>(workers) / 1024 * 1024),
        measures_(evict_mib >= kMeasuringSweepMib && slice_ > 0) {}
  bool evicts() const { return evict_.size() > 0; }
  void set_read_pattern(ReadPattern pattern) { read_pattern_ = pattern; }
  const void* sweep_data() const { return evict_.data(); }
  size_t sweep_bytes() const { return evict_.size(); }
  // Whether sweep_gbps() can answer: the sweep is large enough to read from DRAM.
  bool measures_bandwidth() const { return measures_; }

  void begin(rt::Stream& s) {
    start_ = 0;
    end_ = 0;
    open_ = false;
    first_start_ = INT64_MAX;
    last_start_ = 0;
    first_end_ = INT64_MAX;
    if (evicts()) {
      s.launch({.name = "bench.evict", .num_tiles = num_tiles_, .tile = [this](int t) {
                  const int64_t t0 = now_ns();
                  store_min(first_start_, t0);
                  store_max(last_start_, t0);
                  sink_ += read_once(read_loop_, evict_.as<const char>() + static_cast<size_t>(t) * slice_, slice_,
                                     read_pattern_);
                  const int64_t t1 = now_ns();
                  store_min(first_end_, t1);
                  store_max(start_, t1);
                }});
    } else {
      s.launch({.name = "bench.gate", .num_tiles = 0, .poll = [this] {
                  if (!open_.load()) return false;
                  start_ = now_ns();
                  return true;
                }});
    }
  }
  void end(rt::Stream& s) {
    // Behind the call, so the sweep's timestamps are final.
    s.launch({.name = "bench.stamp", .num_tiles = 1, .tile = [this](int) {
                end_ = now_ns();
                best_gbps_ = std::max(best_gbps_.load(), sweep_gbps());
              }});
    open_ = true;
  }
  double us() const { return static_cast<double>(end_.load() - start_.load()) / 1e3; }
  // GB/s of the last call's sweep, from its first slice's start to its last slice's end; 0 when the sweep does
  // not measure, or when the slices were not all read at once (a worker woke late and another read two).
  double sweep_gbps() const {
    if (!measures_ || last_start_.load() >= first_end_.load()) return 0;
    return static_cast<double>(slice_ * static_cast<size_t>(num_tiles_)) /
           static_cast<double>(start_.load() - first_start_.load());
  }
  // The highest sweep_gbps() of every call timed so far (0 when none measured).
  double best_sweep_gbps() const { return best_gbps_.load(); }

 private:
  HostBuffer evict_;
  const Isa read_loop_;
  ReadPattern read_pattern_ = ReadPattern::kRuns;
  const int num_tiles_;
  const size_t slice_;
  const bool measures_;
  std::atomic<int64_t> start_{0}, end_{0};
  std::atomic<int64_t> first_start_{0}, last_start_{0}, first_end_{0};  // of the sweep's slices
  std::atomic<bool> open_{false};
  std::atomic<uint64_t> sink_{0};
  std::atomic<double> best_gbps_{0};
};

// A checkpoint's weights are a file mapping: the first read of each 4 KiB page takes a page fault, which a
// serving process pays once and a benchmark with new experts every repetition would pay on every call.
// Touching every page once before timing measures the steady state (it maps the pages; it copies nothing).
void touch_pages(const LayerWeights& w) {
  uint64_t sink = 0;
  for (const WeightView& v : w.views()) {
    const auto* p = static_cast<const volatile unsigned char*>(v.data);
    for (int64_t i = 0; i < v.bytes(); i += 4096) sink += p[i];
  }
  static std::atomic<uint64_t> keep;  // the reads must not be optimised away
  keep.store(sink, std::memory_order_relaxed);
}

// Of the weights' resident pages, the share in 2 MiB pages; -1 where /proc/self/smaps is unavailable.
double huge_page_fraction(const LayerWeights& w) {
  std::vector<AddressRange> ranges;
  for (const WeightView& v : w.views()) ranges.push_back({v.data, static_cast<uint64_t>(v.bytes())});
  const PageCoverage c = page_coverage(ranges);
  if (c.resident_bytes <= 0) return -1;
  return static_cast<double>(c.huge_bytes) / static_cast<double>(c.resident_bytes);
}

struct Samples {
  std::vector<BenchCall> calls;
  std::vector<double> host_us;
  std::vector<double> us() const {
    std::vector<double> v;
    for (const BenchCall& c : calls) v.push_back(c.us);
    return v;
  }
  // Each call whose sweep measured: its GB/s over the sweep's.
  std::vector<double> of_bw() const {
    std::vector<double> v;
    for (const BenchCall& c : calls)
      if (c.sweep_gbps > 0) v.push_back(static_cast<double>(c.bytes) / (c.us * 1e3) / c.sweep_gbps);
    return v;
  }
};

// A schedule against serial, call by call: the medians over the repetitions of serial's call over this
// schedule's call in the same repetition, and of the time it saved. Paired (the same input, moments apart),
// they do not move with the input's work, which varies several times over where a rank holds a share of
// the experts (DeepSeek-V3 with 64 of 256: 0-4 local experts per token), nor with the memory's mode
// between repetitions. Unpaired medians of such calls measured the routed experts' chain 1.9-2.1% slower
// in three runs of five where the paired ratio had it 0.8% faster (docs/benchmarking.md).
struct VsSerial {
  double speedup = 0, saved_us = 0;
};
VsSerial paired_with_serial(const Samples& serial, const Samples& s) {
  std::vector<double> ratio, saved;
  for (size_t r = 0; r < std::min(serial.calls.size(), s.calls.size()); ++r) {
    if (serial.calls[r].us <= 0 || s.calls[r].us <= 0) continue;
    ratio.push_back(serial.calls[r].us / s.calls[r].us);
    saved.push_back(serial.calls[r].us - s.calls[r].us);
  }
  if (ratio.empty()) return {};
  return {quantile(ratio, 0.5), quantile(saved, 0.5)};
}

// The shared branch's own time: the union of its operations in traced serial forwards, median.
double shared_alone_us(MoeLayer& layer, rt::Device& dev, const std::vector<float>& x, int64_t tokens, float* y,
                       DeviceTimer& timer) {
  if (!layer.config().has_shared_expert() || tokens == 0) return 0;
  std::vector<double> v;
  rt::Stream main = rt::current_stream(dev);
  for (int r = 0; r < 3; ++r) {
    dev.set_tracing(true);
    timer.begin(main);
    layer.forward(x.data(), tokens, y, {.schedule = Schedule::kSerial});
    timer.end(main);
    main.synchronize();
    dev.set_tracing(false);
    v.push_back(overlap_stats(dev.take_trace()).shared_us);
  }
  return quantile(v, 0.5);
}

// Untimed calls of the first token count, every schedule in turn, for o.settle_ms. A VM that hands freed
// memory back to its host (free page reporting) slows the calls of the next seconds after a large free;
// whatever was freed before this process started (a previous run, make-checkpoint, --reread's dropped pages)
// is handed back during these calls instead of the timed ones (docs/benchmarking.md, machine effects).
void settle(MoeLayer& layer, rt::Stream& main, DeviceTimer& timer, const std::vector<Variant>& variants,
            int64_t tokens, int64_t hidden, float* y, const BenchOptions& o) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.settle_ms);
  for (int i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
    const std::vector<float> x = random_activations(tokens, hidden, o.model.seed * 7919 + 500 + i);
    timer.begin(main);
    layer.forward(x.data(), tokens, y, {.schedule = variants[static_cast<size_t>(i) % variants.size()].schedule});
    timer.end(main);
    main.synchronize();
  }
}

void run_bench(const BenchOptions& o) {
  // An output that cannot be written fails now, not after the measurements.
  check_output_paths({{"--json", o.json}, {"--svg", o.svg}, {"--tune", o.tune}});
  if (o.ep.ranks > 0) {
    if (!o.svg.empty() || !o.read_isa.empty())
      throw std::invalid_argument("--ep: --svg and --read-isa are not available with expert parallelism");
    BenchEpOptions e{.model = o.model,
                     .ranks = o.ep.ranks,
                     .mode = o.ep.exchange_mode(),
                     .timeout = std::chrono::milliseconds(o.ep.timeout_ms),
                     .isa = kernel_isa(o.model.isa),
                     .tokens = parse_token_list(o.tokens, "--tokens", 1 << 16),
                     .graph = o.graph,
                     .tuning = read_tuning_file(o.model.tuning),
                     .threads = o.threads,
                     .repeats = o.repeats,
                     .warmup = o.warmup,
                     .json = o.json,
                     .tune = o.tune};
    for (const std::string& name : split_list(o.schedules)) e.schedules.push_back(parse_schedule(name));
    if (o.repeats < 1) throw std::invalid_argument("--repeats: expected >= 1");
    return run_bench_ep(e);
  }
  std::vector<Variant> variants;
  for (const std::string& name : split_list(o.schedules)) {
    const Schedule s = parse_schedule(name);
    variants.push_back({s, false});
    if (o.graph) variants.push_back({s, true});
  }
  const std::vector<int64_t> token_counts = parse_token_list(o.tokens, "--tokens", 1 << 16);
  if (o.repeats < 1) throw std::invalid_argument("--repeats: expected >= 1");
  TuningTable tuning = read_tuning_file(o.model.tuning);  // a bad file fails before the measurements
  Isa read_loop = read_isa();
  if (!o.read_isa.empty()) {
    const std::optional<Isa> named = parse_isa(o.read_isa);
    if (!named || exact_isa(*named) != *named)
      throw std::invalid_argument("--read-isa: expected scalar, avx2 or avx512, got '" + o.read_isa + "'");
    require_isa(*named, "--read-isa");
    read_loop = *named;
  }
  auto dev = rt::make_cpu_device({.num_workers = o.threads});
  BenchReport report;
  const Isa isa = kernel_isa(o.model.isa);
  // The eviction buffer first: the probe at the start reads it rather than mapping and unmapping 1 GiB of its
  // own, since memory freed just before the timed calls slows them on this VM (see settle()). Before the
  // weights exist; then the peak RSS starts again, so the one reported below is the layer's own (weights,
  // workspaces, the eviction buffer), without a probe's unmapped 1 GiB.
  DeviceTimer timer(o.evict_mib, dev->num_workers(), read_loop);
  report.sweep_measures = timer.measures_bandwidth();
  report.machine = measure_machine(dev->num_workers(), timer.sweep_data(), timer.sweep_bytes(), read_loop);
  timer.set_read_pattern(parse_read_pattern(report.machine.read_pattern).value_or(ReadPattern::kRuns));
  report.machine.isa = std::string(isa_name(isa));  // the report names the kernels' ISA and build
  report.machine.isa_build = std::string(isa_build(isa));
  reset_peak_rss();
  LoadedModel m = load_model(o.model);
  const bool mapped = std::filesystem::is_directory(o.model.model);
  if (mapped) touch_pages(m.weights);
  report.huge_page_fraction = huge_page_fraction(m.weights);
  report.model = m.label + ", layer " + std::to_string(m.layer) + ", " + std::string(dtype_name(m.dtype)) + " weights";
  for (const std::string& n : m.notes) report.model += "\nnote: " + n;
  report.layer_bytes = m.config.layer_weight_bytes_of(m.weights.num_local_experts(), m.dtype);
  report.method = "device time (workers' timestamps around the call, host enqueue not counted), median of " +
                  std::to_string(o.repeats) + " repetitions after " + std::to_string(o.warmup) +
                  " warm-up (and " + std::to_string(o.settle_ms) + " ms of untimed calls first), a new input each "
                  "repetition, schedules interleaved, " +
                  (o.evict_mib > 0 ? "caches evicted by the workers before every call (" + std::to_string(o.evict_mib) +
                                         " MiB sweep" + (report.sweep_measures ? ", timed: the read bandwidth of the moment)" : ")")
                                   : "caches NOT evicted (--evict-mib 0): weights may be read from cache") +
                  (mapped ? ", checkpoint pages mapped once before timing (a serving process's steady state)" : "") +
                  (report.huge_page_fraction >= 0
                       ? ", " + std::to_string(std::lround(100 * report.huge_page_fraction)) + "% of the weights' pages 2 MiB"
                       : "");
  // Even a fifth of the pages in 4 KiB costs one worker about 5% here (78% in 2 MiB pages: 84-86% of the
  // bandwidth at 1-16 tokens against 89-91% after --reread), so the note comes well before half.
  if (mapped && report.huge_page_fraction >= 0 && report.huge_page_fraction < 0.9)
    report.model += "\nnote: the page cache holds " + std::to_string(std::lround(100 * (1 - report.huge_page_fraction))) +
                    "% of this checkpoint's weight pages in 4 KiB pages (as small writes, or pages reclaimed and read "
                    "back, leave a file): each is a TLB miss and a stop for the hardware prefetchers (all of them in "
                    "4 KiB pages make one worker decode about 10% slower here, a fifth about 5%); --reread drops the "
                    "cached pages and reads the file anew in 2 MiB pages";
  const int64_t max_tokens = std::max<int64_t>(1, *std::max_element(token_counts.begin(), token_counts.end()));
  LayerOptions lo{.max_tokens = max_tokens,
                  .policy = o.no_policy ? OverlapPolicy::always() : OverlapPolicy::from_env(),
                  .isa = isa,
                  .tuning = std::move(tuning)};
  MoeLayer layer(m.config, m.weights, *dev, lo);
  rt::Stream main = rt::current_stream(*dev);
  std::vector<float> y(static_cast<size_t>(max_tokens * m.config.hidden));
  std::vector<float> xbuf(y.size());  // graph mode replays read the captured input buffer
  settle(layer, main, timer, variants, token_counts.front(), m.config.hidden, y.data(), o);
  // The kernels' peak, probed again after each token count (the best of the run is the denominator).
  double best_peak = report.machine.kernel_peak_gflops(m.dtype);
  for (int64_t t : token_counts) {
    std::vector<Samples> samples(variants.size());
    std::vector<double> sweep_gbps;  // the bandwidth of the moment, before each timed call
    std::vector<LayerGraph> graphs(variants.size());
    for (size_t vi = 0; vi < variants.size(); ++vi)
      if (variants[vi].graph) graphs[vi] = layer.capture(xbuf.data(), t, y.data(), {.schedule = variants[vi].schedule});
    std::vector<double> bytes, flops, experts;
    for (int r = 0; r < o.warmup + o.repeats; ++r) {
      const std::vector<float> x = random_activations(t, m.config.hidden, o.model.seed * 7919 + 1000 * r + t);
      if (r >= o.warmup) {
        const ForwardCost c = forward_cost(m.config, m.weights, x.data(), t);
        bytes.push_back(static_cast<double>(c.weight_bytes));
        flops.push_back(c.flops);
        experts.push_back(static_cast<double>(c.active_experts));
      }
      std::copy(x.begin(), x.end(), xbuf.begin());
      for (size_t k = 0; k < variants.size(); ++k) {
        const size_t si = (k + static_cast<size_t>(r)) % variants.size();  // rotate the order per repetition
        timer.begin(main);
        const auto t0 = std::chrono::steady_clock::now();
        if (variants[si].graph) layer.replay(graphs[si], xbuf.data(), t, y.data());
        else layer.forward(x.data(), t, y.data(), {.schedule = variants[si].schedule});
        const auto t1 = std::chrono::steady_clock::now();
        timer.end(main);
        main.synchronize();
        if (r >= o.warmup) {
          const double g = timer.us() > 0 ? timer.sweep_gbps() : 0;
          if (g > 0) sweep_gbps.push_back(g);
          samples[si].calls.push_back({.us = timer.us(), .bytes = static_cast<int64_t>(bytes.back()), .sweep_gbps = g});
          samples[si].host_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
      }
    }
    // Without a measuring sweep (or when no sweep had every worker at once) the figure from the start stands.
    const double read_gbps = sweep_gbps.empty() ? report.machine.read_gbps : quantile(sweep_gbps, 0.5);
    const double read_spread =
        sweep_gbps.size() < 2 ? 0 : (quantile(sweep_gbps, 0.9) - quantile(sweep_gbps, 0.1)) / read_gbps;
    const std::vector<float> x = random_activations(t, m.config.hidden, o.model.seed + 99);
    const double shared_us = shared_alone_us(layer, *dev, x, t, y.data(), timer);
    const double med_bytes = quantile(bytes, 0.5), med_flops = quantile(flops, 0.5);
    size_t serial_si = variants.size();  // the last eager serial variant (a serial,serial A/B compares with it)
    for (size_t si = 0; si < variants.size(); ++si)
      if (variants[si].schedule == Schedule::kSerial && !variants[si].graph) serial_si = si;
    std::vector<VsSerial> vs_serial(variants.size());
    for (size_t si = 0; si < variants.size() && serial_si < variants.size(); ++si)
      vs_serial[si] = paired_with_serial(samples[serial_si], samples[si]);
    for (size_t si = 0; si < variants.size(); ++si) {
      BenchResult b;
      b.schedule = variants[si].name();
      b.effective = std::string(schedule_name(layer.effective_schedule({.schedule = variants[si].schedule}, t).schedule)) +
                    (variants[si].graph ? "+graph" : "");
      b.tokens = t;
      const std::vector<double> us = samples[si].us(), of_bw = samples[si].of_bw();
      b.median_us = quantile(us, 0.5);
      b.p10_us = quantile(us, 0.1);
      b.p90_us = quantile(us, 0.9);
      b.host_us = quantile(samples[si].host_us, 0.5);
      b.bytes = static_cast<int64_t>(med_bytes);
      b.active_experts = static_cast<int64_t>(quantile(experts, 0.5));
      b.gbps = b.median_us > 0 ? med_bytes / (b.median_us * 1e3) : 0;
      b.read_gbps = read_gbps;
      b.read_spread = read_spread;
      b.read_calls = static_cast<int>(sweep_gbps.size());
      // Each call against the bandwidth of its own moment (the mode can change within a token count).
      b.bandwidth_fraction = !of_bw.empty() ? quantile(of_bw, 0.5)
                             : read_gbps > 0           ? b.gbps / read_gbps
                                                       : 0;
      b.gflops = b.median_us > 0 ? med_flops / (b.median_us * 1e3) : 0;
      b.speedup_vs_serial = vs_serial[si].speedup;
      b.shared_alone_us = shared_us;
      b.hidden_fraction = shared_us > 0 ? vs_serial[si].saved_us / shared_us : 0;
      b.calls = std::move(samples[si].calls);
      report.results.push_back(std::move(b));
    }
    if (isatty(STDERR_FILENO)) std::fprintf(stderr, "  %lld tokens done\n", static_cast<long long>(t));
    best_peak = std::max(best_peak, measure_kernel_peak_gflops(report.machine, m.dtype));
  }
  // Against the best the memory delivered in the run: the start probe or any sweep that measured.
  report.best_read_gbps = std::max(report.machine.read_gbps, timer.best_sweep_gbps());
  report.best_peak_gflops = best_peak;
  for (BenchResult& b : report.results) {
    b.best_fraction = report.best_read_gbps > 0 ? b.gbps / report.best_read_gbps : 0;
    b.peak_fraction = best_peak > 0 ? b.gflops / best_peak : 0;
  }
  report.peak_rss_bytes = peak_rss_bytes();
  // All the outputs or none: a failure writing one removes those written before it.
  OutputBatch outputs;
  if (!o.json.empty()) write_file_atomically(o.json, bench_json(report).dump(1));
  if (!o.svg.empty()) write_bench_svg(report, o.svg);
  if (!o.tune.empty()) write_tuning_file(o.tune, report);
  outputs.commit();
  std::fputs(bench_table(report).c_str(), stdout);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "latency of each schedule over token counts, against the roofline");
  cmd->footer(
      "Fractions of the read bandwidth: of_bw is each call's GB/s over the timed sweep just before it (the bandwidth "
      "of the moment, read_now), of_best the GB/s over the best read of the whole run (the start probe and every "
      "sweep). of_bw can read near 100% in a moment when the whole machine is slow; of_best cannot be raised by a "
      "slow moment. Both use the read loop the machine line names (--read-isa; default the widest this CPU has: a "
      "narrower loop reads slower than memory delivers and raises both). See docs/benchmarking.md.");
  add_model_options(cmd, o->model);
  add_isa_option(cmd, o->model);
  add_tuning_option(cmd, o->model);
  cmd->add_option("--tokens", o->tokens, "token counts")->capture_default_str();
  cmd->add_option("--schedules", o->schedules, "schedules to compare (serial first is clearest)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "worker threads (default: one per core)");
  cmd->add_option("--repeats", o->repeats, "timed repetitions per token count")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed repetitions per token count")->capture_default_str();
  cmd->add_option("--settle-ms", o->settle_ms,
                  "untimed calls before the first token count, ms: a VM that hands freed memory back to the host "
                  "slows the calls of the next few seconds")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  cmd->add_option("--evict-mib", o->evict_mib,
                  "cache-evicting sweep before every call, MiB (0: off); from 128 MiB it is timed, and of_bw is each "
                  "call's GB/s over its sweep's (the bandwidth of the moment), of_best GB/s over the best probe or "
                  "sweep of the run")
      ->capture_default_str();
  cmd->add_option("--read-isa", o->read_isa,
                  "read loop of the bandwidth probe and the sweeps: scalar, avx2 or avx512 (default: the widest this "
                  "CPU has; a narrower loop can read slower than memory delivers and overstate of_bw)");
  cmd->add_flag("--graph", o->graph, "also time each schedule as a captured graph, replayed (host overhead saved)");
  cmd->add_flag("--no-policy", o->no_policy, "run exactly the requested schedules (ignore the token threshold etc.)");
  cmd->add_option("--json", o->json, "write the results as JSON");
  cmd->add_option("--svg", o->svg, "write a plot of latency vs tokens");
  cmd->add_option("--tune", o->tune, "write the fastest schedule per token count: the table --schedule auto reads (under mpirun "
                  "write --tune=FILE: mpirun takes a separate --tune as its own option)");
  add_ep_options(cmd, o->ep,
                 "--tokens are per rank; prints latency, exchange and shared-expert time and the hidden share");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace moe::tools
