// libFuzzer target: any byte string as model.safetensors.index.json, in a model directory that holds one
// valid shard (tensors "a" and "b") and nothing else. Opening the store and looking up every tensor the
// index lists must either work or throw IoError; an index entry must never reach a file outside the
// directory, and a tensor found must be the one asked for, inside its shard.
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "io/safetensors_writer.h"
#include "io/tensor_store.h"

namespace {

// Made once per process and removed at exit (the string is never destroyed: the exit handler reads it).
const std::string& model_dir() {
  static const std::string* const dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/moe_fuzz_index_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) __builtin_trap();
    const float a[2] = {1.0f, 2.0f};
    const uint16_t b[3] = {0x3f80, 0x4000, 0x4040};
    moe::write_safetensors(tmpl + "/model-00001-of-00002.safetensors",
                           {{{"a", moe::StDType::kF32, {2}}, a}, {{"b", moe::StDType::kBF16, {3}}, b}});
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(model_dir(), ec);
    });
    return new std::string(std::filesystem::canonical(tmpl).string());
  }();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = model_dir();
  const std::string index = dir + "/" + moe::TensorStore::kIndexName;
  {
    std::FILE* f = std::fopen(index.c_str(), "wb");
    if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) __builtin_trap();
  }
  try {
    moe::TensorStore store(dir);
    int looked_up = 0;
    for (const std::string& name : store.tensor_names()) {
      if (!store.contains(name)) __builtin_trap();
      if (++looked_up > 64) break;
      try {
        const auto found = store.find(name);
        if (!found) __builtin_trap();  // listed, so either found or an error
        if (found->info->name != name) __builtin_trap();
        std::error_code ec;
        const std::string shard = std::filesystem::weakly_canonical(found->file->path(), ec).string();
        if (ec || shard.rfind(dir + "/", 0) != 0) __builtin_trap();
        const uint64_t file_size = std::filesystem::file_size(shard, ec);
        if (ec || found->file->header().data_start + found->info->end > file_size) __builtin_trap();
      } catch (const moe::IoError&) {
      }
    }
    if (store.find("no such tensor") && !store.contains("no such tensor")) __builtin_trap();
  } catch (const moe::IoError&) {
  }
  return 0;
}
