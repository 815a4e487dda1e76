#include "model/host_buffer.h"

#include <sys/mman.h>

#include <cstring>
#include <new>
#include <utility>

namespace moe {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kSmall = size_t{1} << 20;  // below this, malloc-sized work is not worth a mapping of its own
}  // namespace

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  mapped_ = bytes < kSmall ? bytes : (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  if (mapped_ >= kHugePage) madvise(p, mapped_, MADV_HUGEPAGE);
  // Pre-fault: one write per 4 KiB page (zero pages are already zero; the write forces the mapping).
  for (size_t off = 0; off < mapped_; off += 4096) static_cast<volatile char*>(p)[off] = 0;
  data_ = p;
}

HostBuffer::~HostBuffer() {
  if (data_) munmap(data_, mapped_);
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), mapped_(std::exchange(o.mapped_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, mapped_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

}  // namespace moe
