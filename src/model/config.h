// The MoE layer's configuration: one struct for every family of docs/model-families.md, filled from a
// Hugging Face config.json (io/hf_config.h) or from a built-in preset (presets()).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace moe {

// Raised for an invalid configuration; what() names the field and what was expected.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Scoring : uint8_t { kSoftmax, kSigmoid };
// kGreedy: top-k of the scores. kGroupLimitedGreedy: DeepSeek-V2, groups scored by their max.
// kNoauxTc: DeepSeek-V3 family, sigmoid + e_score_correction_bias for selection, groups scored by the sum of
// their top two biased scores.
enum class TopkMethod : uint8_t { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct MoeConfig {
  std::string model_type;      // qwen2_moe, qwen3_moe, qwen3_next, deepseek_v2, deepseek_v3, deepseek_v32,
                               // kimi_k2, glm4_moe, glm_moe_dsa
  int64_t hidden = 0;          // H
  int64_t moe_intermediate = 0;  // I, per routed expert
  int64_t num_experts = 0;     // E (routed)
  int64_t top_k = 0;           // k
  int64_t shared_intermediate = 0;  // Is; 0 = no shared expert
  bool shared_expert_gate = false;  // Qwen: shared output scaled by sigmoid(x . w_shared_gate)
  bool norm_topk_prob = false;
  Scoring scoring = Scoring::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  float routed_scaling_factor = 1.0f;
  bool correction_bias = false;  // gate.e_score_correction_bias [E] f32 (noaux_tc)

  // Which decoder layers are MoE layers.
  int64_t num_layers = 1;
  int64_t first_k_dense_replace = 0;  // DeepSeek/Kimi/GLM
  int64_t moe_layer_freq = 1;
  int64_t decoder_sparse_step = 1;    // Qwen
  std::vector<int64_t> mlp_only_layers;   // Qwen
  std::vector<std::string> mlp_layer_types;  // GLM-5 (transformers v5): "sparse" or "dense" per layer

  // fp8 e4m3 weights with block scales (quantization_config.weight_block_size).
  bool fp8 = false;
  int64_t block_rows = 128;
  int64_t block_cols = 128;

  // int4 routed experts in the compressed-tensors pack-quantized format (quantization_config.config_groups,
  // Kimi-K2-Thinking's): symmetric, one bf16 scale per int4_group_size input columns (a power of two >= 32
  // dividing H and I). The router and Qwen's shared-expert gate stay bf16 (listed in quantization_config.ignore);
  // the shared expert is int4 too when int4_shared (not ignored), else bf16.
  bool int4 = false;
  int64_t int4_group_size = 32;
  bool int4_shared = false;

  bool has_shared_expert() const { return shared_intermediate > 0; }
  bool is_moe_layer(int64_t layer) const;
  // Throws ConfigError naming the first bad field (k > experts, experts not divisible by n_group, ...).
  void validate() const;
  // Bytes of the whole layer's weights (all experts) and of what one decode token touches, for a dtype size.
  int64_t layer_weight_bytes(int64_t num_local_experts, int64_t weight_dtype_size) const;
  // The same for the dtype of the expert weights, int4 included (packed words and group scales; a bf16 shared
  // expert where int4_shared is false).
  int64_t layer_weight_bytes_of(int64_t num_local_experts, DType dtype) const;
};

// The family's routing/shared-expert rules for a model_type (sizes left at zero). Throws ConfigError for an
// unknown model type, listing the known ones.
MoeConfig family_defaults(const std::string& model_type);

struct Preset {
  std::string name;         // e.g. "qwen3-next-80b-a3b"
  std::string description;  // the model it reproduces
  MoeConfig config;
};
const std::vector<Preset>& presets();
// Throws ConfigError listing the preset names when `name` is unknown.
const Preset& find_preset(const std::string& name);

}  // namespace moe
