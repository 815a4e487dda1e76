// SmallFunction<R(A...), N>: a copyable callable like std::function, storing a callable of up to N bytes
// in place, so that building and launching an operation allocates nothing (std::function keeps only about
// 16 bytes in place, and an operation's tile captures its grid and buffer pointers: 100-250 bytes).
// Larger callables (a tool wrapping another operation's tile) still work, from the heap.
#pragma once

#include <cstddef>
#include <functional>
#include <new>
#include <type_traits>
#include <utility>

namespace moe::rt {

template <class Sig, size_t N>
class SmallFunction;

template <class R, class... A, size_t N>
class SmallFunction<R(A...), N> {
 public:
  SmallFunction() = default;
  SmallFunction(std::nullptr_t) {}  // NOLINT: like std::function
  template <class F, class D = std::decay_t<F>,
            class = std::enable_if_t<!std::is_same_v<D, SmallFunction> && std::is_invocable_r_v<R, D&, A...>>>
  SmallFunction(F&& f) {  // NOLINT: implicit, like std::function
    if (!is_null(f)) emplace<D>(std::forward<F>(f));  // an empty std::function or null pointer: empty
  }
  SmallFunction(const SmallFunction& o) {
    if (o.ops_) o.ops_->copy(o, *this);
  }
  SmallFunction(SmallFunction&& o) noexcept {
    if (o.ops_) o.ops_->move(o, *this);
  }
  SmallFunction& operator=(const SmallFunction& o) {
    if (this != &o) {
      SmallFunction copy(o);
      *this = std::move(copy);
    }
    return *this;
  }
  SmallFunction& operator=(SmallFunction&& o) noexcept {
    if (this != &o) {
      SmallFunction taken;  // `o` may live inside the callable reset() destroys: take it first
      if (o.ops_) o.ops_->move(o, taken);
      reset();
      if (taken.ops_) taken.ops_->move(taken, *this);
    }
    return *this;
  }
  SmallFunction& operator=(std::nullptr_t) {
    reset();
    return *this;
  }
  ~SmallFunction() { reset(); }

  explicit operator bool() const { return ops_ != nullptr; }
  // Calls the stored callable (as std::function does, through a non-const reference); throws
  // std::bad_function_call when empty, as std::function does.
  R operator()(A... args) const {
    if (!ops_) throw std::bad_function_call();
    return ops_->call(*this, std::forward<A>(args)...);
  }
  // Whether the callable lives in place (no heap allocation), for tests.
  bool stored_in_place() const { return ops_ != nullptr && ops_->in_place; }

 private:
  struct Ops {
    R (*call)(const SmallFunction&, A&&...);
    void (*copy)(const SmallFunction& from, SmallFunction& to);
    void (*move)(SmallFunction& from, SmallFunction& to);  // leaves `from` empty
    void (*destroy)(SmallFunction&);
    bool in_place;
  };

  template <class T>
  struct IsStdFunction : std::false_type {};
  template <class S>
  struct IsStdFunction<std::function<S>> : std::true_type {};
  template <class D>
  static bool is_null(const D& f) {
    if constexpr (std::is_pointer_v<D> || std::is_member_pointer_v<D>) return f == nullptr;
    else if constexpr (IsStdFunction<D>::value) return !f;
    else return false;
  }

  template <class D>
  static constexpr bool kInPlace =
      sizeof(D) <= N && alignof(D) <= alignof(std::max_align_t) && std::is_nothrow_move_constructible_v<D>;

  template <class D>
  D* target() const {
    if constexpr (kInPlace<D>) return std::launder(reinterpret_cast<D*>(buf_));
    else return *std::launder(reinterpret_cast<D* const*>(buf_));
  }

  template <class D, class F>
  void emplace(F&& f) {
    if constexpr (kInPlace<D>) ::new (static_cast<void*>(buf_)) D(std::forward<F>(f));
    else ::new (static_cast<void*>(buf_)) D*(new D(std::forward<F>(f)));
    ops_ = &kOps<D>;
  }

  template <class D>
  static constexpr Ops kOps = {
      [](const SmallFunction& self, A&&... args) -> R { return (*self.target<D>())(std::forward<A>(args)...); },
      [](const SmallFunction& from, SmallFunction& to) { to.emplace<D>(*from.target<D>()); },
      [](SmallFunction& from, SmallFunction& to) {
        if constexpr (kInPlace<D>) {
          to.emplace<D>(std::move(*from.target<D>()));
          from.reset();
        } else {  // hand the heap object over
          ::new (static_cast<void*>(to.buf_)) D*(from.target<D>());
          to.ops_ = from.ops_;
          from.ops_ = nullptr;
        }
      },
      [](SmallFunction& self) {
        if constexpr (kInPlace<D>) self.target<D>()->~D();
        else delete self.target<D>();
      },
      kInPlace<D>};

  void reset() {
    if (ops_) {
      const Ops* ops = ops_;
      ops_ = nullptr;
      ops->destroy(*this);
    }
  }

  // mutable: operator() is const, as std::function's, yet may call a mutable lambda stored here.
  alignas(std::max_align_t) mutable unsigned char buf_[N];
  const Ops* ops_ = nullptr;
};

}  // namespace moe::rt
