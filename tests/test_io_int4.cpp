// int4 routed experts in the compressed-tensors pack-quantized format (Kimi-K2-Thinking's): config.json's
// quantization_config parsed and validated (each unsupported variant a named error), make_checkpoint writing
// such checkpoints for every family and load_layer giving back exactly make_random_weights() of the same
// seed as mapped views (partial expert ranges included), and malformed checkpoints failing naming tensor,
// file, expected and found.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "check/tiny_configs.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/make_checkpoint.h"
#include "io/safetensors_writer.h"
#include "test_io_util.h"

namespace moe {
namespace {

using nlohmann::json;
using test::expect_error;
using test::ScratchDir;

// A Kimi-K2-shaped config at test size: 2 MoE layers after one dense one, int4 experts in groups of 32.
MoeConfig kimi_tiny() {
  MoeConfig c = find_preset("kimi-k2").config;
  c.hidden = 64;
  c.moe_intermediate = 32;
  c.shared_intermediate = 32;
  c.num_experts = 8;
  c.top_k = 2;
  c.num_layers = 3;
  c.first_k_dense_replace = 1;
  return with_int4(c);
}

MoeConfig qwen_next_tiny() {
  MoeConfig c = find_preset("qwen3-next-80b-a3b").config;
  c.hidden = 64;
  c.moe_intermediate = 32;
  c.shared_intermediate = 48;
  c.num_experts = 8;
  c.top_k = 2;
  c.num_layers = 2;
  return with_int4(c);
}

TEST(Int4Config, KimiStyleQuantizationConfigParsesAndRoundTrips) {
  const MoeConfig c = kimi_tiny();
  const std::string text = hf_config_json(c);
  const json j = json::parse(text);
  const json& q = j["quantization_config"];
  EXPECT_EQ(q["quant_method"], "compressed-tensors");
  EXPECT_EQ(q["format"], "pack-quantized");
  EXPECT_EQ(q["config_groups"]["group_0"]["weights"]["num_bits"], 4);
  EXPECT_EQ(q["config_groups"]["group_0"]["weights"]["group_size"], 32);
  EXPECT_EQ(q["config_groups"]["group_0"]["targets"], json::array({"Linear"}));
  // The shared experts by pattern stay bf16; a DeepSeek-style router is not a Linear and needs no entry
  // (Qwen's Linear routers are listed by name: the qwen_next_tiny round trip below).
  const std::vector<std::string> ignore = q["ignore"];
  EXPECT_EQ(std::find(ignore.begin(), ignore.end(), "model.layers.1.mlp.gate"), ignore.end());
  EXPECT_NE(std::find(ignore.begin(), ignore.end(), "re:.*mlp\\.shared_experts\\..*"), ignore.end());
  const std::vector<std::string> qwen_ignore = json::parse(hf_config_json(qwen_next_tiny()))["quantization_config"]["ignore"];
  EXPECT_NE(std::find(qwen_ignore.begin(), qwen_ignore.end(), "model.layers.0.mlp.gate"), qwen_ignore.end());
  const MoeConfig back = parse_hf_config(text, "c.json");
  EXPECT_TRUE(back.int4);
  EXPECT_FALSE(back.fp8);
  EXPECT_FALSE(back.int4_shared);
  EXPECT_EQ(back.int4_group_size, 32);
  // The shared expert int4 (not ignored), groups of 64; and Qwen3-Next, whose shared-expert gate is ignored too.
  MoeConfig s = with_int4(kimi_tiny(), 64, true);
  s.moe_intermediate = s.shared_intermediate = 64;
  const MoeConfig sb = parse_hf_config(hf_config_json(s), "c.json");
  EXPECT_TRUE(sb.int4_shared);
  EXPECT_EQ(sb.int4_group_size, 64);
  const MoeConfig qb = parse_hf_config(hf_config_json(qwen_next_tiny()), "c.json");
  EXPECT_TRUE(qb.int4);
  EXPECT_FALSE(qb.int4_shared);
  // Every family writes and reads the format.
  for (const TinyConfig& t : tiny_configs(2)) {
    MoeConfig x = with_int4(t.config);
    if (x.model_type.rfind("qwen", 0) != 0 && x.has_shared_expert()) x.shared_intermediate = x.moe_intermediate;
    const MoeConfig xb = parse_hf_config(hf_config_json(x), t.name);
    EXPECT_TRUE(xb.int4) << t.name;
    EXPECT_EQ(xb.int4_shared, false) << t.name;
  }
}

// The published layout: exact names, regex patterns matched from the start of the module name (a Qwen
// router is a Linear, so the list must keep it bf16).
TEST(Int4Config, IgnoreEntriesAreExactNamesOrPatternsFromTheStart) {
  json j = json::parse(hf_config_json(qwen_next_tiny()));
  j["quantization_config"]["ignore"] = {"lm_head", "re:.*self_attn.*", "re:.*shared_expert\\..*",
                                        "re:.*shared_expert_gate$", "re:model\\.layers\\.\\d+\\.mlp\\.gate$"};
  EXPECT_TRUE(parse_hf_config(j.dump(), "c.json").int4);
  // "mlp.gate$" is not found in the middle of the name: re.match anchors at the start.
  j["quantization_config"]["ignore"] = {"re:.*shared_expert\\..*", "re:.*shared_expert_gate$", "re:mlp\\.gate$"};
  expect_error([&] { parse_hf_config(j.dump(), "m/config.json"); },
               {"m/config.json", "'quantization_config.ignore'", "model.layers.0.mlp.gate", "router"});
}

TEST(Int4Config, EachUnsupportedVariantIsANamedError) {
  const std::string f = "m/config.json";
  const auto rejects = [&](const std::function<void(json&)>& edit, std::vector<std::string> words,
                           const MoeConfig& base = kimi_tiny()) {
    json j = json::parse(hf_config_json(base));
    edit(j);
    words.push_back(f);
    expect_error([&] { parse_hf_config(j.dump(), f); }, words, words[0]);
  };
  const auto w = [](json& j) -> json& { return j["quantization_config"]["config_groups"]["group_0"]["weights"]; };
  const std::string wp = "'quantization_config.config_groups.group_0.weights.";
  rejects([&](json& j) { w(j)["num_bits"] = 8; }, {wp + "num_bits'", "must be 4", "8"});
  rejects([&](json& j) { w(j)["type"] = "float"; }, {wp + "type'", "'float'"});
  rejects([&](json& j) { w(j)["symmetric"] = false; }, {wp + "symmetric'", "asymmetric"});
  rejects([&](json& j) { w(j)["strategy"] = "channel"; }, {wp + "strategy'", "'channel'"});
  rejects([&](json& j) { w(j)["group_size"] = 48; }, {wp + "group_size'", "power of two", "48"});
  rejects([&](json& j) { w(j)["group_size"] = 16; }, {wp + "group_size'", "16"});
  rejects([&](json& j) { w(j)["group_size"] = 64; }, {wp + "group_size'", "does not divide", "moe_intermediate_size 32"});
  rejects([&](json& j) { w(j)["group_size"] = 128; }, {wp + "group_size'", "does not divide", "hidden_size 64"});
  rejects([&](json& j) { w(j)["dynamic"] = true; }, {wp + "dynamic'", "dynamic"});
  rejects([&](json& j) { w(j)["actorder"] = "group"; }, {wp + "actorder'", "weight_g_idx"});
  rejects([&](json& j) { j["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}, {"dynamic", true}}; },
          {"'quantization_config.config_groups.group_0.input_activations'", "activations"});
  rejects([&](json& j) { j["quantization_config"]["format"] = "int-quantized"; },
          {"'quantization_config.format'", "'int-quantized'", "pack-quantized"});
  rejects([&](json& j) { j["quantization_config"]["config_groups"]["group_1"] = j["quantization_config"]["config_groups"]["group_0"]; },
          {"'quantization_config.config_groups'", "exactly one group"});
  rejects([&](json& j) { j["quantization_config"]["config_groups"]["group_0"]["targets"] = {"re:.*experts.*"}; },
          {"'quantization_config.config_groups.group_0.targets'", "Linear"});
  // The ignore list: no routed expert may be in it, the shared expert all or nothing; a Qwen (Linear) router
  // must be (below), a DeepSeek-style one need not: Kimi-K2-Thinking's own list, which names no router, loads.
  {
    json j = json::parse(hf_config_json(kimi_tiny()));
    j["quantization_config"]["ignore"] = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                          "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"};
    EXPECT_TRUE(parse_hf_config(j.dump(), "config.json").int4) << j["quantization_config"].dump();
  }
  rejects([&](json& j) { j["quantization_config"]["ignore"].push_back("re:.*experts\\.5\\.down_proj$"); },
          {"'quantization_config.ignore'", "re:.*experts\\.5\\.down_proj$", "model.layers.1.mlp.experts.5.down_proj", "unquantized"});
  rejects([&](json& j) { j["quantization_config"]["ignore"].push_back("model.layers.2.mlp.experts.0.up_proj"); },
          {"'quantization_config.ignore'", "model.layers.2.mlp.experts.0.up_proj", "unquantized"});
  rejects([&](json& j) { j["quantization_config"]["ignore"] = {"re:.*mlp\\.gate$", "re:.*shared_experts\\.(gate|up)_proj"}; },
          {"'quantization_config.ignore'", "shared_experts.up_proj", "shared_experts.down_proj", "all int4 or all bf16"});
  rejects([&](json& j) { j["quantization_config"]["ignore"] = {"re:.*mlp\\.gate$", "re:model\\.layers\\.1\\.mlp\\.shared_experts.*"}; },
          {"'quantization_config.ignore'", "model.layers.2.mlp.shared_experts.", "every layer"});
  rejects([&](json& j) { j["quantization_config"]["ignore"].push_back("re:(unclosed"); },
          {"'quantization_config.ignore'", "re:(unclosed", "regular expression"});
  // int4 shared experts need whole groups too (48 columns are not groups of 32).
  MoeConfig q = qwen_next_tiny();
  rejects([&](json& j) { j["quantization_config"]["ignore"] = {"re:.*mlp\\.gate$", "re:.*shared_expert_gate$"}; },
          {"shared expert's width 48", "ignore"}, q);
  rejects([&](json& j) { j["quantization_config"]["ignore"] = {"re:.*mlp\\.gate$", "re:.*shared_expert\\..*"}; },
          {"model.layers.0.mlp.shared_expert_gate", "shared-expert gate"}, q);
  rejects([&](json& j) { j["quantization_config"]["ignore"] = {"re:.*shared_expert\\..*", "re:.*shared_expert_gate$"}; },
          {"model.layers.0.mlp.gate", "router", "bf16"}, q);
}

// ---- checkpoints --------------------------------------------------------------------------------------------

void expect_same_view(const WeightView& a, const WeightView& b, const std::string& what) {
  ASSERT_EQ(a.dtype, b.dtype) << what;
  ASSERT_EQ(a.rows, b.rows) << what;
  ASSERT_EQ(a.cols, b.cols) << what;
  if (a.dtype == DType::kInt4) {
    ASSERT_EQ(a.group_size, b.group_size) << what;
    EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.rows * a.cols / 2)), 0) << what;
    EXPECT_EQ(std::memcmp(a.group_scale, b.group_scale, static_cast<size_t>(a.rows * (a.cols / a.group_size)) * 2), 0) << what;
  } else {
    EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.rows * a.cols) * dtype_size(a.dtype)), 0) << what;
  }
}

