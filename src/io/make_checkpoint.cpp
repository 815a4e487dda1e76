#include "io/make_checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/io_error.h"
#include "io/safetensors_writer.h"
#include "model/weights.h"

namespace moe {

namespace fs = std::filesystem;

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

StDType st_of(DType t) {
  return t == DType::kF32 ? StDType::kF32 : t == DType::kBF16 ? StDType::kBF16 : StDType::kF8E4M3;
}

// The tensors of one layer in file order (the order the generator produces them).
void plan_matrix(std::vector<TensorSpec>& out, const std::string& name, DType t, int64_t rows, int64_t cols) {
  out.push_back({name, st_of(t), {rows, cols}});
  if (t == DType::kF8E4M3) out.push_back({name + "_scale_inv", StDType::kF32, {ceil_div(rows, 128), ceil_div(cols, 128)}});
}

std::vector<TensorSpec> plan_layer(const MoeConfig& c, const CheckpointOptions& o, int64_t layer) {
  const std::string p = layer_prefix(layer);
  const DType rt = o.dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  const int64_t h = c.hidden, i = c.moe_intermediate, e = c.num_experts;
  std::vector<TensorSpec> out;
  plan_matrix(out, p + "gate.weight", rt, e, h);
  if (c.correction_bias) out.push_back({p + "gate.e_score_correction_bias", StDType::kF32, {e}});
  if (c.shared_expert_gate) plan_matrix(out, p + "shared_expert_gate.weight", rt, 1, h);
  if (c.has_shared_expert()) {
    const std::string s = p + (c.model_type.rfind("qwen", 0) == 0 ? "shared_expert." : "shared_experts.");
    plan_matrix(out, s + "gate_proj.weight", o.dtype, c.shared_intermediate, h);
    plan_matrix(out, s + "up_proj.weight", o.dtype, c.shared_intermediate, h);
    plan_matrix(out, s + "down_proj.weight", o.dtype, h, c.shared_intermediate);
  }
  if (o.fused_experts) {
    out.push_back({p + "experts.gate_up_proj", st_of(o.dtype), {e, 2 * i, h}});
    out.push_back({p + "experts.down_proj", st_of(o.dtype), {e, h, i}});
    return out;
  }
  for (int64_t x = 0; x < e; ++x) {
    const std::string n = p + "experts." + std::to_string(x) + ".";
    plan_matrix(out, n + "gate_proj.weight", o.dtype, i, h);
    plan_matrix(out, n + "up_proj.weight", o.dtype, i, h);
    plan_matrix(out, n + "down_proj.weight", o.dtype, h, i);
  }
  return out;
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) throw IoError("cannot write '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw IoError("cannot rename '" + tmp + "' to '" + path + "'");
}

// Routes each tensor's bytes to the writer of its shard; shards are opened and finished in order.
class ShardedSink {
 public:
  ShardedSink(const std::string& dir, const std::vector<TensorSpec>& plan, uint64_t shard_bytes) : dir_(dir) {
    uint64_t used = 0;
    for (const auto& t : plan) {
      const uint64_t n = tensor_bytes(t.dtype, t.shape);
      if (shards_.empty() || (used > 0 && used + n > shard_bytes)) {
        shards_.emplace_back();
        used = 0;
      }
      shards_.back().push_back(t);
      shard_of_[t.name] = shards_.size() - 1;
      used += n;
    }
  }

  std::string file_name(size_t s) const {
    if (shards_.size() == 1) return "model.safetensors";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", s + 1, shards_.size());
    return buf;
  }

  void write(const std::string& name, const void* data, uint64_t bytes) {
    const size_t s = shard_of_.at(name);
    if (!writer_ || s != current_) {
      if (writer_) writer_->finish();
      current_ = s;
      writer_ = std::make_unique<SafetensorsWriter>((fs::path(dir_) / file_name(s)).string(), shards_[s],
                                                    std::map<std::string, std::string>{{"format", "pt"}});
    }
    writer_->write(name, data, bytes);
  }
  void matrix(const std::string& name, const WeightView& v) {
    write(name, v.data, static_cast<uint64_t>(v.rows * v.cols) * dtype_size(v.dtype));
    if (v.dtype == DType::kF8E4M3)
      write(name + "_scale_inv", v.scale_inv, static_cast<uint64_t>(ceil_div(v.rows, 128) * ceil_div(v.cols, 128)) * 4);
  }

