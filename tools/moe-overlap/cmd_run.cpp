// `moe-overlap run`: one forward of one layer on an input (a file or seeded random tokens); writes the
// output as [tokens, hidden] float32 .npy (or .safetensors). On any error: one line, non-zero exit, no file.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "commands.h"
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
};

void run_run(const RunOptions& o) {
  apply_kernel_isa(o.model.isa);
  const Schedule schedule = parse_schedule(o.schedule);
  LoadedModel m = load_model(o.model);
  const int64_t h = m.config.hidden;
  std::vector<float> x;
  int64_t tokens = o.tokens;
  if (!o.input.empty()) {
    FloatArray a = read_activations(o.input);
    if (a.shape.size() != 2 || a.shape[1] != h)
      throw std::invalid_argument("--input " + o.input + ": expected shape [tokens, " + std::to_string(h) + "]");
    tokens = a.shape[0];
    x = std::move(a.values);
  } else {
    x = random_activations(tokens, h, o.model.seed);
  }
  std::vector<float> y(static_cast<size_t>(tokens * h));
  auto dev = rt::make_cpu_device({.num_workers = o.threads});
  MoeLayer layer(m.config, m.weights, *dev,
                 {.max_tokens = std::max<int64_t>(tokens, 1),
                  .policy = OverlapPolicy::from_env(),
                  .tuning = read_tuning_file(o.model.tuning)});
  const ForwardOptions fo{.schedule = schedule, .prefill = o.prefill, .check_input = true};
  const ScheduleDecision d = layer.effective_schedule(fo, tokens);
  const auto t0 = std::chrono::steady_clock::now();
  if (o.graph) {  // capture once, then replay: what a serving engine does per token-count bucket
    const LayerGraph g = layer.capture(x.data(), tokens, y.data(), fo);
    layer.replay(g, x.data(), tokens, y.data());
  } else {
    layer.forward(x.data(), tokens, y.data(), fo);
  }
  rt::current_stream(*dev).synchronize();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < y.size(); ++i)
    if (!std::isfinite(y[i]))
      throw std::runtime_error("output has a non-finite value at token " + std::to_string(i / h) + ", column " +
                               std::to_string(i % h) + " (check the weights)");
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
  cmd->callback([o] { run_run(*o); });
}

}  // namespace moe::tools
