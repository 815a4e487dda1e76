#include <gtest/gtest.h>

#include "model/config.h"
#include "model/weights.h"

namespace moe {
namespace {

void expect_rejected(MoeConfig c, const std::string& field) {
  try {
    c.validate();
    FAIL() << "expected a ConfigError naming " << field;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(Config, EveryPresetIsValid) {
  for (const Preset& p : presets()) EXPECT_NO_THROW(p.config.validate()) << p.name;
}

TEST(Config, BadFieldsAreNamed) {
  MoeConfig c = find_preset("deepseek-v3").config;
  MoeConfig k = c;
  k.top_k = c.num_experts + 1;
  expect_rejected(k, "num_experts_per_tok");
  MoeConfig g = c;
  g.n_group = 7;
  expect_rejected(g, "n_group");
  MoeConfig t = c;
  t.topk_group = c.n_group + 1;
  expect_rejected(t, "topk_group");
  MoeConfig u = c;
  u.model_type = "llama";
  expect_rejected(u, "llama");
  EXPECT_THROW(find_preset("nope"), ConfigError);
}

TEST(Config, MoeLayerRules) {
  MoeConfig d = find_preset("deepseek-v3").config;
  EXPECT_FALSE(d.is_moe_layer(2));
  EXPECT_TRUE(d.is_moe_layer(3));
  MoeConfig q = find_preset("qwen1.5-moe-a2.7b").config;
  q.mlp_only_layers = {5};
  q.decoder_sparse_step = 1;
  EXPECT_TRUE(q.is_moe_layer(4));
  EXPECT_FALSE(q.is_moe_layer(5));
}

TEST(Weights, RandomWeightsMatchTheConfigAndAreSeeded) {
  MoeConfig c = find_preset("deepseek-v2-lite").config;
  c.hidden = 64;
  c.moe_intermediate = 32;
  c.shared_intermediate = 64;
  LayerWeights a = make_random_weights(c, {.dtype = DType::kBF16, .seed = 3});
  EXPECT_NO_THROW(a.validate(c));
  LayerWeights b = make_random_weights(c, {.dtype = DType::kBF16, .seed = 3, .num_local_experts = 4});
  EXPECT_EQ(b.num_local_experts(), 4);
  EXPECT_EQ(weight_at(a.experts[3].down, 5, 7), weight_at(b.experts[3].down, 5, 7));
  LayerWeights f = make_random_weights(c, {.dtype = DType::kF8E4M3, .seed = 3});
  EXPECT_NO_THROW(f.validate(c));
  EXPECT_TRUE(std::isfinite(weight_at(f.experts[0].gate, 1, 1)));
}

}  // namespace
}  // namespace moe
