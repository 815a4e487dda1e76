// Scaled-down configurations of every family and routing variant (small H, I, E; the family's k, n_group,
// topk_group, scoring, renormalisation, scaling factor and shared-expert gate kept), so that tests and the
// check tool can cover every family in milliseconds.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace moe {

struct TinyConfig {
  std::string name;  // model_type, plus the routing variant where a family has two
  MoeConfig config;
};

// hidden, moe_intermediate and shared width are scaled by `size` (1: H=32, I=16, Is=24).
std::vector<TinyConfig> tiny_configs(int size = 1);

// `c` with int4 routed experts (compressed-tensors pack-quantized, groups of `group_size` columns), the
// shared expert int4 too when `shared_int4`, else bf16 (Kimi-K2-Thinking's choice).
MoeConfig with_int4(MoeConfig c, int64_t group_size = 32, bool shared_int4 = false);

// int4 variants whose widths hold whole groups of 32 (and whose config.json make_checkpoint can write):
// qwen3_next (H=64, I=32, bf16 shared Is=48), deepseek_v3 (H=64, I=Is=32, bf16 shared, expert groups) and
// kimi_k2 (H=128, I=Is=64, int4 shared).
std::vector<TinyConfig> tiny_int4_configs();

}  // namespace moe
