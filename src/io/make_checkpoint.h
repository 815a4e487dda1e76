// Writing a small (or real-size) Hugging Face model directory for tests and demos: config.json with the
// family's real field names, safetensors shards with the real tensor names of moe-spec.md section 4, and
// model.safetensors.index.json when there is more than one shard. The values are make_random_weights() of the
// same config and seed, so a checkpoint and a preset run with one seed see identical weights (every written
// layer holds the same values). Tensors are generated and written a slice of experts at a time, so writing a
// 3 GiB layer needs about chunk_bytes of memory, not 3 GiB.
//
//   CheckpointOptions o;  o.seed = 7;  o.shard_bytes = 64 << 20;
//   write_checkpoint("/tmp/qwen-next", find_preset("qwen3-next-80b-a3b").config, o);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "model/config.h"

namespace moe {

struct CheckpointOptions {
  DType dtype = DType::kBF16;  // expert and shared weights; kF8E4M3 writes weight_scale_inv and a
                               // quantization_config; kInt4 writes compressed-tensors pack-quantized routed
                               // experts (groups of config.int4_group_size; the shared expert too if
                               // config.int4_shared, else bf16) and Kimi-K2-Thinking's quantization_config;
                               // the router is F32 if dtype is F32, else BF16
  uint64_t seed = 0;
  std::vector<int64_t> layers;  // MoE layers to write; empty: the first MoE layer
  uint64_t shard_bytes = uint64_t{4} << 30;  // a shard is closed before it would pass this (one bigger tensor
                                             // gets a shard of its own)
  bool fused_experts = false;  // experts.gate_up_proj / experts.down_proj (bf16/f32 only)
  uint64_t chunk_bytes = uint64_t{256} << 20;  // expert weights generated at a time
};

// Writes into `dir` (created if needed). A checkpoint already there is replaced as a whole (its config.json,
// index and model*.safetensors files; other files stay). All or nothing: on an error nothing changes (a
// directory created for the write is removed again), and a write killed half way leaves either the previous
// checkpoint, unchanged, or a directory without config.json, which does not load (the commit protocol is in
// make_checkpoint.cpp). Throws ConfigError for an
// invalid config or layer list, IoError naming the file for one that cannot be written.
void write_checkpoint(const std::string& dir, const MoeConfig& config, const CheckpointOptions& options);

}  // namespace moe
