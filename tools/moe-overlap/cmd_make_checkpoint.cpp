// `moe-overlap make-checkpoint`: a valid Hugging Face model directory (config.json, sharded safetensors with
// the family's real tensor names, seeded random weights) for any preset at any size. On any error, nothing of
// it appears: a new directory is not left behind, and one that held a checkpoint keeps it (write_checkpoint
// stages every file and commits with config.json last; an interrupted write leaves no directory that loads).
#include <cstdio>
#include <stdexcept>
#include <string>

#include "commands.h"
#include "io/make_checkpoint.h"
#include "model_source.h"

namespace moe::tools {

namespace {

struct MakeOptions {
  std::string preset = "qwen3-next-80b-a3b";
  std::string out;
  std::string dtype = "auto";
  uint64_t seed = 0;
  int64_t hidden = 0, intermediate = 0, experts = 0, shared = 0, top_k = 0;
  std::vector<int64_t> layers;
  double shard_mib = 4096;
  bool fused = false;
  int64_t group_size = 32;
  bool int4_shared = false;
};

void run_make(const MakeOptions& o) {
  if (!(o.shard_mib >= 0 && o.shard_mib <= 1 << 24))  // NaN included
    throw std::invalid_argument("--shard-mib: expected a size in MiB in [0, 16777216], got " + std::to_string(o.shard_mib));
  MoeConfig c = find_preset(o.preset).config;
  const double ratio_shared = c.moe_intermediate > 0 ? static_cast<double>(c.shared_intermediate) /
                                                           static_cast<double>(c.moe_intermediate)
                                                     : 0.0;
  if (o.hidden) c.hidden = o.hidden;
  if (o.intermediate) {
    c.moe_intermediate = o.intermediate;
    // A DeepSeek-style shared width is n_shared_experts x I: keep the ratio unless given.
    if (!o.shared) c.shared_intermediate = static_cast<int64_t>(ratio_shared * static_cast<double>(o.intermediate));
  }
  if (o.shared) c.shared_intermediate = o.shared;
  if (o.experts) c.num_experts = o.experts;
  if (o.top_k) c.top_k = o.top_k;
  if (c.n_group > 1 && c.num_experts % c.n_group != 0) c.n_group = c.topk_group = 1;
  const DType dtype = o.dtype == "int4" ? DType::kInt4 : preset_dtype(o.dtype, c);
  c.fp8 = dtype == DType::kF8E4M3;
  c.int4 = dtype == DType::kInt4;
  c.int4_group_size = o.group_size;
  c.int4_shared = c.int4 && o.int4_shared;
  if (!c.int4 && (o.group_size != 32 || o.int4_shared))
    throw std::invalid_argument("--group-size and --int4-shared apply to --dtype int4 only");
  c.validate();
  CheckpointOptions co;
  co.dtype = dtype;
  co.seed = o.seed;
  co.layers = o.layers;
  co.shard_bytes = static_cast<uint64_t>(o.shard_mib * 1024 * 1024);
  co.fused_experts = o.fused;
  write_checkpoint(o.out, c, co);
  std::printf("wrote %s: %s, H=%lld I=%lld E=%lld k=%lld Is=%lld, %s weights, seed %llu\n", o.out.c_str(),
              c.model_type.c_str(), static_cast<long long>(c.hidden), static_cast<long long>(c.moe_intermediate),
              static_cast<long long>(c.num_experts), static_cast<long long>(c.top_k),
              static_cast<long long>(c.shared_intermediate), std::string(dtype_name(dtype)).c_str(),
              static_cast<unsigned long long>(o.seed));
}

}  // namespace

void add_make_checkpoint_command(CLI::App& app) {
  auto o = std::make_shared<MakeOptions>();
  CLI::App* cmd = app.add_subcommand("make-checkpoint",
                                     "write a valid model directory (config.json + safetensors) with random weights");
  cmd->add_option("--preset", o->preset, "family and sizes to start from")->capture_default_str();
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--dtype", o->dtype,
                  "bf16, f32, fp8 or int4 (compressed-tensors pack-quantized routed experts; default: the preset's)")
      ->check(CLI::IsMember({"auto", "bf16", "f32", "fp8", "int4"}));
  cmd->add_option("--group-size", o->group_size, "int4: input columns per bf16 scale (a power of two >= 32)")
      ->capture_default_str();
  cmd->add_flag("--int4-shared", o->int4_shared, "int4: quantize the shared expert too (default: bf16, in ignore)");
  cmd->add_option("--seed", o->seed, "seed (the same seed gives the preset's weights)")->capture_default_str();
  cmd->add_option("--hidden", o->hidden, "override hidden_size");
  cmd->add_option("--intermediate", o->intermediate, "override moe_intermediate_size");
  cmd->add_option("--num-experts", o->experts, "override the number of routed experts");
  cmd->add_option("--shared", o->shared, "override the shared expert's width");
  cmd->add_option("--top-k", o->top_k, "override num_experts_per_tok");
  cmd->add_option("--layers", o->layers, "MoE layers to write (default: the first)")->delimiter(',');
  cmd->add_option("--shard-mib", o->shard_mib, "shard size in MiB")->capture_default_str();
  cmd->add_flag("--fused", o->fused, "transformers-v5 fused expert layout (experts.gate_up_proj, experts.down_proj)");
  cmd->callback([o] { run_make(*o); });
}

}  // namespace moe::tools
