// Large host allocations for weights and workspaces: anonymous mmap with transparent huge pages, pre-faulted
// outside any timed region (first touch of 4 KiB pages is very slow on some VMs).
#pragma once

#include <cstddef>
#include <memory>

namespace moe {

class HostBuffer {
 public:
  HostBuffer() = default;
  // Allocates `bytes` (zero-filled, huge-page advised, pre-faulted). Throws std::bad_alloc on failure.
  explicit HostBuffer(size_t bytes);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  void* base_ = nullptr;  // the mapping (data_ == base_; kept apart so a move leaves both null)
  size_t size_ = 0;
  size_t mapped_ = 0;
};

}  // namespace moe
