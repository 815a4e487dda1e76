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

}  // namespace moe
