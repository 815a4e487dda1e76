#include "model/config.h"

#include <algorithm>

#include "kernels/dtype.h"

namespace moe {

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw ConfigError("config field '" + field + "': " + what);
}

const char* const kModelTypes[] = {"qwen2_moe",    "qwen3_moe", "qwen3_next", "deepseek_v2", "deepseek_v3",
                                   "deepseek_v32", "kimi_k2",   "glm4_moe",   "glm_moe_dsa"};

}  // namespace

MoeConfig family_defaults(const std::string& model_type) {
  MoeConfig c;
  c.model_type = model_type;
  if (model_type == "qwen2_moe" || model_type == "qwen3_next") {
    c.shared_expert_gate = true;
    c.norm_topk_prob = model_type == "qwen3_next";
  } else if (model_type == "qwen3_moe") {
    c.norm_topk_prob = true;
  } else if (model_type == "deepseek_v2") {
    c.topk_method = TopkMethod::kGreedy;
  } else if (model_type == "deepseek_v3" || model_type == "deepseek_v32" || model_type == "kimi_k2" ||
             model_type == "glm4_moe" || model_type == "glm_moe_dsa") {
    c.scoring = Scoring::kSigmoid;
    c.topk_method = TopkMethod::kNoauxTc;
    c.correction_bias = true;
    c.norm_topk_prob = true;
  } else {
    std::string known;
    for (const char* t : kModelTypes) known += std::string(known.empty() ? "" : ", ") + t;
    throw ConfigError("unknown model_type '" + model_type + "' (supported: " + known + ")");
  }
  return c;
}

bool MoeConfig::is_moe_layer(int64_t layer) const {
  if (layer < 0 || layer >= num_layers) return false;
  if (!mlp_layer_types.empty()) return mlp_layer_types[static_cast<size_t>(layer)] == "sparse";
  if (model_type.rfind("qwen", 0) == 0) {
    if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
    return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
  }
  return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
}

void MoeConfig::validate() const {
  family_defaults(model_type);  // throws for an unknown model type
  if (hidden <= 0) bad("hidden_size", "must be > 0, got " + std::to_string(hidden));
  if (moe_intermediate <= 0) bad("moe_intermediate_size", "must be > 0, got " + std::to_string(moe_intermediate));
  if (num_experts <= 0) bad("num_experts", "must be > 0, got " + std::to_string(num_experts));
  if (top_k <= 0 || top_k > num_experts)
    bad("num_experts_per_tok", "must be in [1, num_experts=" + std::to_string(num_experts) + "], got " +
                                   std::to_string(top_k));
  if (shared_intermediate < 0) bad("shared_expert_intermediate_size", "must be >= 0");
  if (shared_expert_gate && shared_intermediate == 0)
    bad("shared_expert_intermediate_size", "a shared-expert gate needs a shared expert (size > 0)");
  if (n_group <= 0) bad("n_group", "must be > 0, got " + std::to_string(n_group));
  if (num_experts % n_group != 0)
    bad("n_group", "num_experts=" + std::to_string(num_experts) + " is not divisible by n_group=" +
                       std::to_string(n_group));
  if (topk_group <= 0 || topk_group > n_group)
    bad("topk_group", "must be in [1, n_group=" + std::to_string(n_group) + "], got " + std::to_string(topk_group));
  if (topk_method != TopkMethod::kGreedy && n_group > 1 && top_k > topk_group * (num_experts / n_group))
    bad("num_experts_per_tok", "k=" + std::to_string(top_k) + " exceeds the experts of the kept groups (" +
                                   std::to_string(topk_group * (num_experts / n_group)) + ")");
  if (topk_method == TopkMethod::kNoauxTc && n_group > 1 && num_experts / n_group < 2)
    bad("n_group", "noaux_tc scores a group by its top two experts: need >= 2 experts per group");
  if (!(routed_scaling_factor > 0.0f)) bad("routed_scaling_factor", "must be > 0");
  if (num_layers <= 0) bad("num_hidden_layers", "must be > 0");
  if (decoder_sparse_step <= 0) bad("decoder_sparse_step", "must be > 0");
  if (moe_layer_freq <= 0) bad("moe_layer_freq", "must be > 0");
  if (!mlp_layer_types.empty() && static_cast<int64_t>(mlp_layer_types.size()) != num_layers)
    bad("mlp_layer_types", "has " + std::to_string(mlp_layer_types.size()) + " entries, num_hidden_layers is " +
                               std::to_string(num_layers));
  for (const auto& t : mlp_layer_types)
    if (t != "sparse" && t != "dense") bad("mlp_layer_types", "entries must be 'sparse' or 'dense', got '" + t + "'");
  if (int4) {
    const std::string g = "quantization_config.config_groups.weights.group_size";
    if (fp8) bad("quantization_config", "fp8 blocks and int4 groups at once");
    if (int4_group_size < 32 || (int4_group_size & (int4_group_size - 1)) != 0)
      bad(g, "must be a power of two >= 32 (whole int32 words per group, whole groups per SIMD block), got " +
                 std::to_string(int4_group_size));
    if (hidden % int4_group_size != 0)
      bad(g, std::to_string(int4_group_size) + " does not divide the rows of the down projection (hidden_size " +
                 std::to_string(hidden) + ")");
    if (moe_intermediate % int4_group_size != 0)
      bad(g, std::to_string(int4_group_size) + " does not divide the rows of the gate and up projections "
                 "(moe_intermediate_size " + std::to_string(moe_intermediate) + ")");
    if (int4_shared && !has_shared_expert()) bad("quantization_config", "int4 shared expert without a shared expert");
    if (int4_shared && shared_intermediate % int4_group_size != 0)
      bad(g, std::to_string(int4_group_size) + " does not divide the shared expert's width " +
                 std::to_string(shared_intermediate) + " (list it in quantization_config.ignore to keep it bf16)");
  }
  if (fp8 && (block_rows != 128 || block_cols != 128))
    bad("quantization_config.weight_block_size", "only [128, 128] is supported, got [" +
                                                     std::to_string(block_rows) + ", " + std::to_string(block_cols) + "]");
}