void expect_same_layer(const LayerWeights& got, const LayerWeights& want, const std::string& what) {
  expect_same_view(got.router, want.router, what + " router");
  ASSERT_EQ(got.num_local_experts(), want.num_local_experts()) << what;
  EXPECT_EQ(got.first_expert, want.first_expert) << what;
  for (size_t e = 0; e < got.experts.size(); ++e) {
    expect_same_view(got.experts[e].gate, want.experts[e].gate, what + " gate " + std::to_string(e));
    expect_same_view(got.experts[e].up, want.experts[e].up, what + " up " + std::to_string(e));
    expect_same_view(got.experts[e].down, want.experts[e].down, what + " down " + std::to_string(e));
  }
  if (!want.shared.gate.empty()) {
    expect_same_view(got.shared.gate, want.shared.gate, what + " shared gate");
    expect_same_view(got.shared.down, want.shared.down, what + " shared down");
  }
}

TEST(Int4Checkpoint, EveryFamilyRoundTripsAsMappedViews) {
  std::vector<TinyConfig> configs;
  for (const TinyConfig& t : tiny_configs(2)) {
    MoeConfig x = with_int4(t.config);
    if (x.model_type.rfind("qwen", 0) != 0 && x.has_shared_expert()) x.shared_intermediate = x.moe_intermediate;
    configs.push_back({t.name, x});
  }
  for (const TinyConfig& t : tiny_int4_configs()) configs.push_back(t);
  for (const TinyConfig& t : configs) {
    ScratchDir dir;
    CheckpointOptions o;
    o.dtype = DType::kInt4;
    o.seed = 11;
    o.shard_bytes = 20'000;  // several shards
    write_checkpoint(dir.path(), t.config, o);
    ModelDir md(dir.path());
    EXPECT_TRUE(md.config().int4) << t.name;
    EXPECT_EQ(md.config().int4_shared, t.config.int4_shared) << t.name;
    const LayerWeights got = load_layer(md, 0);
    const LayerWeights want = make_random_weights(t.config, {.dtype = DType::kInt4, .seed = 11});
    expect_same_layer(got, want, t.name);
    // The words are the mapped file's, not a copy.
    const TensorStore::Found f = md.tensors().get("model.layers.0.mlp.experts.1.up_proj.weight_packed");
    EXPECT_EQ(got.experts[1].up.data, f.data) << t.name;
    EXPECT_EQ(f.info->dtype, StDType::kI32) << t.name;
    // An expert-parallel rank's share: experts [3, 5).
    const LayerWeights part = load_layer(md, 0, 2, 3);
    const LayerWeights want_part =
        make_random_weights(t.config, {.dtype = DType::kInt4, .seed = 11, .num_local_experts = 2, .first_expert = 3});
    expect_same_layer(part, want_part, t.name + " experts [3, 5)");
  }
}

