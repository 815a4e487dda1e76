// Hugging Face config.json <-> MoeConfig for every family of moe-spec.md section 1.
//
// Field names per family:
//   Qwen (qwen2_moe, qwen3_moe, qwen3_next): num_experts, shared_expert_intermediate_size (qwen2_moe and
//     qwen3_next; the shared expert there always has a sigmoid gate), decoder_sparse_step, mlp_only_layers.
//   DeepSeek family (deepseek_v2, deepseek_v3, deepseek_v32, kimi_k2, glm4_moe, glm_moe_dsa): n_routed_experts,
//     n_shared_experts (Is = n_shared_experts * moe_intermediate_size), scoring_func, topk_method, n_group,
//     topk_group, routed_scaling_factor, first_k_dense_replace, moe_layer_freq; glm_moe_dsa also mlp_layer_types.
//   All: hidden_size, moe_intermediate_size, num_experts_per_tok, norm_topk_prob, num_hidden_layers,
//     quantization_config {quant_method "fp8", fmt "e4m3", weight_block_size [128, 128]}, or compressed-tensors
//     {quant_method "compressed-tensors", format "pack-quantized", config_groups: one group of symmetric int4
//     weights with strategy "group", targets ["Linear"], no activation quantisation; ignore: the bf16 modules}
//     (int4 routed experts; docs/model-families.md lists what is checked).
// An absent (or null) field takes transformers' default for that model_type. A field of the wrong JSON type,
// an unknown model_type or an unsupported value throws ConfigError naming the field and the file.
#pragma once

#include <string>
#include <string_view>

#include "model/config.h"

namespace moe {

// Parses config.json text; `source` (a file name) appears in every message. Calls validate() at the end.
MoeConfig parse_hf_config(std::string_view json_text, const std::string& source);
// Reads `path`, a config.json file or a model directory holding one.
MoeConfig load_hf_config(const std::string& path);

// config.json text with the family's real field names, such that parse_hf_config() gives `config` back.
// Throws ConfigError for a config the family's config.json cannot express (e.g. a DeepSeek shared width that
// is not a multiple of moe_intermediate_size).
std::string hf_config_json(const MoeConfig& config);

}  // namespace moe
