// SmallVector<T, N>: a vector of trivially copyable T that keeps up to N elements in place and moves to
// the heap beyond, so that an operation's access list (a few byte ranges) costs no allocation. Only what
// operations need: construction from a list or a std::vector, push_back, append, iteration, indexing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

namespace moe::rt {

template <class T, size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>, "SmallVector holds trivially copyable elements");

 public:
  SmallVector() = default;
  SmallVector(std::initializer_list<T> items) { append(items.begin(), items.end()); }
  SmallVector(const std::vector<T>& items) { append(items.data(), items.data() + items.size()); }  // NOLINT
  SmallVector(const SmallVector& o) { append(o.begin(), o.end()); }
  SmallVector& operator=(const SmallVector& o) {
    if (this != &o) {
      size_ = 0;
      append(o.begin(), o.end());
    }
    return *this;
  }
  SmallVector(SmallVector&& o) noexcept { *this = std::move(o); }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this == &o) return *this;
    if (o.heap_) {  // take the heap block
      heap_ = std::move(o.heap_);
      capacity_ = o.capacity_;
      size_ = o.size_;
    } else {
      heap_.reset();
      capacity_ = N;
      size_ = o.size_;
      std::copy(o.inline_, o.inline_ + o.size_, inline_);
    }
    o.heap_.reset();
    o.capacity_ = N;
    o.size_ = 0;
    return *this;
  }

  void push_back(const T& v) { append(&v, &v + 1); }
  // [first, last) may lie in this vector: it is read before the old storage goes.
  void append(const T* first, const T* last) {
    const size_t n = static_cast<size_t>(last - first);
    if (size_ + n > capacity_) {
      const size_t cap = std::max(size_ + n, 2 * capacity_);
      std::unique_ptr<T[]> grown(new T[cap]);
      std::copy(data(), data() + size_, grown.get());
      std::copy(first, last, grown.get() + size_);
      heap_ = std::move(grown);
      capacity_ = cap;
    } else {
      std::copy(first, last, data() + size_);
    }
    size_ += n;
  }
  void clear() { size_ = 0; }

  T* data() { return heap_ ? heap_.get() : inline_; }
  const T* data() const { return heap_ ? heap_.get() : inline_; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  bool in_place() const { return !heap_; }

 private:
  T inline_[N] = {};
  std::unique_ptr<T[]> heap_;
  size_t capacity_ = N;
  size_t size_ = 0;
};

}  // namespace moe::rt
