#include "io/tensor_store.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/json_util.h"

namespace moe {

namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open '" + path + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A shard name from the index must stay inside the model directory.
bool safe_relative(const std::string& name) {
  if (name.empty() || name.front() == '/') return false;
  for (const auto& part : fs::path(name))
    if (part == "..") return false;
  return true;
}

}  // namespace

TensorStore::TensorStore(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    dir_ = fs::path(path).parent_path().string();
    source_ = path;
    auto f = SafetensorsFile::open(path);
    for (const auto& t : f->header().tensors) weight_map_[t.name] = fs::path(path).filename().string();
    open_[fs::path(path).filename().string()] = f;
    return;
  }
  if (!fs::is_directory(path, ec)) throw IoError("model path '" + path + "' is neither a directory nor a file");
  dir_ = path;
  const fs::path index = fs::path(path) / kIndexName;
  if (!fs::exists(index, ec)) {
    const fs::path single = fs::path(path) / kSingleName;
    if (!fs::exists(single, ec))
      throw IoError("model directory '" + path + "' has neither " + kIndexName + " nor " + kSingleName);
    *this = TensorStore(single.string());
    return;
  }
  source_ = index.string();
  nlohmann::json root;
  try {
    root = parse_json_strict(read_text(source_));
  } catch (const std::runtime_error& e) {
    throw IoError("shard index '" + source_ + "': " + e.what());
  }
  if (!root.is_object() || !root.contains("weight_map") || !root["weight_map"].is_object())
    throw IoError("shard index '" + source_ + "': expected an object with a \"weight_map\" object");
  for (const auto& [name, file] : root["weight_map"].items()) {
    if (!file.is_string() || !safe_relative(file.get<std::string>()))
      throw IoError("shard index '" + source_ + "': weight_map entry for tensor '" + name +
                    "' must be a relative file name inside the model directory, got " + file.dump());
    weight_map_[name] = file.get<std::string>();
  }
}

std::shared_ptr<const SafetensorsFile> TensorStore::shard(const std::string& file) {
  auto it = open_.find(file);
  if (it != open_.end()) return it->second;
  const std::string path = (fs::path(dir_) / file).string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw IoError("shard '" + path + "' listed in '" + source_ + "' does not exist");
  auto f = SafetensorsFile::open(path);
  open_[file] = f;
  return f;
}

std::optional<TensorStore::Found> TensorStore::find(const std::string& name) {
  auto it = weight_map_.find(name);
  if (it == weight_map_.end()) return std::nullopt;
  auto f = shard(it->second);
  const TensorInfo* info = f->find(name);
  if (info == nullptr)
    throw IoError("tensor '" + name + "' is listed in '" + source_ + "' under shard '" + it->second +
                  "', but '" + f->path() + "' does not hold it");
  return Found{f, info, f->data(*info)};
}

TensorStore::Found TensorStore::get(const std::string& name) {
  auto found = find(name);
  if (!found) throw IoError("tensor '" + name + "' not found in '" + source_ + "'");
  return *found;
}

bool TensorStore::contains(const std::string& name) const { return weight_map_.count(name) != 0; }

std::vector<std::string> TensorStore::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : weight_map_) names.push_back(name);
  return names;
}

}  // namespace moe
