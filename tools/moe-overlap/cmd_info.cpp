// `moe-overlap info`: the layer's shapes, its bytes, the bytes one decode token touches and the time that
// takes at this machine's measured bandwidth. Reads only the config (no weights are loaded or generated).
#include <cstdio>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "io/hf_config.h"
#include "layer_cost.h"
#include "machine.h"
#include "model_source.h"

namespace moe::tools {

namespace {

struct InfoOptions {
  ModelOptions model;
  int threads = 0;
};

const char* topk_method_name(TopkMethod m) {
  return m == TopkMethod::kGreedy ? "greedy" : m == TopkMethod::kGroupLimitedGreedy ? "group_limited_greedy" : "noaux_tc";
}

void run_info(const InfoOptions& o) {
  MoeConfig c;
  std::string label;
  DType dtype;
  if (std::filesystem::is_directory(o.model.model)) {
    c = load_hf_config(o.model.model);
    label = "checkpoint " + o.model.model;
    dtype = c.int4 ? DType::kInt4 : c.fp8 ? DType::kF8E4M3 : DType::kBF16;
  } else {
    const Preset& p = find_preset(o.model.model);
    c = p.config;
    label = "preset " + p.name + " (" + p.description + ")";
    dtype = preset_dtype(o.model.dtype, c);
  }
  const int64_t local = o.model.experts < 0 ? c.num_experts : std::min(o.model.experts, c.num_experts);
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  std::printf("%s\n", label.c_str());
  std::printf("  model_type            %s (%s scoring, %s top-k)\n", c.model_type.c_str(),
              c.scoring == Scoring::kSoftmax ? "softmax" : "sigmoid", topk_method_name(c.topk_method));
  std::printf("  hidden H              %lld\n", static_cast<long long>(c.hidden));
  char scale[32] = "";
  if (c.routed_scaling_factor != 1.0f) std::snprintf(scale, sizeof scale, ", scale %g", c.routed_scaling_factor);
  std::printf("  routed experts        %lld x SwiGLU [I=%lld], top-%lld%s%s\n", static_cast<long long>(c.num_experts),
              static_cast<long long>(c.moe_intermediate), static_cast<long long>(c.top_k),
              c.norm_topk_prob ? ", renormalised" : "", scale);
  if (c.n_group > 1)
    std::printf("  groups                %lld, keep %lld\n", static_cast<long long>(c.n_group),
                static_cast<long long>(c.topk_group));
  if (c.has_shared_expert())
    std::printf("  shared expert         SwiGLU [Is=%lld]%s\n", static_cast<long long>(c.shared_intermediate),
                c.shared_expert_gate ? ", scaled by sigmoid(x . w_shared_gate)" : ", ungated");
  else
    std::printf("  shared expert         none: every schedule runs serial\n");
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l) ? 1 : 0;
  std::printf("  MoE layers            %lld of %lld\n", static_cast<long long>(moe_layers),
              static_cast<long long>(c.num_layers));
  const double gib = 1024.0 * 1024.0 * 1024.0, mib = 1024.0 * 1024.0;
  std::printf("  weights dtype         %s\n", std::string(dtype_name(dtype)).c_str());
  std::printf("  layer weights         %.2f GiB (%lld of %lld experts)\n",
              static_cast<double>(c.layer_weight_bytes_of(local, dtype)) / gib, static_cast<long long>(local),
              static_cast<long long>(c.num_experts));
  const ForwardCost d = decode_token_cost(c, dtype);
  std::printf("  touched per decode    %.1f MiB, %.1f MFLOP (arithmetic intensity %.2f flop/byte)\n",
              static_cast<double>(d.weight_bytes) / mib, d.flops / 1e6, d.flops / static_cast<double>(d.weight_bytes));
  const MachineFigures m = cached_machine(threads);
  std::printf("  this machine          %s, %d threads: %.1f GB/s read, %.0f GFLOP/s fp32 FMA%s\n", m.cpu.c_str(),
              threads, m.read_gbps, m.fp32_gflops, m.cached ? " (cached)" : "");
  std::printf("  bandwidth-bound time  %.1f us per decode token and layer\n",
              static_cast<double>(d.weight_bytes) / (m.read_gbps * 1e3));
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand("info", "shapes, bytes per layer and per decode token, bandwidth-bound time");
  add_model_options(cmd, o->model);
  cmd->add_option("--threads", o->threads, "threads for the bandwidth figure (default: one per core)");
  cmd->callback([o] { run_info(*o); });
}

}  // namespace moe::tools
