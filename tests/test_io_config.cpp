// config.json for every family: real-looking files parse to the right MoeConfig, absent fields take
// transformers' defaults, bad ones are rejected naming the field and the file, and hf_config_json() round-trips.
#include <gtest/gtest.h>

#include "io/hf_config.h"
#include "test_io_util.h"

namespace moe {
namespace {

using test::expect_error;

void expect_same(const MoeConfig& a, const MoeConfig& b, const std::string& what) {
  EXPECT_EQ(a.model_type, b.model_type) << what;
  EXPECT_EQ(a.hidden, b.hidden) << what;
  EXPECT_EQ(a.moe_intermediate, b.moe_intermediate) << what;
  EXPECT_EQ(a.num_experts, b.num_experts) << what;
  EXPECT_EQ(a.top_k, b.top_k) << what;
  EXPECT_EQ(a.shared_intermediate, b.shared_intermediate) << what;
  EXPECT_EQ(a.shared_expert_gate, b.shared_expert_gate) << what;
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob) << what;
  EXPECT_EQ(a.scoring, b.scoring) << what;
  EXPECT_EQ(a.topk_method, b.topk_method) << what;
  EXPECT_EQ(a.n_group, b.n_group) << what;
  EXPECT_EQ(a.topk_group, b.topk_group) << what;
  EXPECT_EQ(a.routed_scaling_factor, b.routed_scaling_factor) << what;
  EXPECT_EQ(a.correction_bias, b.correction_bias) << what;
  EXPECT_EQ(a.num_layers, b.num_layers) << what;
  EXPECT_EQ(a.first_k_dense_replace, b.first_k_dense_replace) << what;
  EXPECT_EQ(a.moe_layer_freq, b.moe_layer_freq) << what;
  EXPECT_EQ(a.decoder_sparse_step, b.decoder_sparse_step) << what;
  EXPECT_EQ(a.mlp_only_layers, b.mlp_only_layers) << what;
  EXPECT_EQ(a.mlp_layer_types, b.mlp_layer_types) << what;
  EXPECT_EQ(a.fp8, b.fp8) << what;
  EXPECT_EQ(a.int4, b.int4) << what;
  EXPECT_EQ(a.int4_group_size, b.int4_group_size) << what;
  EXPECT_EQ(a.int4_shared, b.int4_shared) << what;
}

// Trimmed from the published config.json files (attention and vocabulary fields kept where they show that
// unrelated fields are ignored).
const char* kDeepSeekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
  "intermediate_size": 18432, "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
  "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "first_k_dense_replace": 3,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rope_scaling": {"beta_fast": 32, "factor": 40, "type": "yarn"}, "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid", "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "vocab_size": 129280, "q_lora_rank": 1536, "aux_loss_alpha": 0.001, "seq_aux": true})";

const char* kQwen3Next = R"({
  "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
  "decoder_sparse_step": 1, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
  "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": true, "mlp_only_layers": [],
  "num_hidden_layers": 48, "full_attention_interval": 4, "linear_num_value_heads": 32, "head_dim": 256})";

const char* kKimiK2 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
  "moe_intermediate_size": 2048, "n_routed_experts": 384, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
  "num_experts_per_tok": 8, "routed_scaling_factor": 2.827, "first_k_dense_replace": 1, "num_hidden_layers": 61,
  "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}})";

const char* kDeepSeekV2 = R"({
  "model_type": "deepseek_v2", "hidden_size": 5120, "moe_intermediate_size": 1536, "n_routed_experts": 160,
  "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 8, "topk_group": 3,
  "topk_method": "group_limited_greedy", "routed_scaling_factor": 16.0, "scoring_func": "softmax",
  "norm_topk_prob": false, "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_hidden_layers": 60})";

const char* kGlm45Air = R"({
  "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 4096,
  "moe_intermediate_size": 1408, "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8,
  "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "first_k_dense_replace": 1,
  "num_hidden_layers": 46, "norm_topk_prob": true, "num_nextn_predict_layers": 1})";

