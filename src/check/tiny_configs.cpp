#include "check/tiny_configs.h"

namespace moe {

namespace {

MoeConfig tiny(const std::string& type, int size, int64_t experts, int64_t k, bool shared) {
  MoeConfig c = family_defaults(type);
  c.hidden = 32 * size;
  c.moe_intermediate = 16 * size;
  c.shared_intermediate = shared ? 24 * size : 0;
  c.num_experts = experts;
  c.top_k = k;
  return c;
}

MoeConfig grouped(MoeConfig c, int64_t n_group, int64_t topk_group, float scale) {
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.routed_scaling_factor = scale;
  return c;
}

}  // namespace

std::vector<TinyConfig> tiny_configs(int size) {
  std::vector<TinyConfig> v;
  v.push_back({"qwen2_moe", tiny("qwen2_moe", size, 16, 4, true)});
  v.push_back({"qwen3_moe", tiny("qwen3_moe", size, 16, 8, false)});
  v.push_back({"qwen3_next", tiny("qwen3_next", size, 32, 10, true)});
  v.push_back({"deepseek_v2_greedy", tiny("deepseek_v2", size, 16, 6, true)});
  MoeConfig v2 = grouped(tiny("deepseek_v2", size, 16, 6, true), 8, 3, 16.0f);
  v2.topk_method = TopkMethod::kGroupLimitedGreedy;
  v.push_back({"deepseek_v2_group_limited", v2});
  v.push_back({"deepseek_v3", grouped(tiny("deepseek_v3", size, 16, 8, true), 8, 4, 2.5f)});
  v.push_back({"deepseek_v32", grouped(tiny("deepseek_v32", size, 16, 8, true), 8, 4, 2.5f)});
  v.push_back({"kimi_k2", grouped(tiny("kimi_k2", size, 24, 8, true), 1, 1, 2.827f)});
  v.push_back({"glm4_moe", grouped(tiny("glm4_moe", size, 16, 8, true), 1, 1, 1.0f)});
  v.push_back({"glm_moe_dsa", grouped(tiny("glm_moe_dsa", size, 16, 8, true), 1, 1, 2.5f)});
  return v;
}

MoeConfig with_int4(MoeConfig c, int64_t group_size, bool shared_int4) {
  c.fp8 = false;
  c.int4 = true;
  c.int4_group_size = group_size;
  c.int4_shared = shared_int4;
  return c;
}

std::vector<TinyConfig> tiny_int4_configs() {
  std::vector<TinyConfig> v;
  for (const TinyConfig& t : tiny_configs(2)) {
    MoeConfig c = t.config;
    if (t.name == "deepseek_v3") c.shared_intermediate = c.moe_intermediate;  // n_shared_experts = 1
    if (t.name == "qwen3_next" || t.name == "deepseek_v3") v.push_back({t.name + "_int4", with_int4(c)});
  }
  for (const TinyConfig& t : tiny_configs(4)) {
    MoeConfig c = t.config;
    c.shared_intermediate = c.moe_intermediate;
    if (t.name == "kimi_k2") v.push_back({"kimi_k2_int4_shared", with_int4(c, 32, true)});
  }
  return v;
}

}  // namespace moe
