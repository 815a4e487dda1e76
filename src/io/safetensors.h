// Reading safetensors files (huggingface/safetensors): the header is parsed and checked in full, the file is
// memory-mapped and tensors are handed out as pointers into the mapping, never copied, so a 3 GiB layer costs
// only the pages a computation actually touches.
//
// Layout: u64 little-endian N, N bytes of UTF-8 JSON (an object, may be right-padded with spaces), then the
// data buffer. Each entry "name": {"dtype": "BF16", "shape": [..], "data_offsets": [B, E]} is relative to the
// data buffer, E exclusive; an optional "__metadata__" maps strings to strings. Sorted by offset the tensors
// tile the buffer from 0 with no gap or overlap, and the file ends exactly at the last E.
//
//   auto f = SafetensorsFile::open("model-00001-of-00002.safetensors");
//   const TensorInfo& t = f->get("model.layers.3.mlp.gate.weight");  // throws naming file and tensor
//   const void* p = f->data(t);                                       // valid while f lives
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/io_error.h"

namespace moe {

enum class StDType : uint8_t {
  kBool, kU8, kI8, kF8E5M2, kF8E4M3, kF8E8M0, kF8E4M3Fnuz, kF8E5M2Fnuz, kI16, kU16, kF16, kBF16,
  kI32, kU32, kF32, kF64, kC64, kI64, kU64, kF4, kF6E2M3, kF6E3M2,
};
std::string_view st_dtype_name(StDType t);  // "BF16", ...
int st_dtype_bits(StDType t);               // 1 byte = 8; F4 = 4, F6_* = 6
std::optional<StDType> parse_st_dtype(std::string_view name);

inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

struct TensorInfo {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;  // [] is a scalar
  uint64_t begin = 0;          // byte offsets into the data buffer, end exclusive
  uint64_t end = 0;

  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
  std::string shape_str() const;  // "[512, 2048]"
};

struct SafetensorsHeader {
  uint64_t header_size = 0;  // N
  uint64_t data_start = 0;   // 8 + N
  std::vector<TensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;

  const TensorInfo* find(std::string_view name) const;
};

// Parses and validates a whole safetensors file given as `size` bytes in memory (for the mapped file and the
// fuzzer). Reads only the first 8 + N bytes. Throws IoError naming `file_name` (and the tensor) on anything the
// format forbids.
SafetensorsHeader parse_safetensors(const uint8_t* bytes, uint64_t size, const std::string& file_name);

// "[a, b, c]"
std::string shape_to_string(const std::vector<int64_t>& shape);

class MappedFile;

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates it. Throws IoError naming the path.
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const TensorInfo* find(std::string_view name) const { return header_.find(name); }
  // Throws IoError "tensor 'name' not found in <path>".
  const TensorInfo& get(std::string_view name) const;
  // Start of the tensor's bytes inside the mapping; valid while this object lives.
  const void* data(const TensorInfo& t) const;

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  SafetensorsHeader header_;
};

}  // namespace moe