TEST(Int4Checkpoint, FusedLayoutIsRefusedForInt4) {
  ScratchDir dir;
  CheckpointOptions o;
  o.dtype = DType::kInt4;
  o.fused_experts = true;
  expect_error([&] { write_checkpoint(dir.path(), kimi_tiny(), o); }, {"fused", "int4"});
}

void rewrite(const std::string& path, const std::function<bool(TensorSpec&, std::string&)>& edit) {
  std::vector<std::pair<TensorSpec, std::string>> items;
  {
    auto f = SafetensorsFile::open(path);
    for (const auto& t : f->header().tensors) {
      TensorSpec s{t.name, t.dtype, t.shape};
      std::string bytes(static_cast<const char*>(f->data(t)), t.bytes());
      if (edit(s, bytes)) items.emplace_back(s, bytes);
    }
  }
  std::vector<TensorData> data;
  for (const auto& [s, b] : items) data.push_back({s, b.data()});
  write_safetensors(path, data);
}

TEST(Int4Checkpoint, MalformedTensorsNameTensorFileExpectedAndGot) {
  ScratchDir root;
  const MoeConfig c = kimi_tiny();
  const std::string m = "model.layers.1.mlp.experts.2.down_proj";  // [H, I] = [64, 32]: packed [64, 4]
  int n = 0;
  const auto fresh = [&](const std::function<bool(TensorSpec&, std::string&)>& edit) {
    const std::string d = root / ("case" + std::to_string(n++));
    CheckpointOptions o;
    o.dtype = DType::kInt4;
    write_checkpoint(d, c, o);
    rewrite(d + "/model.safetensors", edit);
    return d;
  };
  const std::string file = "model.safetensors";
  std::string d = fresh([&](TensorSpec& s, std::string& b) {
    if (s.name == m + ".weight_packed") {
      s.shape = {64, 2};
      b.resize(64 * 2 * 4);
    }
    return true;
  });
  expect_error([&] { load_layer(d, c, 1); }, {m + ".weight_packed", file, "[64, 2]", "expected [64, 4]"});
  d = fresh([&](TensorSpec& s, std::string&) {
    if (s.name == m + ".weight_packed") {
      s.dtype = StDType::kU8;
      s.shape = {64, 16};
    }
    return true;
  });
  expect_error([&] { load_layer(d, c, 1); }, {m + ".weight_packed", file, "[64, 16]", "expected [64, 4]"});
  d = fresh([&](TensorSpec& s, std::string&) {
    if (s.name == m + ".weight_packed") s.dtype = StDType::kF32;
    return true;
  });
  expect_error([&] { load_layer(d, c, 1); }, {m + ".weight_packed", file, "F32", "expected I32"});
  d = fresh([&](TensorSpec& s, std::string& b) {
    if (s.name == m + ".weight_shape") {
      const int64_t v[2] = {32, 64};  // transposed
      std::memcpy(b.data(), v, sizeof v);
    }
    return true;
  });
  expect_error([&] { load_layer(d, c, 1); }, {m + ".weight_shape", file, "holds [32, 64]", "expected [64, 32]"});
  d = fresh([&](TensorSpec& s, std::string& b) {  // I32 weight_shape is accepted as well
    if (s.name == m + ".weight_shape") {
      const int32_t v[2] = {64, 32};
      s.dtype = StDType::kI32;
      b.assign(reinterpret_cast<const char*>(v), sizeof v);
    }
    return true;
  });
  EXPECT_NO_THROW(load_layer(d, c, 1));
  d = fresh([&](TensorSpec& s, std::string&) { return s.name != m + ".weight_shape"; });
  expect_error([&] { load_layer(d, c, 1); }, {m + ".weight_shape", "not found"});
  d = fresh([&](TensorSpec& s, std::string& b) {
    if (s.name == m + ".weight_scale") {
      s.shape = {64, 2};
      b.resize(64 * 2 * 2);
    }
    return true;
  });
  expect_error([&] { load_layer(d, c, 1); }, {m + ".weight_scale", file, "[64, 2]", "expected [64, 1]"});
  d = fresh([&](TensorSpec& s, std::string& b) {
    if (s.name == m + ".weight_scale") {
      s.dtype = StDType::kF32;
      b.resize(64 * 4);
    }
    return true;
  });
  expect_error([&] { load_layer(d, c, 1); }, {m + ".weight_scale", file, "F32", "expected BF16"});
  // A bf16 expert where the config says int4, and int4 tensors where the config says bf16.
  d = fresh([&](TensorSpec& s, std::string& b) {
    if (s.name == m + ".weight_packed") {
      s.name = m + ".weight";
      s.dtype = StDType::kBF16;
      s.shape = {64, 32};
      b.resize(64 * 32 * 2);
    }
    return s.name.rfind(m + ".weight_", 0) != 0;
  });
  expect_error([&] { load_layer(d, c, 1); }, {m + ".weight_packed", m + ".weight", "unquantized", "not in ignore"});
  MoeConfig bf16 = c;
  bf16.int4 = false;
  expect_error([&] { load_layer(root / "case0", bf16, 1); }, {".weight'", "not found", "weight_packed", "does not quantize"});
  // Only the experts a rank loads are read: a broken expert 2 does not stop experts [3, 8).
  EXPECT_NO_THROW(load_layer(root / "case0", c, 1, 5, 3));
}

