#include "layer/routing.h"

#include <cmath>
#include <limits>

namespace moe {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Index of the largest of v[0, n), ties to the lowest index; entries at -inf are taken/excluded. If nothing
// compares larger (NaN input), the first entry not at -inf, so that the result is always in range.
int64_t argmax(const float* v, int64_t n) {
  int64_t best = -1;
  float best_v = kNegInf;
  for (int64_t i = 0; i < n; ++i)
    if (v[i] > best_v) {
      best = i;
      best_v = v[i];
    }
  if (best >= 0) return best;
  for (int64_t i = 0; i < n; ++i)
    if (v[i] != kNegInf) return i;
  return 0;
}

// The k largest of v[0, n) into ids[0, k), in the order k argmax() passes (each setting its pick to -inf)
// would pick them: value descending, ties by index ascending. One pass instead of k: an entry enters the
// sorted list only if it beats the current k-th (strictly, so an equal value with a larger index stays
// behind). Returns false where comparisons alone do not define that order: a NaN, or fewer than k entries
// above -inf; the caller then runs the argmax passes, which have a rule for those.
constexpr int64_t kMaxOnePassK = 32;
bool top_k_one_pass(const float* v, int64_t n, int64_t k, int32_t* ids) {
  if (k > kMaxOnePassK) return false;
  float vals[kMaxOnePassK];
  int64_t m = 0;  // entries in the list
  for (int64_t i = 0; i < n; ++i) {
    const float x = v[i];
    if (!(x > kNegInf)) {
      if (x != x) return false;  // NaN
      continue;
    }
    if (m == k && !(x > vals[k - 1])) continue;
    int64_t j = m < k ? m++ : k - 1;
    for (; j > 0 && x > vals[j - 1]; --j) {
      vals[j] = vals[j - 1];
      ids[j] = ids[j - 1];
    }
    vals[j] = x;
    ids[j] = static_cast<int32_t>(i);
  }
  return m == k;
}

void softmax(const float* logits, int64_t n, float* p) {
  float m = logits[0];
  for (int64_t i = 1; i < n; ++i) m = logits[i] > m ? logits[i] : m;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    p[i] = std::exp(logits[i] - m);
    sum += p[i];
  }
  for (int64_t i = 0; i < n; ++i) p[i] /= sum;
}

// Keeps the topk_group best groups of `select` (score per group from `group_score`) and sets every expert
// of the other groups to -inf.
void mask_groups(const MoeConfig& c, float* select, float* group_scores, bool sum_top_two) {
  const int64_t per = c.num_experts / c.n_group;
  for (int64_t g = 0; g < c.n_group; ++g) {
    const float* v = select + g * per;
    float a = kNegInf, b = kNegInf;  // a >= b: the two largest
    for (int64_t i = 0; i < per; ++i) {
      if (v[i] > a) {
        b = a;
        a = v[i];
      } else if (v[i] > b) {
        b = v[i];
      }
    }
    group_scores[g] = sum_top_two ? a + b : a;
  }
  // Chosen groups are marked by -inf in group_scores (argmax skips them); the others keep a finite score.
  for (int64_t j = 0; j < c.topk_group; ++j) group_scores[argmax(group_scores, c.n_group)] = kNegInf;
  for (int64_t g = 0; g < c.n_group; ++g)
    if (group_scores[g] != kNegInf)
      for (int64_t i = 0; i < per; ++i) select[g * per + i] = kNegInf;
}

}  // namespace

int64_t routing_scratch_floats(const MoeConfig& config) { return 2 * config.num_experts + config.n_group; }

void route_token(const MoeConfig& c, const float* bias, const float* logits, float* scratch, int32_t* ids,
                 float* weights) {
  const int64_t n = c.num_experts;
  float* scores = scratch;         // [E] softmax or sigmoid scores: the weights come from here
  float* select = scratch + n;     // [E] what selection ranks (biased for noaux_tc), -inf when excluded
  float* groups = scratch + 2 * n;  // [n_group]
  const bool sigmoid_scoring = c.scoring == Scoring::kSigmoid;
  if (sigmoid_scoring) {
    for (int64_t e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    softmax(logits, n, scores);
  }
  for (int64_t e = 0; e < n; ++e) select[e] = scores[e] + (bias != nullptr ? bias[e] : 0.0f);
  if (c.topk_method != TopkMethod::kGreedy && c.n_group > 1)
    mask_groups(c, select, groups, c.topk_method == TopkMethod::kNoauxTc);
  if (!top_k_one_pass(select, n, c.top_k, ids))
    for (int64_t j = 0; j < c.top_k; ++j) {
      const int64_t e = argmax(select, n);
      select[e] = kNegInf;
      ids[j] = static_cast<int32_t>(e);
    }
  float sum = 0.0f;
  for (int64_t j = 0; j < c.top_k; ++j) {
    weights[j] = scores[ids[j]];
    sum += weights[j];
  }
  if (c.norm_topk_prob) {
    const float denom = sigmoid_scoring ? sum + 1e-20f : sum;
    for (int64_t j = 0; j < c.top_k; ++j) weights[j] /= denom;
  }
  for (int64_t j = 0; j < c.top_k; ++j) weights[j] *= c.routed_scaling_factor;
}

}  // namespace moe