TEST(HfConfig, PublishedConfigsParse) {
  const MoeConfig v3 = parse_hf_config(kDeepSeekV3, "v3/config.json");
  expect_same(v3, find_preset("deepseek-v3").config, "deepseek-v3");
  const MoeConfig next = parse_hf_config(kQwen3Next, "next/config.json");
  expect_same(next, find_preset("qwen3-next-80b-a3b").config, "qwen3-next");
  const MoeConfig kimi = parse_hf_config(kKimiK2, "kimi/config.json");
  expect_same(kimi, find_preset("kimi-k2").config, "kimi-k2");
  const MoeConfig air = parse_hf_config(kGlm45Air, "air/config.json");
  expect_same(air, find_preset("glm-4.5-air").config, "glm-4.5-air");
  const MoeConfig v2 = parse_hf_config(kDeepSeekV2, "v2/config.json");
  EXPECT_EQ(v2.topk_method, TopkMethod::kGroupLimitedGreedy);
  EXPECT_EQ(v2.scoring, Scoring::kSoftmax);
  EXPECT_EQ(v2.shared_intermediate, 3072);
  EXPECT_FLOAT_EQ(v2.routed_scaling_factor, 16.0f);
  EXPECT_FALSE(v2.correction_bias);
  EXPECT_FALSE(v2.is_moe_layer(0));
  EXPECT_TRUE(v2.is_moe_layer(1));
}

TEST(HfConfig, AbsentFieldsTakeTransformersDefaults) {
  const MoeConfig q3 = parse_hf_config(R"({"model_type": "qwen3_moe"})", "c.json");
  EXPECT_EQ(q3.hidden, 2048);
  EXPECT_EQ(q3.num_experts, 128);
  EXPECT_EQ(q3.top_k, 8);
  EXPECT_FALSE(q3.norm_topk_prob);  // Qwen3MoeConfig default; the published checkpoints say true
  EXPECT_FALSE(q3.has_shared_expert());
  const MoeConfig q2 = parse_hf_config(R"({"model_type": "qwen2_moe", "n_group": "ignored"})", "c.json");
  EXPECT_EQ(q2.shared_intermediate, 5632);
  EXPECT_TRUE(q2.shared_expert_gate);
  const MoeConfig v3 = parse_hf_config(R"({"model_type": "deepseek_v32", "n_group": null})", "c.json");
  EXPECT_EQ(v3.n_group, 8);
  EXPECT_EQ(v3.first_k_dense_replace, 3);
  EXPECT_TRUE(v3.correction_bias);
  const MoeConfig v2 = parse_hf_config(R"({"model_type": "deepseek_v2", "num_experts_per_tok": 6})", "c.json");
  EXPECT_EQ(v2.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(v2.shared_intermediate, 2 * 1407);
  expect_error([] { parse_hf_config(R"({"model_type": "deepseek_v2"})", "c.json"); },
               {"num_experts_per_tok", "required", "c.json"});
  const MoeConfig glm5 = parse_hf_config(R"({"model_type": "glm_moe_dsa", "num_hidden_layers": 4,
      "mlp_layer_types": ["dense", "sparse", "dense", "sparse"]})", "c.json");
  EXPECT_FALSE(glm5.is_moe_layer(2));
  EXPECT_TRUE(glm5.is_moe_layer(3));
  const MoeConfig qs = parse_hf_config(R"({"model_type": "qwen2_moe", "decoder_sparse_step": 2,
      "mlp_only_layers": [3], "num_hidden_layers": 8, "shared_expert_intermediate_size": 0})", "c.json");
  EXPECT_FALSE(qs.is_moe_layer(0));
  EXPECT_TRUE(qs.is_moe_layer(1));
  EXPECT_FALSE(qs.is_moe_layer(3));
  EXPECT_FALSE(qs.shared_expert_gate);
}

