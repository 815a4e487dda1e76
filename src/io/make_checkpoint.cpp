#include "io/make_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
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

// "<module>.weight" -> "<module>" (int4 tensors are named after the module).
std::string module_of(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::strlen(".weight"));
}

// The tensors of one layer in file order (the order the generator produces them).
void plan_matrix(std::vector<TensorSpec>& out, const std::string& name, DType t, int64_t rows, int64_t cols,
                 int64_t group = 0) {
  if (t == DType::kInt4) {  // compressed-tensors pack-quantized, in the order its compressor writes them
    const std::string m = module_of(name);
    out.push_back({m + ".weight_packed", StDType::kI32, {rows, cols / kInt4PerWord}});
    out.push_back({m + ".weight_scale", StDType::kBF16, {rows, cols / group}});
    out.push_back({m + ".weight_shape", StDType::kI64, {2}});
    return;
  }
  out.push_back({name, st_of(t), {rows, cols}});
  if (t == DType::kF8E4M3) out.push_back({name + "_scale_inv", StDType::kF32, {ceil_div(rows, 128), ceil_div(cols, 128)}});
}

std::vector<TensorSpec> plan_layer(const MoeConfig& c, const CheckpointOptions& o, int64_t layer) {
  const std::string p = layer_prefix(layer);
  const DType rt = o.dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  const DType st = o.dtype == DType::kInt4 && !c.int4_shared ? DType::kBF16 : o.dtype;  // the shared expert
  const int64_t h = c.hidden, i = c.moe_intermediate, e = c.num_experts, g = c.int4_group_size;
  std::vector<TensorSpec> out;
  plan_matrix(out, p + "gate.weight", rt, e, h);
  if (c.correction_bias) out.push_back({p + "gate.e_score_correction_bias", StDType::kF32, {e}});
  if (c.shared_expert_gate) plan_matrix(out, p + "shared_expert_gate.weight", rt, 1, h);
  if (c.has_shared_expert()) {
    const std::string s = p + (c.model_type.rfind("qwen", 0) == 0 ? "shared_expert." : "shared_experts.");
    plan_matrix(out, s + "gate_proj.weight", st, c.shared_intermediate, h, g);
    plan_matrix(out, s + "up_proj.weight", st, c.shared_intermediate, h, g);
    plan_matrix(out, s + "down_proj.weight", st, h, c.shared_intermediate, g);
  }
  if (o.fused_experts) {
    out.push_back({p + "experts.gate_up_proj", st_of(o.dtype), {e, 2 * i, h}});
    out.push_back({p + "experts.down_proj", st_of(o.dtype), {e, h, i}});
    return out;
  }
  for (int64_t x = 0; x < e; ++x) {
    const std::string n = p + "experts." + std::to_string(x) + ".";
    plan_matrix(out, n + "gate_proj.weight", o.dtype, i, h, g);
    plan_matrix(out, n + "up_proj.weight", o.dtype, i, h, g);
    plan_matrix(out, n + "down_proj.weight", o.dtype, h, i, g);
  }
  return out;
}

// Crash safety of the directory. The loader takes a directory for a model only with config.json in it
// (ModelDir reads it before anything else), so config.json is the commit record of a checkpoint: it is the
// last file to get its name, and it is removed before any other file of the checkpoint changes.
//   1. Stage: every shard, the index and config.json are written in full under a staging name, NAME.partial
//      (a shard as NAME.partial.tmp.PID while it is written), and flushed to disk. A failure or a kill here
//      leaves the directory as it was: a checkpoint already there still loads, unchanged, and a new
//      directory holds no config.json.
//   2. Check that every final name can be replaced (none is a directory), still before anything changes.
//   3. Remove config.json: from here the directory does not load.
//   4. Remove the previous checkpoint's files that this one does not replace (a stale index would shadow
//      model.safetensors; stale shards would only waste space), rename the shards and the index into place.
//   5. Rename config.json into place: the directory loads again, as the new checkpoint.
// A kill in 3-5 leaves no config.json, so nothing loads. Staging names are never opened by the loader (it reads
// config.json, the index and the shards it names, or model.safetensors); a failure removes its own, and the
// next write into the directory removes those a kill left. The checkpoint is not written into a sibling
// directory renamed over this one at the end: that needs a writable parent, fails for a mount point, and
// cannot replace a directory that holds anything else without deleting it.
const char* const kStaging = ".partial";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A file name make-checkpoint writes for a checkpoint: config.json, the index, model.safetensors, or
// model-NNNNN-of-NNNNN.safetensors.
bool is_checkpoint_name(const std::string& n) {
  if (n == "config.json" || n == TensorStore::kIndexName || n == TensorStore::kSingleName) return true;
  return n.rfind("model-", 0) == 0 && n.find("-of-") != std::string::npos && ends_with(n, ".safetensors");
}

