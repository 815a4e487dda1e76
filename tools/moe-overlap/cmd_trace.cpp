// `moe-overlap trace`: one forward with tracing on. Writes Chrome trace JSON (Perfetto, chrome://tracing) and
// optionally an SVG timeline: one lane per stream and per worker, operations as labelled boxes, event waits
// as arrows: the orchestration diagram of the schedule, drawn from a real run. Under mpirun with --ep N,
// every rank traces its own call and rank 0 writes them into one file: a process per rank.
#include <algorithm>
#include <cstdio>
#include <set>

#include "commands.h"
#include "ep_launch.h"
#include "layer/moe_layer.h"
#include "model_source.h"
#include "output_file.h"
#include "tuning_file.h"
#include "overlap_stats.h"
#include "trace_export.h"

namespace moe::tools {

namespace {

struct TraceOptions {
  ModelOptions model;
  int64_t tokens = 1;
  std::string schedule = "dual", out = "trace.json", svg;
  int threads = 0;
  bool prefill = false, graph = false;
  EpOptions ep;
};

void print_stats(const std::string& who, const rt::Trace& trace) {
  const OverlapStats s = overlap_stats(trace);
  std::set<int> streams;
  for (const rt::OpRecord& r : trace.ops) streams.insert(r.stream_id);
  std::printf("  %s%zu operations on %zu %s; forward %.1f us; shared branch busy %.1f us, routed path busy "
              "%.1f us, both at once %.1f us%s\n",
              who.c_str(), trace.ops.size(), streams.size(), streams.size() == 1 ? "stream" : "streams", s.span_us,
              s.shared_us, s.routed_us, s.concurrent_us,
              s.exchange_us > 0 ? (", exchanges " + std::to_string(static_cast<int>(s.exchange_us + 0.5)) + " us").c_str() : "");
}

int64_t first_enqueue(const rt::Trace& t) {
  int64_t first = INT64_MAX;
  for (const rt::OpRecord& op : t.ops) first = std::min(first, op.enqueue_ns);
  return first == INT64_MAX ? 0 : first;
}

// One process (comm null), or one rank of an expert-parallel job: each rank traces one call of its own tokens
// (seeded by rank, as in bench --ep) and rank 0 merges the traces. Each rank's times are moved onto rank 0's
// by aligning the first enqueue of the traced call, which every rank makes right after a barrier: the ranks
// line up to within that barrier's skew.
void trace_call(const TraceOptions& o, ep::Communicator* comm) {
  const int r = comm ? comm->rank() : 0, n = comm ? comm->size() : 1;
  const Isa isa = kernel_isa(o.model.isa);
  const Schedule schedule = parse_schedule(o.schedule);
  const ep::ExchangeMode mode = o.ep.exchange_mode();
  LoadedModel m = comm ? load_rank_share(o.model, *comm) : load_model(o.model);
  if (comm)
    ep::check_agreement(*comm, {{"--model", o.model.model},
                                {"--layer", std::to_string(m.layer)},
                                {"--tokens", std::to_string(o.tokens)},
                                {"--schedule", o.schedule},
                                {"--ep-mode", ep::exchange_mode_name(mode)},
                                {"--isa", std::string(isa_name(isa))},
                                {"--graph", o.graph ? "on" : "off"}});
  const std::vector<float> x = random_activations(o.tokens, m.config.hidden, o.model.seed + 1000 * static_cast<uint64_t>(r));
  std::vector<float> y(x.size());
  auto dev = rt::make_cpu_device(comm ? rank_device_options(*comm, o.threads) : rt::CpuDeviceOptions{.num_workers = o.threads});
  MoeLayer layer(m.config, m.weights, *dev,
                 {.max_tokens = std::max<int64_t>(o.tokens, 1),
                  .policy = OverlapPolicy::from_env(),
                  .isa = isa,
                  .tuning = read_tuning_file(o.model.tuning),
                  .comm = comm,
                  .ep_mode = mode});
  const ForwardOptions fo{.schedule = schedule, .prefill = o.prefill};
  rt::Stream main = rt::current_stream(*dev);
  LayerGraph graph;
  if (o.graph) graph = layer.capture(x.data(), o.tokens, y.data(), fo);
  auto call = [&] {
    if (o.graph) layer.replay(graph, x.data(), o.tokens, y.data());
    else layer.forward(x.data(), o.tokens, y.data(), fo);
    main.synchronize();
  };
  call();  // warm-up: first touch of workspaces and weights
  if (comm) comm->allgather("");  // every rank enqueues its traced call right after this barrier
  dev->set_tracing(true);
  call();
  dev->set_tracing(false);
  std::vector<TracePart> parts;
  if (comm) {
    const std::vector<std::string> texts = comm->allgather(serialize_trace(dev->take_trace()));
    if (r != 0) return;
    for (int k = 0; k < n; ++k) parts.push_back({"rank " + std::to_string(k), parse_trace(texts[static_cast<size_t>(k)])});
    const int64_t t0 = first_enqueue(parts[0].trace);
    for (TracePart& p : parts) shift_trace(p.trace, t0 - first_enqueue(p.trace));
  } else {
    parts.push_back({"", dev->take_trace()});
  }
  const ScheduleDecision d = layer.effective_schedule(fo, o.tokens);
  const std::string title =
      m.label + ", layer " + std::to_string(m.layer) + ", " +
      (comm ? std::to_string(n) + " ranks x " : "") + std::to_string(o.tokens) + " tokens, schedule " +
      std::string(schedule_name(d.schedule)) + (o.graph ? " (graph replay)" : "") + ", " +
      (comm ? std::string(ep::exchange_mode_name(mode)) + " exchange, " : "") + std::to_string(dev->num_workers()) +
      (comm ? " workers per rank" : " workers");
  OutputBatch outputs;  // both files or neither
  write_chrome_trace(parts, o.out);
  if (!o.svg.empty()) write_timeline_svg(parts, title, o.svg);
  outputs.commit();
  std::printf("%s\n", title.c_str());
  if (!d.reason.empty()) std::printf("note: %s\n", d.reason.c_str());
  for (const TracePart& p : parts) print_stats(p.label.empty() ? "" : p.label + ": ", p.trace);
  std::printf("  wrote %s%s%s\n", o.out.c_str(), o.svg.empty() ? "" : " and ", o.svg.c_str());
}

void run_trace(const TraceOptions& o) {
  check_output_paths({{"--out", o.out}, {"--svg", o.svg}});  // before the work, not after it
  if (o.ep.ranks == 0) return trace_call(o, nullptr);
  std::unique_ptr<ep::Communicator> comm = join_ranks(o.ep.ranks, std::chrono::milliseconds(o.ep.timeout_ms));
  on_every_rank(*comm, [&] { trace_call(o, comm.get()); });
}

}  // namespace

void add_trace_command(CLI::App& app) {
  auto o = std::make_shared<TraceOptions>();
  CLI::App* cmd = app.add_subcommand("trace", "trace one forward: Chrome trace JSON and an SVG timeline");
  add_model_options(cmd, o->model);
  add_isa_option(cmd, o->model);
  add_tuning_option(cmd, o->model);
  cmd->add_option("--tokens", o->tokens, "tokens in the forward")->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  add_schedule_option(cmd, o->schedule);
  cmd->add_option("--out", o->out, "Chrome trace JSON output")->capture_default_str();
  cmd->add_option("--svg", o->svg, "SVG timeline output");
  cmd->add_option("--threads", o->threads, "worker threads (default: one per core)");
  cmd->add_flag("--prefill", o->prefill, "mark the call as prefill");
  cmd->add_flag("--graph", o->graph, "trace a replay of the captured forward instead of an eager call");
  add_ep_options(cmd, o->ep, "each rank traces its own --tokens; rank 0 writes one file, a process per rank");
  cmd->callback([o] { run_trace(*o); });
}

}  // namespace moe::tools
