// `bench --ep N` under mpirun: per token count (tokens per rank) and schedule, the latency of an
// expert-parallel layer call (the slowest rank's, median over the repeats), the exchange's time alone and
// the shared expert's time alone (both read off traced serial calls), and how much of the shared expert the
// best overlapped schedule hid: (T_serial - T_best of dual and phased) / T_shared. With --graph each schedule
// is also timed as a replay of its captured forward (the whole layer, exchanges included, with no host work
// per operation); with --tune the fastest eager schedule per token count becomes the table of `auto`.
#include "bench_ep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "ep_launch.h"
#include "layer/moe_layer.h"
#include "machine.h"
#include "output_file.h"
#include "overlap_stats.h"
#include "tuning_file.h"

namespace moe::tools {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Row {
  int64_t tokens = 0;
  std::vector<std::pair<std::string, double>> latency_us;  // per schedule, slowest rank, median
  double exchange_us = 0, shared_us = 0, hidden = 0;
};

}  // namespace

void run_bench_ep(const BenchEpOptions& o) {
  std::unique_ptr<ep::Communicator> comm = join_ranks(o.ranks, o.timeout);
  on_every_rank(*comm, [&] {
    const int r = comm->rank(), n = comm->size();
    LoadedModel m = load_rank_share(o.model, *comm);
    const int64_t num_experts = m.config.num_experts;
    const int64_t max_tokens = *std::max_element(o.tokens.begin(), o.tokens.end());
    auto dev = rt::make_cpu_device(rank_device_options(*comm, o.threads));
    MoeLayer layer(m.config, m.weights, *dev,
                   {.max_tokens = std::max<int64_t>(max_tokens, 1),
                    .policy = OverlapPolicy::always(),
                    .isa = o.isa,
                    .tuning = o.tuning,
                    .comm = comm.get(),
                    .ep_mode = o.mode});
    rt::Stream main = rt::current_stream(*dev);
    const int64_t h = m.config.hidden;
    std::vector<Row> rows;
    for (int64_t t : o.tokens) {
      // Each rank its own tokens (seeded by rank), as under data-parallel attention.
      const std::vector<float> x = random_activations(t, h, o.model.seed + 1000 * static_cast<uint64_t>(r));
      std::vector<float> y(static_cast<size_t>(t * h));
      Row row{.tokens = t};
      for (Schedule s : o.schedules) {
        for (bool replay : {false, true}) {
          if (replay && !o.graph) continue;
          LayerGraph graph;
          if (replay) graph = layer.capture(x.data(), t, y.data(), {.schedule = s});
          std::vector<float> mine;
          for (int i = 0; i < o.warmup + o.repeats; ++i) {
            comm->allgather("");  // every rank starts the call together
            const auto t0 = std::chrono::steady_clock::now();
            if (replay) layer.replay(graph, x.data(), t, y.data());
            else layer.forward(x.data(), t, y.data(), {.schedule = s});
            main.synchronize();
            const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            if (i >= o.warmup) mine.push_back(static_cast<float>(us));
          }
          std::vector<float> all;
          comm->gather_floats(mine, all, 0);
          std::vector<double> slowest(static_cast<size_t>(o.repeats), 0.0);
          for (size_t k = 0; k < all.size(); ++k)
            slowest[k % slowest.size()] = std::max(slowest[k % slowest.size()], static_cast<double>(all[k]));
          row.latency_us.emplace_back(std::string(schedule_name(s)) + (replay ? "+graph" : ""), median(slowest));
        }
      }
      // Traced serial calls: the exchange's and the shared expert's own time on this rank.
      std::vector<double> exch, shared;
      for (int i = 0; i < 3; ++i) {
        comm->allgather("");
        dev->set_tracing(true);
        layer.forward(x.data(), t, y.data(), {.schedule = Schedule::kSerial});
        main.synchronize();
        dev->set_tracing(false);
        const OverlapStats st = overlap_stats(dev->take_trace());
        exch.push_back(st.exchange_us);
        shared.push_back(st.shared_us);
      }
      std::vector<float> figures = {static_cast<float>(median(exch)), static_cast<float>(median(shared))}, all;
      comm->gather_floats(figures, all, 0);
      for (size_t k = 0; k + 1 < all.size(); k += 2) {
        row.exchange_us = std::max(row.exchange_us, static_cast<double>(all[k]));
        row.shared_us = std::max(row.shared_us, static_cast<double>(all[k + 1]));
      }
      double serial = 0, best = 0;
      for (const auto& [name, us] : row.latency_us) {
        if (name == "serial") serial = us;
        if ((name == "dual" || name == "phased") && (best == 0 || us < best)) best = us;
      }
      row.hidden = row.shared_us > 0 && serial > 0 && best > 0 ? (serial - best) / row.shared_us : 0;
      rows.push_back(row);
    }
    if (r != 0) return;
    std::printf("%s, layer %lld, %d ranks (experts %lld-%lld each), %s exchange, %d workers per rank\n",
                m.label.c_str(), static_cast<long long>(m.layer), n, static_cast<long long>(num_experts / n),
                static_cast<long long>((num_experts + n - 1) / n), ep::exchange_mode_name(o.mode), dev->num_workers());
    std::printf("%8s", "tokens");
    for (const auto& [name, us] : rows.front().latency_us) std::printf(" %15s", (name + " us").c_str());
    std::printf(" %12s %10s %7s\n", "exchange us", "shared us", "hidden");
    nlohmann::json j = {{"model", m.label}, {"ranks", n}, {"mode", ep::exchange_mode_name(o.mode)}, {"rows", nlohmann::json::array()}};
    for (const Row& row : rows) {
      std::printf("%8lld", static_cast<long long>(row.tokens));
      nlohmann::json jr = {{"tokens_per_rank", row.tokens}, {"exchange_us", row.exchange_us},
                           {"shared_us", row.shared_us}, {"hidden", row.hidden}};
      for (const auto& [name, us] : row.latency_us) {
        std::printf(" %15.1f", us);
        jr["latency_us"][name] = us;
      }
      std::printf(" %12.1f %10.1f %6.0f%%\n", row.exchange_us, row.shared_us, 100 * row.hidden);
      j["rows"].push_back(jr);
    }
    OutputBatch outputs;  // the JSON and the tuning table, both or neither
    if (!o.json.empty()) write_file_atomically(o.json, j.dump(1));
    if (!o.tune.empty()) {
      // The fastest eager schedule per token count (auto and graph replays are not candidates).
      std::vector<TuningEntry> entries;
      for (const Row& row : rows) {
        double serial = 0;
        const std::pair<std::string, double>* best = nullptr;
        for (const auto& e : row.latency_us) {
          if (e.first == "serial") serial = e.second;
          if (e.first == "auto" || e.first.find("+graph") != std::string::npos) continue;
          if (best == nullptr || e.second < best->second) best = &e;
        }
        if (best) entries.push_back({row.tokens, best->first, serial > 0 ? serial / best->second : 0});
      }
      write_tuning_file(o.tune, m.label + " (expert parallel, " + std::to_string(n) + " ranks, " +
                                    ep::exchange_mode_name(o.mode) + " exchange)",
                        cpu_model(), dev->num_workers(), std::string(isa_name(o.isa)), entries);
    }
    outputs.commit();
  });
}

}  // namespace moe::tools
