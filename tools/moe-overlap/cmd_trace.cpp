// `moe-overlap trace`: one forward with tracing on. Writes Chrome trace JSON (Perfetto, chrome://tracing) and
// optionally an SVG timeline: one lane per stream and per worker, operations as labelled boxes, event waits
// as arrows: the orchestration diagram of the schedule, drawn from a real run.
#include <cstdio>
#include <set>

#include "commands.h"
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
};

void run_trace(const TraceOptions& o) {
  check_output_paths({{"--out", o.out}, {"--svg", o.svg}});  // before the work, not after it
  const Isa isa = kernel_isa(o.model.isa);
  const Schedule schedule = parse_schedule(o.schedule);
  LoadedModel m = load_model(o.model);
  const std::vector<float> x = random_activations(o.tokens, m.config.hidden, o.model.seed);
  std::vector<float> y(x.size());
  auto dev = rt::make_cpu_device({.num_workers = o.threads});
  MoeLayer layer(m.config, m.weights, *dev,
                 {.max_tokens = std::max<int64_t>(o.tokens, 1),
                  .policy = OverlapPolicy::from_env(),
                  .isa = isa,
                  .tuning = read_tuning_file(o.model.tuning)});
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
  dev->set_tracing(true);
  call();
  dev->set_tracing(false);
  const rt::Trace trace = dev->take_trace();
  const ScheduleDecision d = layer.effective_schedule(fo, o.tokens);
  const std::string title = m.label + ", layer " + std::to_string(m.layer) + ", " + std::to_string(o.tokens) +
                            " tokens, schedule " + std::string(schedule_name(d.schedule)) + (o.graph ? " (graph replay)" : "") + ", " +
                            std::to_string(dev->num_workers()) + " workers";
  OutputBatch outputs;  // both files or neither
  write_chrome_trace(trace, o.out);
  if (!o.svg.empty()) write_timeline_svg(trace, title, o.svg);
  outputs.commit();
  const OverlapStats s = overlap_stats(trace);
  std::printf("%s\n", title.c_str());
  if (!d.reason.empty()) std::printf("note: %s\n", d.reason.c_str());
  std::set<int> streams;
  for (const rt::OpRecord& r : trace.ops) streams.insert(r.stream_id);
  std::printf("  %zu operations on %zu %s; forward %.1f us; shared branch busy %.1f us, routed path busy "
              "%.1f us, both at once %.1f us\n",
              trace.ops.size(), streams.size(), streams.size() == 1 ? "stream" : "streams", s.span_us, s.shared_us,
              s.routed_us, s.concurrent_us);
  std::printf("  wrote %s%s%s\n", o.out.c_str(), o.svg.empty() ? "" : " and ", o.svg.c_str());
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
  cmd->callback([o] { run_trace(*o); });
}

}  // namespace moe::tools