// What an interrupted write leaves: NAME.partial, NAME.partial.tmp.PID, and the NAME.tmp / NAME.tmp.PID of
// earlier versions of this writer, for NAME a checkpoint file name.
bool is_staging_leftover(std::string n) {
  const size_t dot = n.rfind('.');
  if (dot != std::string::npos && dot + 1 < n.size() && n.find_first_not_of("0123456789", dot + 1) == std::string::npos) {
    n.resize(dot);  // NAME[.partial].tmp.PID -> NAME[.partial].tmp
    if (!ends_with(n, ".tmp")) return false;
  }
  bool staged = false;
  for (const char* suffix : {".tmp", kStaging})
    if (ends_with(n, suffix)) {
      n.resize(n.size() - std::strlen(suffix));
      staged = true;
    }
  return staged && is_checkpoint_name(n);
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // the renames and removals before this reach the disk first; where refused, nothing more to do
  ::close(fd);
}

// `path` written in full and flushed to disk, or removed and IoError.
void write_text_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw IoError("cannot create '" + path + "': " + std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
            ::fsync(::fileno(f)) == 0;
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(path.c_str());
    throw IoError("writing '" + path + "' failed: " + std::strerror(err));
  }
}

// The staged files of one write, removed unless the write commits; and the directories it created, removed
// (when empty) after a failure.
class Staging {
 public:
  explicit Staging(std::string dir) : dir_(std::move(dir)) {}
  ~Staging() {
    std::error_code ec;
    for (const std::string& n : names_) fs::remove(staged(n), ec);
    for (const fs::path& d : created_) fs::remove(d, ec);  // deepest first; only an empty one goes
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  // Creates the directory (and missing parents), remembering which were new.
  void create_directory() {
    std::vector<fs::path> missing;
    std::error_code ec;
    for (fs::path p = fs::absolute(dir_, ec); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
      missing.push_back(p);
      if (p == p.parent_path()) break;
    }
    fs::create_directories(dir_, ec);
    if (ec) throw IoError("cannot create directory '" + dir_ + "': " + ec.message());
    if (!fs::is_directory(dir_, ec)) throw IoError("cannot create directory '" + dir_ + "': it is a file");
    created_ = missing;
  }
  // Removes what an interrupted write into this directory left.
  void remove_leftovers() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec))
      if (is_staging_leftover(e.path().filename().string())) fs::remove(e.path(), ec);
  }

  std::string final(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string staged(const std::string& name) const { return final(name) + kStaging; }
  // `name` is about to be written under staged(name).
  void add(const std::string& name) { names_.push_back(name); }

  void commit() {
    std::error_code ec;
    for (const std::string& n : names_)
      if (fs::is_directory(final(n), ec))
        throw IoError("cannot write '" + final(n) + "': it is a directory");
    // From here until config.json is back, the directory holds no checkpoint that loads.
    const std::string broken = " (the directory '" + dir_ + "' now holds no loadable checkpoint; write it again)";
    auto step = [&](bool ok, const std::string& what) {
      if (!ok) throw IoError(what + ": " + std::strerror(errno) + broken);
    };
    const std::string config = final("config.json");
    step(::unlink(config.c_str()) == 0 || errno == ENOENT, "cannot remove '" + config + "'");
    sync_directory(dir_);
    std::vector<std::string> previous;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string n = e.path().filename().string();
      if (is_checkpoint_name(n) && !e.is_directory(ec) && std::find(names_.begin(), names_.end(), n) == names_.end())
        previous.push_back(n);
    }
    if (ec) throw IoError("cannot list '" + dir_ + "': " + ec.message() + broken);
    for (const std::string& n : previous)
      step(::unlink(final(n).c_str()) == 0 || errno == ENOENT, "cannot remove the previous '" + final(n) + "'");
    auto put_in_place = [&](const std::string& n) {
      step(std::rename(staged(n).c_str(), final(n).c_str()) == 0, "cannot rename '" + staged(n) + "' to '" + final(n) + "'");
    };
    for (const std::string& n : names_)
      if (n != "config.json") put_in_place(n);
    sync_directory(dir_);  // every shard and the index in place before config.json appears
    if (std::find(names_.begin(), names_.end(), "config.json") != names_.end()) put_in_place("config.json");
    names_.clear();
    sync_directory(dir_);
    created_.clear();
  }

 private:
  std::string dir_;
  std::vector<std::string> names_;  // the file names this write stages
  std::vector<fs::path> created_;
};