TEST(HfConfig, BadConfigsNameFieldAndFile) {
  const std::string f = "m/config.json";
  auto rejects = [&](const std::string& text, std::vector<std::string> words) {
    words.push_back(f);
    expect_error([&] { parse_hf_config(text, f); }, words, text);
  };
  rejects(R"({"model_type": "llama"})", {"llama", "qwen3_next"});
  rejects(R"({"hidden_size": 64})", {"model_type", "missing"});
  rejects(R"({"model_type": 3})", {"model_type", "string"});
  rejects(R"({"model_type": "qwen3_moe", "hidden_size": "2048"})", {"'hidden_size'", "integer", "string"});
  rejects(R"({"model_type": "qwen3_moe", "hidden_size": 20.5})", {"'hidden_size'", "integer"});
  rejects(R"({"model_type": "qwen3_moe", "norm_topk_prob": 1})", {"'norm_topk_prob'", "true or false"});
  rejects(R"({"model_type": "qwen3_moe", "mlp_only_layers": [1, "2"]})", {"'mlp_only_layers'"});
  rejects(R"({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 5})", {"num_experts_per_tok"});
  rejects(R"({"model_type": "qwen3_moe", "hidden_size": 0})", {"hidden_size"});
  rejects(R"({"model_type": "deepseek_v3", "n_routed_experts": 12})", {"n_group", "divisible"});
  rejects(R"({"model_type": "deepseek_v3", "topk_method": "greedy"})", {"'topk_method'", "noaux_tc"});
  rejects(R"({"model_type": "deepseek_v2", "num_experts_per_tok": 6, "topk_method": "noaux_tc"})", {"'topk_method'"});
  rejects(R"({"model_type": "deepseek_v3", "routed_scaling_factor": "2.5"})", {"'routed_scaling_factor'", "number"});
  rejects(R"({"model_type": "deepseek_v3", "routed_scaling_factor": 1e300})", {"'routed_scaling_factor'", "range"});
  rejects(R"({"model_type": "deepseek_v3", "n_shared_experts": 4611686018427387904})", {"'n_shared_experts'"});
  rejects(R"({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "awq"}})",
          {"'quantization_config.quant_method'", "awq", "compressed-tensors"});
  // compressed-tensors is read for pack-quantized int4 only (test_io_int4.cpp has the rest).
  rejects(R"({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "compressed-tensors"}})",
          {"'quantization_config.format'", "pack-quantized"});
  rejects(R"({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8", "fmt": "e5m2",
              "weight_block_size": [128, 128]}})", {"'quantization_config.fmt'"});
  rejects(R"({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8",
              "weight_block_size": [64, 64]}})", {"weight_block_size", "128"});
  rejects(R"({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8"}})", {"weight_block_size"});
  rejects(R"({"model_type": "glm_moe_dsa", "num_hidden_layers": 2, "mlp_layer_types": ["sparse"]})",
          {"mlp_layer_types"});
  rejects(R"({"model_type": "qwen3_moe", "hidden_size": 64, "hidden_size": 32})", {"duplicate key \"hidden_size\""});
  rejects(R"({"model_type": "qwen3_moe",)", {"invalid JSON"});
  rejects(R"(["qwen3_moe"])", {"object"});
  expect_error([] { load_hf_config("/nonexistent/dir"); }, {"/nonexistent/dir", "cannot open"});
}

std::vector<MoeConfig> every_family() {
  std::vector<MoeConfig> out;
  for (const Preset& p : presets()) out.push_back(p.config);
  MoeConfig v2 = find_preset("deepseek-v2-lite").config;
  v2.topk_method = TopkMethod::kGroupLimitedGreedy;
  v2.n_group = 8;
  v2.topk_group = 3;
  v2.routed_scaling_factor = 16.0f;
  out.push_back(v2);
  MoeConfig v32 = find_preset("deepseek-v3").config;
  v32.model_type = "deepseek_v32";
  out.push_back(v32);
  MoeConfig glm5 = find_preset("glm-5").config;
  glm5.num_layers = 5;
  glm5.mlp_layer_types = {"dense", "sparse", "sparse", "dense", "sparse"};
  out.push_back(glm5);
  MoeConfig qwen = find_preset("qwen1.5-moe-a2.7b").config;
  qwen.decoder_sparse_step = 2;
  qwen.mlp_only_layers = {5, 7};
  out.push_back(qwen);
  return out;
}

TEST(HfConfig, WrittenConfigsRoundTrip) {
  for (const MoeConfig& c : every_family()) {
    const std::string text = hf_config_json(c);
    expect_same(parse_hf_config(text, "rt.json"), c, c.model_type + ":\n" + text);
  }
  MoeConfig bad = find_preset("deepseek-v3").config;
  bad.shared_intermediate = 3000;
  expect_error([&] { hf_config_json(bad); }, {"n_shared_experts", "deepseek_v3"});
  MoeConfig q = find_preset("qwen3-30b-a3b").config;
  q.shared_intermediate = 64;
  expect_error([&] { hf_config_json(q); }, {"qwen3_moe has no shared expert"});
}

TEST(HfConfig, LoadsFromADirectory) {
  test::ScratchDir dir;
  test::write_bytes(dir / "config.json", kQwen3Next);
  EXPECT_EQ(load_hf_config(dir.path()).num_experts, 512);
  test::write_bytes(dir / "config.json", R"({"model_type": "qwen3_next", "num_experts": 0})");
  expect_error([&] { load_hf_config(dir.path()); }, {dir / "config.json", "num_experts"});
}

}  // namespace
}  // namespace moe
