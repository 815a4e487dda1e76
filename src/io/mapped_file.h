// A read-only, private memory mapping of a whole file (RAII). Pages are read from the page cache on first
// touch; nothing is copied up front.
#pragma once

#include <cstdint>
#include <string>

namespace moe {

class MappedFile {
 public:
  // Throws IoError naming the path (missing, unreadable, a directory, ...). An empty file maps to size 0.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace moe
