// What one forward of the layer costs in weight bytes read and floating-point work: the numbers benchmarks put
// next to the machine's bandwidth and peak.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace moe::tools {

struct ForwardCost {
  int64_t weight_bytes = 0;    // router + shared expert (+ gate) + every local expert that received a token
  double flops = 0;            // 2 per multiply-add: router, shared expert, routed rows
  int64_t active_experts = 0;  // local experts that received at least one token
};

// Routes x [tokens, H] on the host (the fast path's own router and top-k) to find which experts one forward
// reads; costs one router GEMM, so call it outside timed regions.
ForwardCost forward_cost(const MoeConfig& config, const LayerWeights& weights, const float* x, int64_t tokens);

// The cost of one decode token when all its k experts are local, from the config alone (bytes per weight
// element of `dtype`; fp8 adds its block scales, and the router is bf16 unless dtype is f32).
ForwardCost decode_token_cost(const MoeConfig& config, DType dtype);

}  // namespace moe::tools
