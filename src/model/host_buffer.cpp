#include "model/host_buffer.h"

#include <sys/mman.h>

#include <cstdint>
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
  if (bytes < kSmall) {
    mapped_ = bytes;
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = p;
    data_ = p;
    return;
  }
  // mmap aligns to 4 KiB only; a transparent huge page needs a 2 MiB-aligned 2 MiB range. Map one huge page
  // more than needed and unmap the unaligned head and tail, so that every byte of the buffer can be backed
  // by huge pages (a weight matrix of 2 MiB would otherwise straddle two and get 4 KiB pages: TLB misses on
  // every 4 KiB of a streaming read).
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  const size_t span = rounded + kHugePage;
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(p, aligned - start);
  const uintptr_t end = start + span, aligned_end = aligned + rounded;
  if (end > aligned_end) munmap(reinterpret_cast<void*>(aligned_end), end - aligned_end);
  mapped_ = rounded;
  base_ = reinterpret_cast<void*>(aligned);
  madvise(base_, mapped_, MADV_HUGEPAGE);
  // Pre-fault: one write per 4 KiB page (zero pages are already zero; the write forces the mapping).
  for (size_t off = 0; off < mapped_; off += 4096) static_cast<volatile char*>(base_)[off] = 0;
  data_ = base_;
}

HostBuffer::~HostBuffer() {
  if (base_) munmap(base_, mapped_);
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(base_, mapped_);
    data_ = std::exchange(o.data_, nullptr);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

}  // namespace moe
