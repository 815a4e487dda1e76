// Hand-computed cases for the fp64 reference and the fast path's route_token: every routing method, ties,
// group selection, renormalisation (+1e-20 for sigmoid scoring), routed_scaling_factor, the shared-expert gate
// and expert-parallel partial outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "check/reference.h"
#include "layer/routing.h"

namespace moe {
namespace {

double sig(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// f32 weights from explicit values; the owning vectors live in storage.
WeightView f32_view(LayerWeights& w, std::vector<float> values, int64_t rows, int64_t cols) {
  auto buf = std::make_shared<std::vector<float>>(std::move(values));
  w.storage.emplace_back(buf);
  return WeightView{.dtype = DType::kF32, .data = buf->data(), .rows = rows, .cols = cols};
}

// A router whose logits equal x: H = E, identity weights.
LayerWeights identity_router(int64_t e, std::vector<float> bias = {}) {
  LayerWeights w;
  std::vector<float> eye(static_cast<size_t>(e * e), 0.0f);
  for (int64_t i = 0; i < e; ++i) eye[static_cast<size_t>(i * e + i)] = 1.0f;
  w.router = f32_view(w, eye, e, e);
  if (!bias.empty()) {
    auto b = std::make_shared<std::vector<float>>(std::move(bias));
    w.storage.emplace_back(b);
    w.correction_bias = b->data();
  }
  return w;
}

MoeConfig routing_config(const std::string& type, int64_t e, int64_t k) {
  MoeConfig c = family_defaults(type);
  c.hidden = e;
  c.moe_intermediate = 1;
  c.num_experts = e;
  c.top_k = k;
  c.shared_intermediate = 0;
  c.shared_expert_gate = false;
  return c;
}

// H = 1, I = Is = 1, E = 2, k = 1: a layer small enough to compute by hand.
MoeConfig by_hand_config(const std::string& type) {
  MoeConfig c = family_defaults(type);
  c.hidden = 1;
  c.moe_intermediate = 1;
  c.num_experts = 2;
  c.top_k = 1;
  c.shared_intermediate = 1;
  return c;
}

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
Routed fast_route(const MoeConfig& c, const LayerWeights& w, const std::vector<float>& logits) {
  std::vector<float> scratch(static_cast<size_t>(routing_scratch_floats(c)));
  Routed r{std::vector<int32_t>(static_cast<size_t>(c.top_k)), std::vector<float>(static_cast<size_t>(c.top_k))};
  route_token(c, c.topk_method == TopkMethod::kNoauxTc ? w.correction_bias : nullptr, logits.data(), scratch.data(),
              r.ids.data(), r.weights.data());
  return r;
}

// Checks the reference and the fast path against the hand-computed ids and weights.
void expect_route(const MoeConfig& c, const LayerWeights& w, const std::vector<float>& logits,
                  const std::vector<int32_t>& ids, const std::vector<double>& weights, double rel = 1e-12) {
  const ReferenceRoute ref = reference_route(c, w, logits.data());
  EXPECT_EQ(ref.ids, ids);
  ASSERT_EQ(ref.weights.size(), weights.size());
  for (size_t j = 0; j < weights.size(); ++j) EXPECT_NEAR(ref.weights[j], weights[j], rel * std::abs(weights[j]));
  const Routed fast = fast_route(c, w, logits);
  EXPECT_EQ(fast.ids, ids);
  for (size_t j = 0; j < weights.size(); ++j) EXPECT_NEAR(fast.weights[j], weights[j], 1e-6 * std::abs(weights[j]));
}

std::vector<double> softmax(const std::vector<float>& l) {
  double s = 0;
  for (float v : l) s += std::exp(static_cast<double>(v));
  std::vector<double> p;
  for (float v : l) p.push_back(std::exp(static_cast<double>(v)) / s);
  return p;
}

TEST(Routing, SoftmaxTopkRawAndRenormalised) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  const auto p = softmax(logits);
  MoeConfig c = routing_config("qwen2_moe", 4, 2);  // norm_topk_prob false
  LayerWeights w = identity_router(4);
  expect_route(c, w, logits, {1, 2}, {p[1], p[2]});
  c.norm_topk_prob = true;  // Qwen3: no epsilon
  expect_route(c, w, logits, {1, 2}, {p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])});
}

TEST(Routing, TiesBreakByIndexAscending) {
  const std::vector<float> logits = {2.0f, 2.0f, 1.0f, 2.0f};
  const auto p = softmax(logits);
  MoeConfig c = routing_config("qwen2_moe", 4, 3);
  LayerWeights w = identity_router(4);
  expect_route(c, w, logits, {0, 1, 3}, {p[0], p[1], p[3]});
  EXPECT_NEAR(reference_route(c, w, logits.data()).margin, p[3] - p[2], 1e-15);
  c.top_k = 2;
  EXPECT_EQ(reference_route(c, w, logits.data()).margin, 0.0);  // expert 3 ties with the kept expert 1
}

