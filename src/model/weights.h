// The weights of one MoE layer, as views. Whoever fills a LayerWeights (the checkpoint loader, the random
// generator) keeps the bytes alive through `storage`; the layer only reads them.
#pragma once

#include <any>
#include <cstdint>
#include <vector>

#include "kernels/weight.h"
#include "model/config.h"

namespace moe {

struct ExpertWeights {
  WeightView gate;  // [I, H]
  WeightView up;    // [I, H]
  WeightView down;  // [H, I]
  int64_t bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }
};

struct LayerWeights {
  WeightView router;                      // [E, H], f32 or bf16 (never fp8 or int4); logits computed in fp32
  const float* correction_bias = nullptr;  // [E] f32, noaux_tc only
  // Experts [first_expert, first_expert + num_local_experts) of E. In one process first_expert is 0, and with
  // fewer than E (--experts N) routing still runs over all E experts and tokens routed elsewhere contribute
  // nothing; under expert parallelism they are one rank's share (ep/communicator.h, first_expert()).
  std::vector<ExpertWeights> experts;
  int64_t first_expert = 0;
  ExpertWeights shared;                   // [Is, H] / [H, Is]; empty views when the model has none
  WeightView shared_gate;                 // [1, H] (Qwen); empty otherwise
  std::vector<std::any> storage;          // owners of the bytes (mappings, buffers)

  int64_t num_local_experts() const { return static_cast<int64_t>(experts.size()); }
  // Every non-empty view: router, shared gate, shared expert, routed experts (for whoever walks the bytes).
  std::vector<WeightView> views() const;
  // Checks every view against the config (shapes, dtypes, presence); throws ConfigError naming the tensor.
  void validate(const MoeConfig& config) const;
};

// Gives an fp8 view its per-block code classes (WeightView::fp8_codes, made by fp8_block_codes() in one read
// of the codes) in a buffer kept alive by `storage`, so that the kernels need not scan each block on every
// call; views of other dtypes are left as they are. The loader and make_random_weights call it.
void attach_fp8_codes(WeightView& w, std::vector<std::any>& storage);

struct RandomWeightOptions {
  DType dtype = DType::kBF16;       // expert and shared weights; the router is bf16 unless dtype is f32;
                                    // int4 (needs config.int4): the shared expert bf16 unless int4_shared
  uint64_t seed = 0;
  int64_t num_local_experts = -1;   // -1: all experts
  // Experts [first_expert, first_expert + num_local_experts) (-1: to the last); each expert's values depend
  // only on (seed, expert id), so a writer can stream a layer a slice of experts at a time.
  int64_t first_expert = 0;
  float scale = 0.0f;               // 0: 1/sqrt(fan_in), like a trained layer's magnitude
};
// Seeded random weights with the layer's real shapes (fp8: random codes with random per-block scales; int4:
// random codes with random bf16 group scales).
LayerWeights make_random_weights(const MoeConfig& config, const RandomWeightOptions& options);

}  // namespace moe