TEST(Int4Weights, ValidateChecksDtypesAgainstTheConfig) {
  const MoeConfig c = kimi_tiny();
  LayerWeights w = make_random_weights(c, {.dtype = DType::kInt4, .seed = 1});
  EXPECT_NO_THROW(w.validate(c));
  EXPECT_EQ(w.shared.gate.dtype, DType::kBF16);  // in ignore
  LayerWeights bad = make_random_weights(c, {.dtype = DType::kInt4, .seed = 1});
  bad.experts[1].gate.group_size = 64;
  expect_error([&] { bad.validate(c); }, {"mlp.experts.1.gate_proj", "groups of 64", "group_size is 32"});
  bad.experts[1].gate.group_size = 32;
  bad.experts[2].down.group_size = 64;  // 32 columns: no whole group
  expect_error([&] { bad.validate(c); }, {"mlp.experts.2.down_proj", "whole groups", "group size 64, 32 columns"});
  MoeConfig shared = with_int4(c, 32, true);
  expect_error([&] { w.validate(shared); }, {"mlp.shared_expert.gate_proj", "bf16", "expected int4"});
  expect_error([&] { make_random_weights(c, {.dtype = DType::kBF16}); }, {"int4 config", "bf16"});
  MoeConfig plain = c;
  plain.int4 = false;
  expect_error([&] { make_random_weights(plain, {.dtype = DType::kInt4}); }, {"int4 weights need an int4 config"});
  EXPECT_EQ(plain.layer_weight_bytes_of(3, DType::kBF16), plain.layer_weight_bytes(3, 2));
  // 3 experts of 3 int4 matrices 64x32 (1 KiB of words, 128 B of scales) + bf16 shared + bf16 router.
  EXPECT_EQ(c.layer_weight_bytes_of(3, DType::kInt4), 3 * 3 * (1024 + 128) + 3 * 64 * 32 * 2 + 8 * 64 * 2);
}

}  // namespace
}  // namespace moe