// route_token picks in one pass (k <= 32) what k argmax passes would: value descending, ties by index.
// Logits on a few levels far apart give exact ties inside a level and none across, so the expected ids
// are the logits sorted by (level descending, index ascending); every k from 1 to E, past 32 the passes.
TEST(Routing, OnePassSelectionMatchesArgmaxOrderForEveryK) {
  constexpr int64_t kE = 48;
  uint32_t seed = 7;
  for (const char* type : {"qwen2_moe", "glm4_moe"}) {
    for (int rep = 0; rep < 4; ++rep) {
      std::vector<float> logits(kE);
      for (float& l : logits) {
        seed = seed * 1664525u + 1013904223u;
        l = static_cast<float>((seed >> 16) % (rep + 2)) * 2.0f - 3.0f;  // 2 to 5 levels: many ties
      }
      std::vector<int32_t> order(kE);
      for (int32_t i = 0; i < kE; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
      for (int64_t k = 1; k <= kE; ++k) {
        MoeConfig c = routing_config(type, kE, k);
        c.n_group = 1;
        const LayerWeights w = identity_router(kE, std::vector<float>(kE, 0.0f));
        const Routed fast = fast_route(c, w, logits);
        ASSERT_EQ(fast.ids, std::vector<int32_t>(order.begin(), order.begin() + k)) << type << " k=" << k;
        ASSERT_EQ(reference_route(c, w, logits.data()).ids, fast.ids) << type << " k=" << k;
      }
    }
  }
}

TEST(Routing, DeepSeekV2GroupLimitedGreedyUsesMaxGroupScore) {
  // Groups of 2: g0 {3, 0}, g1 {2.9, 2.8}, g2 {2.95, 0}, g3 {0, 0}. Max scores keep g0 and g2; greedy would
  // take 2.9 from g1 as the third expert.
  const std::vector<float> logits = {3.0f, 0.0f, 2.9f, 2.8f, 2.95f, 0.0f, 0.0f, 0.0f};
  const auto p = softmax(logits);
  MoeConfig c = routing_config("deepseek_v2", 8, 3);
  c.topk_method = TopkMethod::kGroupLimitedGreedy;
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 16.0f;
  LayerWeights w = identity_router(8);
  // Third slot: the tie at 0 between experts 1 and 5 goes to the lower index.
  expect_route(c, w, logits, {0, 4, 1}, {16 * p[0], 16 * p[4], 16 * p[1]});
  c.topk_method = TopkMethod::kGreedy;
  expect_route(c, w, logits, {0, 4, 2}, {16 * p[0], 16 * p[4], 16 * p[2]});
}

TEST(Routing, NoauxTcSumOfTopTwoGroupsBiasForSelectionOnly) {
  // Groups of 2 (sigmoid scores): g0 {s(2.0), s(-4)} = 0.899, g1 {s(1.5), s(1.5)} = 1.635,
  // g2 {s(1.8), s(1.0)} = 1.589, g3 {s(0), s(0)} = 1.0. Keep g1, g2 (a max score would keep g0 first).
  const std::vector<float> logits = {2.0f, -4.0f, 1.5f, 1.5f, 1.8f, 1.0f, 0.0f, 0.0f};
  std::vector<double> s;
  for (float l : logits) s.push_back(sig(l));
  MoeConfig c = routing_config("deepseek_v3", 8, 2);
  c.n_group = 4;
  c.topk_group = 2;
  c.routed_scaling_factor = 2.5f;
  {
    LayerWeights w = identity_router(8, std::vector<float>(8, 0.0f));
    // 0.858 (expert 4), then the tie at 0.818 between 2 and 3 goes to 2.
    const double d = s[4] + s[2] + 1e-20;
    expect_route(c, w, logits, {4, 2}, {2.5 * s[4] / d, 2.5 * s[2] / d});
  }
  {
    // A bias of +0.2 on expert 5 moves it to the front, but its weight is its unbiased score.
    std::vector<float> bias(8, 0.0f);
    bias[5] = 0.2f;
    LayerWeights w = identity_router(8, bias);
    const double d = s[5] + s[4] + 1e-20;
    expect_route(c, w, logits, {5, 4}, {2.5 * s[5] / d, 2.5 * s[4] / d});
  }
}

TEST(Routing, SigmoidRenormalisationEpsilonKeepsTinyScoresFinite) {
  const std::vector<float> logits = {-100.0f, -100.0f, -100.0f, -100.0f};
  MoeConfig c = routing_config("glm4_moe", 4, 2);
  LayerWeights w = identity_router(4, std::vector<float>(4, 0.0f));
  const double s = sig(-100.0);
  const ReferenceRoute ref = reference_route(c, w, logits.data());
  EXPECT_EQ(ref.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(ref.weights[0], s / (2 * s + 1e-20), 1e-12 * s / (2 * s + 1e-20));
  EXPECT_LT(ref.weights[0], 1e-20);  // without the epsilon it would be 0.5
  const Routed fast = fast_route(c, w, logits);  // fp32: sigmoid(-100) underflows to 0, 0 / (0 + 1e-20) = 0
  EXPECT_EQ(fast.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(fast.weights[0], 0.0f);
  EXPECT_EQ(fast.weights[1], 0.0f);
}

TEST(Routing, KimiScalingFactorAppliesAfterRenormalisation) {
  const std::vector<float> logits = {0.5f, -0.5f, 1.5f};
  MoeConfig c = routing_config("kimi_k2", 3, 2);
  c.routed_scaling_factor = 2.827f;
  LayerWeights w = identity_router(3, std::vector<float>(3, 0.0f));
  const double d = sig(1.5) + sig(0.5) + 1e-20, f = static_cast<double>(2.827f);
  expect_route(c, w, logits, {2, 0}, {f * sig(1.5) / d, f * sig(0.5) / d});
}

// The whole layer by hand: H = 1, E = 2, I = Is = 1, k = 1, Qwen2-MoE (softmax, sigmoid shared gate).
TEST(Reference, TinyLayerByHand) {
  MoeConfig c = by_hand_config("qwen2_moe");
  LayerWeights w;
  w.router = f32_view(w, {1.0f, -1.0f}, 2, 1);
  for (float scale : {1.0f, 3.0f})
    w.experts.push_back({f32_view(w, {1.0f}, 1, 1), f32_view(w, {scale}, 1, 1), f32_view(w, {1.0f}, 1, 1)});
  w.shared = {f32_view(w, {1.0f}, 1, 1), f32_view(w, {0.5f}, 1, 1), f32_view(w, {2.0f}, 1, 1)};
  w.shared_gate = f32_view(w, {0.5f}, 1, 1);
  ASSERT_NO_THROW(w.validate(c));
  const float x[2] = {2.0f, -2.0f};
  std::vector<ReferenceRoute> routes;
  const std::vector<double> y = reference_forward(c, w, x, 2, &routes);
  const double p = 1.0 / (1.0 + std::exp(-4.0));  // softmax of logits (2, -2)
  // token 0: expert 0 (logit 2); E0 = silu(2) * 2; shared = 2 * silu(2) * 1; gate = sigmoid(1)
  const double silu2 = 2.0 * sig(2.0);
  EXPECT_EQ(routes[0].ids, (std::vector<int32_t>{0}));
  EXPECT_NEAR(y[0], p * silu2 * 2.0 + sig(1.0) * 2.0 * silu2 * 1.0, 1e-12);
  // token 1: expert 1 (logit 2 again); E1 = silu(-2) * (3 * -2); shared = 2 * silu(-2) * (-1); gate = sigmoid(-1)
  const double silum2 = -2.0 * sig(-2.0);
  EXPECT_EQ(routes[1].ids, (std::vector<int32_t>{1}));
  EXPECT_NEAR(y[1], p * silum2 * -6.0 + sig(-1.0) * 2.0 * silum2 * -1.0, 1e-12);

  // Expert parallelism: a rank holding only expert 0 outputs token 1's shared part alone.
  w.experts.pop_back();
  const std::vector<double> partial = reference_forward(c, w, x, 2);
  EXPECT_NEAR(partial[0], y[0], 1e-15);
  EXPECT_NEAR(partial[1], sig(-1.0) * 2.0 * silum2 * -1.0, 1e-12);
}

TEST(Reference, DeepSeekSharedExpertIsUngated) {
  MoeConfig c = by_hand_config("deepseek_v3");
  c.routed_scaling_factor = 2.5f;
  LayerWeights w;
  w.router = f32_view(w, {1.0f, -1.0f}, 2, 1);
  auto bias = std::make_shared<std::vector<float>>(std::vector<float>{0.0f, 0.0f});
  w.storage.emplace_back(bias);
  w.correction_bias = bias->data();
  for (int e = 0; e < 2; ++e)
    w.experts.push_back({f32_view(w, {1.0f}, 1, 1), f32_view(w, {1.0f}, 1, 1), f32_view(w, {1.0f}, 1, 1)});
  w.shared = {f32_view(w, {1.0f}, 1, 1), f32_view(w, {1.0f}, 1, 1), f32_view(w, {1.0f}, 1, 1)};
  ASSERT_NO_THROW(w.validate(c));
  const float x = 1.0f;
  const std::vector<double> y = reference_forward(c, w, &x, 1);
  const double e0 = sig(1.0) * 1.0;  // silu(1) * 1
  // k = 1 with renormalisation: weight = s / (s + 1e-20) * 2.5
  EXPECT_NEAR(y[0], 2.5 * sig(1.0) / (sig(1.0) + 1e-20) * e0 + e0, 1e-12);
}

}  // namespace
}  // namespace moe
