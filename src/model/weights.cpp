#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <thread>

#include "model/host_buffer.h"

namespace moe {

namespace {

void check_view(const WeightView& w, const std::string& name, int64_t rows, int64_t cols) {
  if (w.empty()) throw ConfigError("weight '" + name + "' is missing");
  if (w.rows != rows || w.cols != cols)
    throw ConfigError("weight '" + name + "' has shape [" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                      "], expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  if (w.dtype == DType::kF8E4M3 && w.scale_inv == nullptr)
    throw ConfigError("weight '" + name + "' is fp8 but has no weight_scale_inv");
  if (w.dtype == DType::kInt4 && (w.group_scale == nullptr || w.group_size <= 0 || w.cols % w.group_size != 0))
    throw ConfigError("weight '" + name + "' is int4 but has no weight_scale of whole groups (group size " +
                      std::to_string(w.group_size) + ", " + std::to_string(w.cols) + " columns)");
}

// The dtype rule of int4 configs: routed experts int4 with the config's group size, the shared expert int4
// exactly when int4_shared; no int4 elsewhere and none without config.int4.
void check_int4(const WeightView& w, const std::string& name, const MoeConfig& c, bool want_int4) {
  if ((w.dtype == DType::kInt4) != want_int4)
    throw ConfigError("weight '" + name + "' is " + std::string(dtype_name(w.dtype)) + ", expected " +
                      (want_int4 ? "int4 (quantization_config quantizes it)"
                       : c.int4  ? "bf16 or f32 (quantization_config ignores it)"
                                 : "no int4 (the config has no int4 quantization_config)"));
  if (want_int4 && w.group_size != c.int4_group_size)
    throw ConfigError("weight '" + name + "' has int4 groups of " + std::to_string(w.group_size) +
                      " columns, the config's group_size is " + std::to_string(c.int4_group_size));
}

void check_expert(const ExpertWeights& e, const std::string& name, int64_t h, int64_t i, const MoeConfig& c,
                  bool int4) {
  check_view(e.gate, name + ".gate_proj", i, h);
  check_view(e.up, name + ".up_proj", i, h);
  check_view(e.down, name + ".down_proj", h, i);
  check_int4(e.gate, name + ".gate_proj", c, int4);
  check_int4(e.up, name + ".up_proj", c, int4);
  check_int4(e.down, name + ".down_proj", c, int4);
}

// splitmix64: a stateless, seekable generator, so every tensor's values depend only on (seed, tensor id).
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform in [-1, 1).
float uniform(uint64_t seed, uint64_t i) {
  return static_cast<float>(static_cast<int64_t>(mix(seed ^ mix(i)) >> 40) - (int64_t{1} << 23)) /
         static_cast<float>(int64_t{1} << 23);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Filler {
  uint64_t seed;
  float scale_override;
  std::vector<std::any>& storage;
  int64_t group_size = 0;  // int4
  std::shared_ptr<HostBuffer> chunk = nullptr;  // the buffer alloc() cuts from
  size_t used = 0;

  // `bytes` at a 64-byte boundary, cut from chunks of 16 requests' size (64 MiB at most), so that matrices
  // smaller than a huge page lie side by side in 2 MiB pages as in a checkpoint's mapping: a buffer of
  // their own gave a Qwen3-Next int4 expert (576 KiB) 4 KiB pages, and the int4 layer ran up to 2x slower.
  template <class T>
  T* alloc(size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (!chunk || used + bytes > chunk->size()) {
      chunk = std::make_shared<HostBuffer>(std::max(bytes, std::min(size_t{64} << 20, 16 * bytes)));
      storage.emplace_back(chunk);
      used = 0;
    }
    T* p = reinterpret_cast<T*>(static_cast<char*>(chunk->data()) + used);
    used += bytes;
    return p;
  }

  // Random int4 codes (any of the 16) and random bf16 group scales around scale / 4.5, so that the weights
  // have about the magnitude of the other dtypes' (the codes' standard deviation is 4.6).
  WeightView make_int4(int64_t rows, int64_t cols, float scale, uint64_t ts) {
    WeightView w;
    w.dtype = DType::kInt4;
    w.rows = rows;
    w.cols = cols;
    w.group_size = group_size;
    const int64_t words = rows * cols / kInt4PerWord, groups = rows * (cols / group_size);
    auto* packed = alloc<uint32_t>(static_cast<size_t>(words) * 4);
    auto* scales = alloc<uint16_t>(static_cast<size_t>(groups) * 2);
    for (int64_t g = 0; g < groups; ++g)
      scales[g] = f32_to_bf16(scale / 4.5f * (1.0f + 0.5f * uniform(ts ^ 0x5ca1e, static_cast<uint64_t>(g))));
    auto fill = [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) packed[i] = static_cast<uint32_t>(mix(ts ^ mix(static_cast<uint64_t>(i))));
    };
    if (words >= (int64_t{1} << 21)) {
      std::thread t(fill, 0, words / 2);
      fill(words / 2, words);
      t.join();
    } else {
      fill(0, words);
    }
    w.data = packed;
    w.group_scale = scales;
    return w;
  }

  WeightView make(DType dtype, int64_t rows, int64_t cols, uint64_t tensor_id) {
    WeightView w;
    w.dtype = dtype;
    w.rows = rows;
    w.cols = cols;
    const float scale = scale_override > 0 ? scale_override : 1.0f / std::sqrt(static_cast<float>(cols));
    const uint64_t ts = mix(seed * 0x100000001b3ull + tensor_id);
    if (dtype == DType::kInt4) return make_int4(rows, cols, scale, ts);
    const int64_t n = rows * cols;
    void* data = alloc<void>(static_cast<size_t>(n) * dtype_size(dtype));
    if (dtype == DType::kF8E4M3) {
      const int64_t nb = ceil_div(rows, 128) * ceil_div(cols, 128);
      float* scales = alloc<float>(static_cast<size_t>(nb) * 4);
      // Block scales around scale/448*4 so that codes span a useful part of the e4m3 range.
      for (int64_t b = 0; b < nb; ++b) scales[b] = scale / 112.0f * (1.0f + 0.5f * uniform(ts ^ 0x5ca1e, b));
      w.scale_inv = scales;
    }
    auto fill = [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float v = uniform(ts, static_cast<uint64_t>(i));
        switch (dtype) {
          case DType::kF32: static_cast<float*>(data)[i] = v * scale; break;
          case DType::kBF16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(v * scale); break;
          case DType::kF8E4M3: {
            // A random code in [-224, 224] (the scale carries the magnitude); never NaN.
            static_cast<uint8_t*>(data)[i] = f32_to_fp8e4m3(v * 224.0f);
            break;
          }
          case DType::kInt4: break;  // make_int4

        }
      }
    };
    if (n >= (int64_t{1} << 22)) {
      std::thread t(fill, 0, n / 2);
      fill(n / 2, n);
      t.join();
    } else {
      fill(0, n);
    }
    w.data = data;
    attach_fp8_codes(w, storage);
    return w;
  }
};

}  // namespace

void attach_fp8_codes(WeightView& w, std::vector<std::any>& storage) {
  if (w.dtype != DType::kF8E4M3 || w.empty()) return;
  auto buf = std::make_shared<HostBuffer>(static_cast<size_t>(fp8_block_codes_size(w)));
  fp8_block_codes(w, buf->as<uint8_t>());
  w.fp8_codes = buf->as<uint8_t>();
  storage.emplace_back(std::move(buf));
}

void LayerWeights::validate(const MoeConfig& c) const {
  const int64_t h = c.hidden;
  check_view(router, "mlp.gate.weight", c.num_experts, h);
  if (router.dtype == DType::kF8E4M3 || router.dtype == DType::kInt4)
    throw ConfigError("weight 'mlp.gate.weight' must be f32 or bf16, not " + std::string(dtype_name(router.dtype)));
  if (c.correction_bias && correction_bias == nullptr)
    throw ConfigError("weight 'mlp.gate.e_score_correction_bias' is missing (model_type " + c.model_type + ")");
  if (first_expert < 0 || first_expert + num_local_experts() > c.num_experts)
    throw ConfigError("layer holds experts [" + std::to_string(first_expert) + ", " +
                      std::to_string(first_expert + num_local_experts()) + "), outside the " +
                      std::to_string(c.num_experts) + " experts of the config");
  if (num_local_experts() < 1 || num_local_experts() > c.num_experts)
    throw ConfigError("layer has " + std::to_string(num_local_experts()) + " local experts, expected 1.." +
                      std::to_string(c.num_experts));
  for (int64_t e = 0; e < num_local_experts(); ++e)
    check_expert(experts[static_cast<size_t>(e)], "mlp.experts." + std::to_string(first_expert + e), h,
                 c.moe_intermediate, c, c.int4);
  if (c.has_shared_expert()) check_expert(shared, "mlp.shared_expert", h, c.shared_intermediate, c, c.int4 && c.int4_shared);
  if (c.shared_expert_gate) {
    check_view(shared_gate, "mlp.shared_expert_gate.weight", 1, h);
    check_int4(shared_gate, "mlp.shared_expert_gate.weight", c, false);
  }
  check_int4(router, "mlp.gate.weight", c, false);
}

LayerWeights make_random_weights(const MoeConfig& c, const RandomWeightOptions& o) {
  c.validate();
  if ((o.dtype == DType::kInt4) != c.int4)
    throw ConfigError(o.dtype == DType::kInt4 ? "int4 weights need an int4 config (quantization_config: config.int4)"
                                              : "an int4 config (quantization_config) needs int4 weights, got " +
                                                    std::string(dtype_name(o.dtype)));
  LayerWeights w;
  Filler f{o.seed, o.scale, w.storage, c.int4_group_size};
  const DType router_dtype = o.dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  // Router rows scaled up so that routing is decisive, as in a trained router.
  Filler fr{o.seed, o.scale > 0 ? o.scale : 4.0f / std::sqrt(static_cast<float>(c.hidden)), w.storage};
  w.router = fr.make(router_dtype, c.num_experts, c.hidden, 1);
  if (c.correction_bias) {
    auto b = std::make_shared<HostBuffer>(static_cast<size_t>(c.num_experts) * 4);
    for (int64_t e = 0; e < c.num_experts; ++e) b->as<float>()[e] = 0.05f * uniform(mix(o.seed + 7), e);
    w.correction_bias = b->as<float>();
    w.storage.emplace_back(b);
  }
  if (o.first_expert < 0 || o.first_expert >= c.num_experts)
    throw ConfigError("first_expert: must be in [0, " + std::to_string(c.num_experts) + "), got " +
                      std::to_string(o.first_expert));
  const int64_t n_local = o.num_local_experts < 0 ? c.num_experts - o.first_expert : o.num_local_experts;
  if (n_local < 1 || o.first_expert + n_local > c.num_experts)
    throw ConfigError("--experts: must be in [1, " + std::to_string(c.num_experts - o.first_expert) + "], got " +
                      std::to_string(n_local));
  const int64_t h = c.hidden, i = c.moe_intermediate;
  w.first_expert = o.first_expert;
  for (int64_t e = 0; e < n_local; ++e) {
    const uint64_t id = 16 + 4 * static_cast<uint64_t>(o.first_expert + e);
    w.experts.push_back({f.make(o.dtype, i, h, id), f.make(o.dtype, i, h, id + 1), f.make(o.dtype, h, i, id + 2)});
  }
  if (c.has_shared_expert()) {
    const int64_t s = c.shared_intermediate;
    const DType st = o.dtype == DType::kInt4 && !c.int4_shared ? DType::kBF16 : o.dtype;
    w.shared = {f.make(st, s, h, 2), f.make(st, s, h, 3), f.make(st, h, s, 4)};
  }
  if (c.shared_expert_gate) w.shared_gate = fr.make(router_dtype, 1, h, 5);
  return w;
}

std::vector<WeightView> LayerWeights::views() const {
  std::vector<WeightView> out;
  auto add = [&](const WeightView& v) {
    if (!v.empty()) out.push_back(v);
  };
  auto add_expert = [&](const ExpertWeights& e) {
    add(e.gate);
    add(e.up);
    add(e.down);
  };
  add(router);
  add(shared_gate);
  add_expert(shared);
  for (const ExpertWeights& e : experts) add_expert(e);
  return out;
}

}  // namespace moe
