// An independent, deliberately plain fp64 reference of the whole MoE layer for every family of
// docs/model-families.md. It shares no helper with the fast path (own routing, own loops); weights are
// read element by element with weight_at(), so f32, bf16 and fp8 weights enter as the exact fp32 values the
// kernels see, and the only differences from the fast path are fp32 vs fp64 arithmetic.
//
// Routing is computed in fp64 from fp64 logits. Where two candidates are within fp32 rounding of each other
// the fp32 fast path may pick the other one (a legitimate routing flip, not a bug), so every routing decision
// reports its margin: the smallest gap between the last kept and the first rejected candidate (experts, and
// groups where groups are used). Tests assert their inputs route with a clear margin, or with an exact tie
// (margin 0, e.g. duplicated router rows, which fp32 and fp64 both see as equal and break identically: value
// descending, then index ascending).
//
// Expert parallelism: with num_local_experts < E only experts [0, num_local_experts) contribute (one rank's
// partial output); routing still ranks all E experts. The shared expert is always added (Qwen: scaled by
// sigmoid(x . w_shared_gate); DeepSeek/Kimi/GLM: ungated).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace moe {

struct ReferenceRoute {
  std::vector<int32_t> ids;     // [k], selection order
  std::vector<double> weights;  // [k], after renormalisation and routed_scaling_factor
  double margin = 0.0;          // smallest selection gap (see above); +inf when nothing was rejected
};

// Routes one token (x: [H]).
ReferenceRoute reference_route(const MoeConfig& config, const LayerWeights& weights, const float* x);

// y [tokens, H] = MoE(x [tokens, H]) in fp64. Also returns each token's route when `routes` is not null.
std::vector<double> reference_forward(const MoeConfig& config, const LayerWeights& weights, const float* x,
                                      int64_t tokens, std::vector<ReferenceRoute>* routes = nullptr);

}  // namespace moe