  void finish_all() {
    if (writer_) writer_->finish();
    writer_.reset();
  }
  size_t num_shards() const { return shards_.size(); }
  nlohmann::json index() const {
    nlohmann::json map = nlohmann::json::object();
    uint64_t total = 0;
    for (size_t s = 0; s < shards_.size(); ++s)
      for (const auto& t : shards_[s]) {
        map[t.name] = file_name(s);
        total += tensor_bytes(t.dtype, t.shape);
      }
    return {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  }

 private:
  std::string dir_;
  std::vector<std::vector<TensorSpec>> shards_;
  std::map<std::string, size_t> shard_of_;
  std::unique_ptr<SafetensorsWriter> writer_;
  size_t current_ = 0;
};

void write_layer(ShardedSink& sink, const MoeConfig& c, const CheckpointOptions& o, int64_t layer) {
  const std::string p = layer_prefix(layer);
  const int64_t expert_bytes = 3 * c.hidden * c.moe_intermediate * static_cast<int64_t>(dtype_size(o.dtype));
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(o.chunk_bytes) / expert_bytes);
  // Fused: gate_up_proj precedes down_proj in the file, so the experts are generated twice (pass 1, 2).
  const int passes = o.fused_experts ? 2 : 1;
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t first = 0; first < c.num_experts; first += chunk) {
      RandomWeightOptions r;
      r.dtype = o.dtype;
      r.seed = o.seed;
      r.first_expert = first;
      r.num_local_experts = std::min(chunk, c.num_experts - first);
      const LayerWeights w = make_random_weights(c, r);
      if (first == 0 && pass == 0) {
        sink.matrix(p + "gate.weight", w.router);
        if (c.correction_bias)
          sink.write(p + "gate.e_score_correction_bias", w.correction_bias, static_cast<uint64_t>(c.num_experts) * 4);
        if (c.shared_expert_gate) sink.matrix(p + "shared_expert_gate.weight", w.shared_gate);
        if (c.has_shared_expert()) {
          const std::string s = p + (c.model_type.rfind("qwen", 0) == 0 ? "shared_expert." : "shared_experts.");
          sink.matrix(s + "gate_proj.weight", w.shared.gate);
          sink.matrix(s + "up_proj.weight", w.shared.up);
          sink.matrix(s + "down_proj.weight", w.shared.down);
        }
      }
      for (size_t x = 0; x < w.experts.size(); ++x) {
        const ExpertWeights& ew = w.experts[x];
        if (o.fused_experts) {
          if (pass == 0) {
            sink.matrix(p + "experts.gate_up_proj", ew.gate);
            sink.matrix(p + "experts.gate_up_proj", ew.up);
          } else {
            sink.matrix(p + "experts.down_proj", ew.down);
          }
          continue;
        }
        const std::string n = p + "experts." + std::to_string(first + static_cast<int64_t>(x)) + ".";
        sink.matrix(n + "gate_proj.weight", ew.gate);
        sink.matrix(n + "up_proj.weight", ew.up);
        sink.matrix(n + "down_proj.weight", ew.down);
      }
    }
  }
}

}  // namespace

void write_checkpoint(const std::string& dir, const MoeConfig& config, const CheckpointOptions& o) {
  MoeConfig c = config;
  c.fp8 = o.dtype == DType::kF8E4M3;
  c.validate();
  if (o.fused_experts && c.fp8)
    throw ConfigError("make-checkpoint: the fused expert layout is written for bf16/f32 only, not fp8");
  std::vector<int64_t> layers = o.layers;
  if (layers.empty()) {
    for (int64_t l = 0; l < c.num_layers && layers.empty(); ++l)
      if (c.is_moe_layer(l)) layers.push_back(l);
    if (layers.empty()) throw ConfigError("make-checkpoint: model_type " + c.model_type + " config has no MoE layer");
  }
  for (size_t a = 0; a < layers.size(); ++a) {
    if (!c.is_moe_layer(layers[a]))
      throw ConfigError("make-checkpoint: layer " + std::to_string(layers[a]) + " is not an MoE layer of this config");
    for (size_t b = 0; b < a; ++b)
      if (layers[a] == layers[b]) throw ConfigError("make-checkpoint: layer " + std::to_string(layers[a]) + " listed twice");
  }
  const std::string json = hf_config_json(c);  // throws before any file is written for an inexpressible config
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create directory '" + dir + "': " + ec.message());
  std::vector<TensorSpec> plan;
  for (int64_t l : layers) {
    auto part = plan_layer(c, o, l);
    plan.insert(plan.end(), part.begin(), part.end());
  }
  ShardedSink sink(dir, plan, o.shard_bytes);
  for (int64_t l : layers) write_layer(sink, c, o, l);
  sink.finish_all();
  const fs::path index = fs::path(dir) / TensorStore::kIndexName;
  if (sink.num_shards() > 1) {
    write_text_file(index.string(), sink.index().dump(2) + "\n");
  } else {
    fs::remove(index, ec);  // a stale index would shadow model.safetensors
  }
  write_text_file((fs::path(dir) / "config.json").string(), json);
}

}  // namespace moe
