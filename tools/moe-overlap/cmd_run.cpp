// `moe-overlap run`: one forward of one layer on an input (a file or seeded random tokens); writes the
// output as [tokens, hidden] float32 .npy (or .safetensors). On any error: one line, non-zero exit, no file.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "ep_launch.h"
#include "io/npy.h"
#include "layer/moe_layer.h"
#include "model_source.h"
#include "tuning_file.h"

namespace moe::tools {

namespace {

struct RunOptions {
  ModelOptions model;
  int64_t tokens = 1;
  std::string input, output, schedule = "dual";
  int threads = 0;
  bool prefill = false, graph = false;
  EpOptions ep;
};

// --input's rows (rows set to their count), or `rows` seeded random ones.
std::vector<float> input_rows(const RunOptions& o, int64_t h, int64_t& rows) {
  if (o.input.empty()) return random_activations(rows, h, o.model.seed);
  FloatArray a = read_activations(o.input);
  if (a.shape.size() != 2 || a.shape[1] != h)
    throw std::invalid_argument("--input " + o.input + ": expected shape [tokens, " + std::to_string(h) + "]");
  rows = a.shape[0];
  return std::move(a.values);
}

// One forward, eager or captured and replayed (what a serving engine does per token-count bucket), waited
// for; its wall time in us.
double timed_forward(MoeLayer& layer, rt::Device& dev, const std::vector<float>& x, int64_t tokens,
                     std::vector<float>& y, const ForwardOptions& fo, bool graph) {
  const auto t0 = std::chrono::steady_clock::now();
  if (graph) {
    const LayerGraph g = layer.capture(x.data(), tokens, y.data(), fo);
    layer.replay(g, x.data(), tokens, y.data());
  } else {
    layer.forward(x.data(), tokens, y.data(), fo);
  }
  rt::current_stream(dev).synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void check_finite(const std::vector<float>& y, int64_t h, const std::string& where) {
  for (size_t i = 0; i < y.size(); ++i)
    if (!std::isfinite(y[i]))
      throw std::runtime_error("output has a non-finite value at token " + std::to_string(i / static_cast<size_t>(h)) +
                               ", column " + std::to_string(i % static_cast<size_t>(h)) + where + " (check the weights)");
}

// Under mpirun: rank r takes rows [r * T, (r + 1) * T) of the input, maps its share of the experts, runs the
// layer with the others and rank 0 writes every row in order: the one-process output, bit for bit.
void run_expert_parallel(const RunOptions& o) {
  std::unique_ptr<ep::Communicator> comm = join_ranks(o.ep.ranks, std::chrono::milliseconds(o.ep.timeout_ms));
  on_every_rank(*comm, [&] {
    const int r = comm->rank(), n = comm->size();
    const Isa isa = kernel_isa(o.model.isa);
    const Schedule schedule = parse_schedule(o.schedule);
    const ep::ExchangeMode mode = o.ep.exchange_mode();
    LoadedModel m = load_rank_share(o.model, *comm);
    const int64_t num_experts = m.config.num_experts;
    const int64_t h = m.config.hidden;
    int64_t rows = o.tokens * n;
    const std::vector<float> all = input_rows(o, h, rows);
    if (rows % n != 0)
      throw std::invalid_argument("--input " + o.input + ": " + std::to_string(rows) + " rows do not split over --ep " +
                                  std::to_string(n) + " ranks (rows must be a multiple of the rank count)");
    const int64_t t = rows / n;
    ep::check_agreement(*comm, {{"--model", o.model.model},
                                {"--layer", std::to_string(m.layer)},
                                {"tokens per rank", std::to_string(t)},
                                {"--schedule", o.schedule},
                                {"--ep-mode", ep::exchange_mode_name(mode)},
                                {"--isa", std::string(isa_name(isa))},
                                {"--graph", o.graph ? "on" : "off"}});
    const std::vector<float> x(all.begin() + r * t * h, all.begin() + (r + 1) * t * h);
    std::vector<float> y(x.size());
    auto dev = rt::make_cpu_device(rank_device_options(*comm, o.threads));
    MoeLayer layer(m.config, m.weights, *dev,
                   {.max_tokens = std::max<int64_t>(t, 1),
                    .policy = OverlapPolicy::from_env(),
                    .isa = isa,
                    .tuning = read_tuning_file(o.model.tuning),
                    .comm = comm.get(),
                    .ep_mode = mode});
    const ForwardOptions fo{.schedule = schedule, .prefill = o.prefill, .check_input = true};
    const double us = timed_forward(layer, *dev, x, t, y, fo, o.graph);
    check_finite(y, h, " on rank " + std::to_string(r));
    std::vector<float> out;
    comm->gather_floats(y, out, 0);
    if (r != 0) return;
    if (!o.output.empty()) write_activations(o.output, out.data(), {rows, h});
    std::printf("%s, layer %lld: %lld tokens on %d ranks (%lld each), experts split %lld-%lld per rank, schedule %s, "
                "%s exchange%s, %d workers per rank: rank 0 %.1f us%s%s\n",
                m.label.c_str(), static_cast<long long>(m.layer), static_cast<long long>(rows), n,
                static_cast<long long>(t), static_cast<long long>(num_experts / n),
                static_cast<long long>((num_experts + n - 1) / n), std::string(schedule_name(schedule)).c_str(),
                ep::exchange_mode_name(mode), o.graph ? ", graph replay" : "", dev->num_workers(), us,
                o.output.empty() ? "" : ", written to ", o.output.c_str());
  });
}

void run_run(const RunOptions& o) {
  if (o.ep.ranks > 0) return run_expert_parallel(o);
  const Isa isa = kernel_isa(o.model.isa);
  const Schedule schedule = parse_schedule(o.schedule);
  LoadedModel m = load_model(o.model);
  const int64_t h = m.config.hidden;
  int64_t tokens = o.tokens;
  const std::vector<float> x = input_rows(o, h, tokens);
  std::vector<float> y(static_cast<size_t>(tokens * h));
  auto dev = rt::make_cpu_device({.num_workers = o.threads});
  MoeLayer layer(m.config, m.weights, *dev,
                 {.max_tokens = std::max<int64_t>(tokens, 1),
                  .policy = OverlapPolicy::from_env(),
                  .isa = isa,
                  .tuning = read_tuning_file(o.model.tuning)});
  const ForwardOptions fo{.schedule = schedule, .prefill = o.prefill, .check_input = true};
  const ScheduleDecision d = layer.effective_schedule(fo, tokens);
  const double us = timed_forward(layer, *dev, x, tokens, y, fo, o.graph);
  check_finite(y, h, "");
  if (!o.output.empty()) write_activations(o.output, y.data(), {tokens, h});
  double sq = 0;
  for (float v : y) sq += static_cast<double>(v) * v;
  std::printf("%s, layer %lld: %lld tokens, schedule %s%s%s, %d workers: %.1f us, output rms %.6g%s%s\n",
              m.label.c_str(), static_cast<long long>(m.layer), static_cast<long long>(tokens),
              std::string(schedule_name(d.schedule)).c_str(), o.graph ? " (graph replay)" : "", d.reason.empty() ? "" : (" (" + d.reason + ")").c_str(),
              dev->num_workers(), us, y.empty() ? 0.0 : std::sqrt(sq / static_cast<double>(y.size())),
              o.output.empty() ? "" : ", written to ", o.output.c_str());
  for (const std::string& n : m.notes) std::printf("note: %s\n", n.c_str());
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "run one forward of a layer and write its output");
  add_model_options(cmd, o->model);
  add_isa_option(cmd, o->model);
  add_tuning_option(cmd, o->model);
  auto* tokens = cmd->add_option("--tokens", o->tokens, "random input tokens (seeded by --seed)")
                     ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
                     ->capture_default_str();
  cmd->add_option("--input", o->input, "input activations [tokens, hidden] float32 .npy or .safetensors")
      ->check(CLI::ExistingFile)
      ->excludes(tokens);
  cmd->add_option("--output", o->output, "write the output [tokens, hidden] float32 here (.npy or .safetensors)");
  add_schedule_option(cmd, o->schedule);
  cmd->add_option("--threads", o->threads, "worker threads (default: one per core)");
  cmd->add_flag("--prefill", o->prefill, "mark the call as prefill (stays serial under the decode-only policy)");
  cmd->add_flag("--graph", o->graph, "capture the forward as a graph and replay it");
  add_ep_options(cmd, o->ep,
                 "each rank maps 1/N of the experts and takes 1/N of the input rows; rank 0 writes the output");
  cmd->callback([o] { run_run(*o); });
}

}  // namespace moe::tools
