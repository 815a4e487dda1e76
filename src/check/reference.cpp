#include "check/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace moe {

namespace {

using Vec = std::vector<double>;

double dot(const float* x, const WeightView& w, int64_t row) {
  double acc = 0.0;
  for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(x[c]) * static_cast<double>(weight_at(w, row, c));
  return acc;
}

double dot(const Vec& x, const WeightView& w, int64_t row) {
  double acc = 0.0;
  for (int64_t c = 0; c < w.cols; ++c) acc += x[static_cast<size_t>(c)] * static_cast<double>(weight_at(w, row, c));
  return acc;
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// SwiGLU MLP: down( silu(gate x) * (up x) ).
Vec mlp(const ExpertWeights& e, const float* x) {
  const int64_t inter = e.gate.rows;
  Vec h(static_cast<size_t>(inter));
  for (int64_t i = 0; i < inter; ++i) {
    const double g = dot(x, e.gate, i);
    h[static_cast<size_t>(i)] = g * sigmoid(g) * dot(x, e.up, i);
  }
  Vec out(static_cast<size_t>(e.down.rows));
  for (int64_t r = 0; r < e.down.rows; ++r) out[static_cast<size_t>(r)] = dot(h, e.down, r);
  return out;
}

// Candidates ranked by value descending, then index ascending (stable sort of an index list).
std::vector<int64_t> ranked(const Vec& v, const std::vector<int64_t>& candidates) {
  std::vector<int64_t> order = candidates;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)];
  });
  return order;
}

// Keeps the first `keep` of `order`; returns the gap to the first one dropped (inf if none dropped).
double gap(const Vec& v, const std::vector<int64_t>& order, int64_t keep) {
  if (keep >= static_cast<int64_t>(order.size())) return std::numeric_limits<double>::infinity();
  return v[static_cast<size_t>(order[static_cast<size_t>(keep - 1)])] - v[static_cast<size_t>(order[static_cast<size_t>(keep)])];
}

}  // namespace

ReferenceRoute reference_route(const MoeConfig& c, const LayerWeights& w, const float* x) {
  const int64_t n = c.num_experts;
  Vec logits(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) logits[static_cast<size_t>(e)] = dot(x, w.router, e);

  Vec scores(static_cast<size_t>(n));
  if (c.scoring == Scoring::kSoftmax) {
    const double m = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (int64_t e = 0; e < n; ++e) sum += std::exp(logits[static_cast<size_t>(e)] - m);
    for (int64_t e = 0; e < n; ++e) scores[static_cast<size_t>(e)] = std::exp(logits[static_cast<size_t>(e)] - m) / sum;
  } else {
    for (int64_t e = 0; e < n; ++e) scores[static_cast<size_t>(e)] = sigmoid(logits[static_cast<size_t>(e)]);
  }
  Vec choice = scores;  // what selection ranks
  if (c.topk_method == TopkMethod::kNoauxTc && w.correction_bias != nullptr)
    for (int64_t e = 0; e < n; ++e) choice[static_cast<size_t>(e)] += static_cast<double>(w.correction_bias[e]);

  ReferenceRoute route;
  route.margin = std::numeric_limits<double>::infinity();
  std::vector<int64_t> candidates;
  if (c.topk_method != TopkMethod::kGreedy && c.n_group > 1) {
    const int64_t per = n / c.n_group;
    Vec group_score(static_cast<size_t>(c.n_group));
    std::vector<int64_t> groups(static_cast<size_t>(c.n_group));
    std::iota(groups.begin(), groups.end(), 0);
    for (int64_t g = 0; g < c.n_group; ++g) {
      Vec members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(members.begin(), members.end(), std::greater<>());
      group_score[static_cast<size_t>(g)] =
          c.topk_method == TopkMethod::kNoauxTc ? members[0] + members[1] : members[0];
    }
    const std::vector<int64_t> order = ranked(group_score, groups);
    route.margin = std::min(route.margin, gap(group_score, order, c.topk_group));
    for (int64_t j = 0; j < c.topk_group; ++j)
      for (int64_t i = 0; i < per; ++i) candidates.push_back(order[static_cast<size_t>(j)] * per + i);
    std::sort(candidates.begin(), candidates.end());
  } else {
    candidates.resize(static_cast<size_t>(n));
    std::iota(candidates.begin(), candidates.end(), 0);
  }
  const std::vector<int64_t> order = ranked(choice, candidates);
  route.margin = std::min(route.margin, gap(choice, order, c.top_k));

  double sum = 0.0;
  for (int64_t j = 0; j < c.top_k; ++j) {
    const int64_t e = order[static_cast<size_t>(j)];
    route.ids.push_back(static_cast<int32_t>(e));
    route.weights.push_back(scores[static_cast<size_t>(e)]);
    sum += scores[static_cast<size_t>(e)];
  }
  if (c.norm_topk_prob) {
    const double denom = c.scoring == Scoring::kSigmoid ? sum + 1e-20 : sum;
    for (double& v : route.weights) v /= denom;
  }
  for (double& v : route.weights) v *= static_cast<double>(c.routed_scaling_factor);
  return route;
}

std::vector<double> reference_forward(const MoeConfig& c, const LayerWeights& w, const float* x, int64_t tokens,
                                      std::vector<ReferenceRoute>* routes) {
  const int64_t h = c.hidden;
  std::vector<double> y(static_cast<size_t>(tokens * h), 0.0);
  if (routes != nullptr) routes->clear();
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x + t * h;
    double* yt = y.data() + t * h;
    ReferenceRoute route = reference_route(c, w, xt);
    for (size_t j = 0; j < route.ids.size(); ++j) {
      if (route.ids[j] >= w.num_local_experts()) continue;  // owned by another expert-parallel rank
      const Vec out = mlp(w.experts[static_cast<size_t>(route.ids[j])], xt);
      for (int64_t i = 0; i < h; ++i) yt[i] += route.weights[j] * out[static_cast<size_t>(i)];
    }
    if (c.has_shared_expert()) {
      const Vec out = mlp(w.shared, xt);
      const double g = c.shared_expert_gate ? sigmoid(dot(xt, w.shared_gate, 0)) : 1.0;
      for (int64_t i = 0; i < h; ++i) yt[i] += g * out[static_cast<size_t>(i)];
    }
    if (routes != nullptr) routes->push_back(std::move(route));
  }
  return y;
}

}  // namespace moe
