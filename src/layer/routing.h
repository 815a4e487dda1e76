// Fast-path routing of one token: fp32 router logits -> (expert ids, weights) for its k slots, per
// docs/model-families.md, "Routing per family". Called from inside the "topk" operation's tiles: no allocation,
// no throw; the caller hands each token its own scratch.
//
// Slot order (the order the combine sums in): selection order, i.e. selected score descending, ties broken
// by expert index ascending. The same rule picks groups. Experts of excluded groups are set to -inf in the
// scratch, never to 0, so an fp32 probability that underflowed to 0 cannot let an excluded expert win a
// tie. The k experts are taken in one pass over the scores (k <= 32, no NaN), else by k argmax passes that
// set each pick to -inf; both give the same ids (Qwen3-Next, 512 experts, top-10: 5 -> 3.4 us per token).
//
// Weights, per scoring:
//   softmax: p = softmax(logits); w = p[ids]; if norm_topk_prob: w /= sum(w) (no epsilon, as Qwen);
//            w *= routed_scaling_factor (1 for Qwen).
//   sigmoid: s = sigmoid(logits); selection on s + bias; w = s[ids]; if norm_topk_prob:
//            w /= (sum(w) + 1e-20); w *= routed_scaling_factor.
// Sums run in slot order.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace moe {

// Floats of scratch one token needs.
int64_t routing_scratch_floats(const MoeConfig& config);

// logits [E] fp32; bias [E] (noaux_tc) or nullptr; scratch [routing_scratch_floats]; ids/weights [k].
void route_token(const MoeConfig& config, const float* bias, const float* logits, float* scratch, int32_t* ids,
                 float* weights);

}  // namespace moe
