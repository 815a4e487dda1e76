// Loading one MoE layer's weights from a Hugging Face model directory, as views into the memory-mapped
// safetensors shards (no copies: a 3 GiB layer costs only the pages the computation touches).
//
// Tensor names (moe-spec.md section 4), prefix model.layers.{i}.mlp.:
//   gate.weight [E, H] (F32/BF16), gate.e_score_correction_bias [E] (F32; BF16 converted; noaux_tc only),
//   experts.{e}.{gate,up}_proj.weight [I, H], experts.{e}.down_proj.weight [H, I]  (per-expert layout), or
//   experts.gate_up_proj [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up) and experts.down_proj [E, H, I]
//     (transformers v5 fused layout; per-expert views into the one tensor),
//   shared_expert.* (Qwen) or shared_experts.* (DeepSeek family), shared_expert_gate.weight [1, H] (Qwen).
// Weights may be F32, BF16 or F8_E4M3; fp8 needs *.weight_scale_inv F32 [ceil(out/128), ceil(in/128)].
// With an int4 quantization_config (compressed-tensors pack-quantized) each quantized projection <m> is
//   <m>.weight_packed I32 [out, in/8], <m>.weight_scale BF16 [out, in/group], <m>.weight_shape I32/I64 [2]
// (the routed experts; the shared expert too unless ignored), mapped as stored.
//
//   ModelDir dir("/models/Qwen3-Next-80B-A3B");
//   LayerWeights w = load_layer(dir, 0);     // dir.config() from config.json
#pragma once

#include <cstdint>
#include <string>

#include "io/tensor_store.h"
#include "model/config.h"
#include "model/weights.h"

namespace moe {

class ModelDir {
 public:
  // Reads <dir>/config.json (ConfigError on a bad one) and the shard index (IoError).
  explicit ModelDir(const std::string& dir);
  // Uses `config` instead of config.json (which need not exist).
  ModelDir(const std::string& dir, const MoeConfig& config);

  const std::string& dir() const { return dir_; }
  const MoeConfig& config() const { return config_; }
  TensorStore& tensors() { return store_; }

 private:
  std::string dir_;
  MoeConfig config_;
  TensorStore store_;
};

// Experts [first_expert, first_expert + num_local_experts) (-1: to the last) of decoder layer `layer`: only
// those are mapped (an expert-parallel rank's share). Throws IoError naming the tensor, its file (or the
// index) and the expected shape for a missing or mis-shaped tensor, and for a dense layer.
// LayerWeights::storage keeps the mappings alive.
LayerWeights load_layer(ModelDir& dir, int64_t layer, int64_t num_local_experts = -1, int64_t first_expert = 0);
LayerWeights load_layer(const std::string& model_dir, const MoeConfig& config, int64_t layer,
                        int64_t num_local_experts = -1, int64_t first_expert = 0);

// "model.layers.{layer}.mlp."
std::string layer_prefix(int64_t layer);

}  // namespace moe
