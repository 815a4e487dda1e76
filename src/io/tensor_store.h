// The tensors of a model directory, single-file or sharded: `model.safetensors`, or
// `model.safetensors.index.json` ({"weight_map": {"tensor": "shard file"}}) with shards opened lazily on first
// use, so loading one layer maps only the shards that hold it. Not thread-safe (the lazy open).
//
//   TensorStore store("/models/Qwen3-Next-80B-A3B");
//   TensorStore::Found t = store.get("model.layers.0.mlp.gate.weight");  // t.file keeps the mapping alive
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace moe {

class TensorStore {
 public:
  inline static const char* const kIndexName = "model.safetensors.index.json";
  inline static const char* const kSingleName = "model.safetensors";

  // `path` is a model directory (index or single file inside) or one .safetensors file. Reads and checks the
  // index (not the shards). Throws IoError naming the path.
  explicit TensorStore(const std::string& path);

  struct Found {
    std::shared_ptr<const SafetensorsFile> file;
    const TensorInfo* info = nullptr;
    const void* data = nullptr;
  };
  // nullopt when no shard lists the tensor. Throws IoError when the index names a shard that is missing or
  // invalid, or a shard that does not hold the tensor the index says it does.
  std::optional<Found> find(const std::string& name);
  // As find(), but a missing tensor throws IoError naming the tensor and where it was looked for.
  Found get(const std::string& name);

  bool contains(const std::string& name) const;
  // "<dir>/model.safetensors.index.json" or the single file: where names are looked up, for messages.
  const std::string& source() const { return source_; }
  std::vector<std::string> tensor_names() const;

 private:
  std::shared_ptr<const SafetensorsFile> shard(const std::string& file);

  std::string dir_;
  std::string source_;
  std::map<std::string, std::string> weight_map_;  // tensor -> shard file (relative to dir_)
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> open_;
};

}  // namespace moe