int64_t MoeConfig::layer_weight_bytes(int64_t num_local_experts, int64_t weight_dtype_size) const {
  const int64_t expert = 3 * hidden * moe_intermediate * weight_dtype_size;
  const int64_t shared = 3 * hidden * shared_intermediate * weight_dtype_size;
  const int64_t router = num_experts * hidden * 2 + (shared_expert_gate ? hidden * 2 : 0);
  return num_local_experts * expert + shared + router;
}

int64_t MoeConfig::layer_weight_bytes_of(int64_t num_local_experts, DType dtype) const {
  if (dtype != DType::kInt4) return layer_weight_bytes(num_local_experts, static_cast<int64_t>(dtype_size(dtype)));
  const auto int4_matrix = [&](int64_t rows, int64_t cols) { return rows * cols / 2 + rows * (cols / int4_group_size) * 2; };
  const int64_t expert = 2 * int4_matrix(moe_intermediate, hidden) + int4_matrix(hidden, moe_intermediate);
  const int64_t shared = int4_shared ? 2 * int4_matrix(shared_intermediate, hidden) + int4_matrix(hidden, shared_intermediate)
                                     : 3 * hidden * shared_intermediate * 2;
  const int64_t router = num_experts * hidden * 2 + (shared_expert_gate ? hidden * 2 : 0);
  return num_local_experts * expert + shared + router;
}

namespace {

MoeConfig sized(const std::string& type, int64_t layers, int64_t h, int64_t i, int64_t e, int64_t k, int64_t is) {
  MoeConfig c = family_defaults(type);
  c.num_layers = layers;
  c.hidden = h;
  c.moe_intermediate = i;
  c.num_experts = e;
  c.top_k = k;
  c.shared_intermediate = is;
  return c;
}

std::vector<Preset> make_presets() {
  std::vector<Preset> p;
  p.push_back({"qwen3-next-80b-a3b", "Qwen3-Next-80B-A3B", sized("qwen3_next", 48, 2048, 512, 512, 10, 512)});
  p.push_back({"qwen1.5-moe-a2.7b", "Qwen1.5-MoE-A2.7B", sized("qwen2_moe", 24, 2048, 1408, 60, 4, 5632)});
  p.push_back({"qwen3-30b-a3b", "Qwen3-30B-A3B (no shared expert)", sized("qwen3_moe", 48, 2048, 768, 128, 8, 0)});
  {
    MoeConfig c = sized("deepseek_v2", 27, 2048, 1408, 64, 6, 2816);
    c.first_k_dense_replace = 1;
    p.push_back({"deepseek-v2-lite", "DeepSeek-V2-Lite", c});
  }
  auto v3like = [](const std::string& type, int64_t layers, int64_t h, int64_t e, int64_t ng, int64_t tg, float s,
                   int64_t dense) {
    MoeConfig c = sized(type, layers, h, 2048, e, 8, 2048);
    c.n_group = ng;
    c.topk_group = tg;
    c.routed_scaling_factor = s;
    c.first_k_dense_replace = dense;
    return c;
  };
  p.push_back({"deepseek-v3", "DeepSeek-V3/R1 (fp8 128x128 blocks)", v3like("deepseek_v3", 61, 7168, 256, 8, 4, 2.5f, 3)});
  p.back().config.fp8 = true;
  p.push_back({"kimi-k2", "Kimi-K2 (fp8 128x128 blocks)", v3like("kimi_k2", 61, 7168, 384, 1, 1, 2.827f, 1)});
  p.back().config.fp8 = true;
  {
    MoeConfig c = v3like("glm4_moe", 46, 4096, 128, 1, 1, 1.0f, 1);
    c.moe_intermediate = 1408;
    c.shared_intermediate = 1408;
    p.push_back({"glm-4.5-air", "GLM-4.5-Air", c});
  }
  p.push_back({"glm-5", "GLM-5 (744B-A40B)", v3like("glm_moe_dsa", 78, 6144, 256, 1, 1, 2.5f, 3)});
  return p;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> kPresets = make_presets();
  return kPresets;
}

const Preset& find_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (p.name == name) return p;
  std::string known;
  for (const Preset& p : presets()) known += (known.empty() ? "" : ", ") + p.name;
  throw ConfigError("unknown preset '" + name + "' (presets: " + known + ")");
}

}  // namespace moe
