#include "model/weights.h"

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
}

void check_expert(const ExpertWeights& e, const std::string& name, int64_t h, int64_t i) {
  check_view(e.gate, name + ".gate_proj", i, h);
  check_view(e.up, name + ".up_proj", i, h);
  check_view(e.down, name + ".down_proj", h, i);
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

  WeightView make(DType dtype, int64_t rows, int64_t cols, uint64_t tensor_id) {
    WeightView w;
    w.dtype = dtype;
    w.rows = rows;
    w.cols = cols;
    const float scale = scale_override > 0 ? scale_override : 1.0f / std::sqrt(static_cast<float>(cols));
    const uint64_t ts = mix(seed * 0x100000001b3ull + tensor_id);
    const int64_t n = rows * cols;
    auto buf = std::make_shared<HostBuffer>(static_cast<size_t>(n) * dtype_size(dtype));
    float* scales = nullptr;
    if (dtype == DType::kF8E4M3) {
      const int64_t nb = ceil_div(rows, 128) * ceil_div(cols, 128);
      auto sbuf = std::make_shared<HostBuffer>(static_cast<size_t>(nb) * 4);
      scales = sbuf->as<float>();
      // Block scales around scale/448*4 so that codes span a useful part of the e4m3 range.
      for (int64_t b = 0; b < nb; ++b) scales[b] = scale / 112.0f * (1.0f + 0.5f * uniform(ts ^ 0x5ca1e, b));
      storage.emplace_back(sbuf);
      w.scale_inv = scales;
    }
    auto fill = [&, buf](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const float v = uniform(ts, static_cast<uint64_t>(i));
        switch (dtype) {
          case DType::kF32: buf->as<float>()[i] = v * scale; break;
          case DType::kBF16: buf->as<uint16_t>()[i] = f32_to_bf16(v * scale); break;
          case DType::kF8E4M3: {
            // A random code in [-224, 224] (the scale carries the magnitude); never NaN.
            buf->as<uint8_t>()[i] = f32_to_fp8e4m3(v * 224.0f);
            break;
          }
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
    w.data = buf->data();
    storage.emplace_back(buf);
    return w;
  }
};

}  // namespace

void LayerWeights::validate(const MoeConfig& c) const {
  const int64_t h = c.hidden;
  check_view(router, "mlp.gate.weight", c.num_experts, h);
  if (router.dtype == DType::kF8E4M3) throw ConfigError("weight 'mlp.gate.weight' must be f32 or bf16, not fp8");
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
                 c.moe_intermediate);
  if (c.has_shared_expert()) check_expert(shared, "mlp.shared_expert", h, c.shared_intermediate);
  if (c.shared_expert_gate) check_view(shared_gate, "mlp.shared_expert_gate.weight", 1, h);
}

LayerWeights make_random_weights(const MoeConfig& c, const RandomWeightOptions& o) {
  c.validate();
  LayerWeights w;
  Filler f{o.seed, o.scale, w.storage};
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
    w.shared = {f.make(o.dtype, s, h, 2), f.make(o.dtype, s, h, 3), f.make(o.dtype, h, s, 4)};
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