// Routes each tensor's bytes to the writer of its shard; shards are opened and finished in order.
class ShardedSink {
 public:
  ShardedSink(Staging& staging, const std::vector<TensorSpec>& plan, uint64_t shard_bytes) : staging_(staging) {
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
      staging_.add(file_name(s));
      writer_ = std::make_unique<SafetensorsWriter>(staging_.staged(file_name(s)), shards_[s],
                                                    std::map<std::string, std::string>{{"format", "pt"}});
    }
    writer_->write(name, data, bytes);
  }
  void matrix(const std::string& name, const WeightView& v) {
    if (v.dtype == DType::kInt4) {
      const std::string m = module_of(name);
      const int64_t shape[2] = {v.rows, v.cols};
      write(m + ".weight_packed", v.data, static_cast<uint64_t>(v.rows * v.cols / 2));
      write(m + ".weight_scale", v.group_scale, static_cast<uint64_t>(v.rows * (v.cols / v.group_size)) * 2);
      write(m + ".weight_shape", shape, sizeof shape);
      return;
    }
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
  Staging& staging_;
  std::vector<std::vector<TensorSpec>> shards_;
  std::map<std::string, size_t> shard_of_;
  std::unique_ptr<SafetensorsWriter> writer_;
  size_t current_ = 0;
};

void write_layer(ShardedSink& sink, const MoeConfig& c, const CheckpointOptions& o, int64_t layer) {
  const std::string p = layer_prefix(layer);
  const int64_t expert_bytes = std::max<int64_t>(1, c.layer_weight_bytes_of(1, o.dtype) - c.layer_weight_bytes_of(0, o.dtype));
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
  c.int4 = o.dtype == DType::kInt4;
  if (!c.int4) c.int4_shared = false;
  c.validate();
  if (o.fused_experts && (c.fp8 || c.int4))
    throw ConfigError(std::string("make-checkpoint: the fused expert layout is written for bf16/f32 only, not ") +
                      (c.fp8 ? "fp8" : "int4"));
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
  std::vector<TensorSpec> plan;
  for (int64_t l : layers) {
    auto part = plan_layer(c, o, l);
    plan.insert(plan.end(), part.begin(), part.end());
  }
  Staging staging(dir);
  staging.create_directory();
  staging.remove_leftovers();
  ShardedSink sink(staging, plan, o.shard_bytes);
  for (int64_t l : layers) write_layer(sink, c, o, l);
  sink.finish_all();
  if (sink.num_shards() > 1) {
    staging.add(TensorStore::kIndexName);
    write_text_file(staging.staged(TensorStore::kIndexName), sink.index().dump(2) + "\n");
  }
  staging.add("config.json");
  write_text_file(staging.staged("config.json"), json);
  staging.commit();
}

}  // namespace moe
