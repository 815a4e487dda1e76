// "topk": per token, routing weights and expert ids [T, k] from the router logits (layer/routing.h).
#include "layer/ops/ops.h"
#include "layer/routing.h"

namespace moe::ops {

namespace {
constexpr int64_t kTokensPerTile = 4;
}

rt::Op make_topk_op(const Context& c) {
  const MoeConfig* cfg = c.config;
  const int64_t t = c.tokens, e = cfg->num_experts, k = cfg->top_k, s = routing_scratch_floats(*cfg);
  const float* bias = cfg->topk_method == TopkMethod::kNoauxTc ? c.weights->correction_bias : nullptr;
  const RoutedBuffers b = c.routed;
  rt::Op op{.name = "topk", .num_tiles = static_cast<int>((t + kTokensPerTile - 1) / kTokensPerTile)};
  op.tile = [=](int tile) {
    const int64_t t0 = tile * kTokensPerTile, t1 = t0 + kTokensPerTile < t ? t0 + kTokensPerTile : t;
    for (int64_t i = t0; i < t1; ++i)
      route_token(*cfg, bias, b.logits + i * e, b.route_scratch + i * s, b.topk_ids + i * k, b.topk_weights + i * k);
  };
  op.accesses = {rt::reads(b.logits, static_cast<size_t>(t * e) * 4),
                 rt::writes(b.route_scratch, static_cast<size_t>(t * s) * 4),
                 rt::writes(b.topk_ids, static_cast<size_t>(t * k) * 4),
                 rt::writes(b.topk_weights, static_cast<size_t>(t * k) * 4)};
  return op;
}

}  // namespace moe::ops
