// Writing safetensors files, streamed: the header is computed from the declared tensors up front, then the
// bytes arrive tensor by tensor (a tensor may arrive in pieces), so a writer never holds a whole layer. Output
// goes to a temporary file renamed into place by finish(); on error or without finish() nothing is left.
//
//   SafetensorsWriter w(path, {{"a", StDType::kF32, {2, 3}}, {"b", StDType::kBF16, {4}}});
//   w.write("a", a_data, 24);
//   w.write("b", b_data, 8);
//   w.finish();
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace moe {

struct TensorSpec {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
};

// Bytes of a tensor of this dtype and shape (throws IoError if not a whole number of bytes).
uint64_t tensor_bytes(StDType dtype, const std::vector<int64_t>& shape);

class SafetensorsWriter {
 public:
  // The data buffer holds the tensors in the given order. The header is padded with spaces so that the data
  // starts 8-byte aligned. Throws IoError (duplicate or empty names, unwritable path).
  SafetensorsWriter(std::string path, std::vector<TensorSpec> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // removes the temporary file unless finish() succeeded
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends bytes to tensor `name`, which must be the tensor being written or, once that one is complete, the
  // next in order. Throws IoError on a name out of order or more bytes than the tensor holds.
  void write(const std::string& name, const void* data, uint64_t bytes);
  // Checks that every tensor is complete, closes and renames the file into place.
  void finish();

 private:
  void put(const void* data, uint64_t bytes);

  std::string path_;
  std::string tmp_path_;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> sizes_;
  size_t current_ = 0;
  uint64_t written_ = 0;  // bytes of tensors_[current_] so far
  std::vector<char> buffer_;  // the stream's (closed in the destructor body, before this is freed)
  std::FILE* out_ = nullptr;
  bool done_ = false;
};

struct TensorData {
  TensorSpec spec;
  const void* data = nullptr;  // tensor_bytes(spec) bytes
};
// One call: all tensors from memory.
void write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace moe
