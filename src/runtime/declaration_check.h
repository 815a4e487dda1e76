// A debug check that an operation writes only the bytes it declared, so that the sanitizer's input (the
// declared accesses) can be trusted. Opt-in and slow: for tests.
//
// How: every operation launched on the device is run as one tile that runs the original tiles in order (the
// result is the same: tiles are independent), and around them the checker compares every registered buffer,
// byte for byte, outside the operation's declared write ranges, with a copy taken just before. A buffer is
// registered with add_buffer, by Device::notify_alloc while the checker is attached, or allocated with guard
// zones by allocate_guarded (the zones are never declared, so a write past either end is caught even by an
// operation that declares the whole buffer; verify_guards() checks them at any time).
//
// The comparison is only meaningful while nothing else writes memory: the checker requires a device with one
// worker (then a wrapped operation is the only thing running); polling operations are left unwrapped.
//
// Example:
//   auto dev = moe::rt::make_cpu_device({.num_workers = 1});
//   auto chk = moe::rt::enable_declaration_check(*dev);
//   float* buf = static_cast<float*>(chk->allocate_guarded(64 * sizeof(float), "scratch"));
//   ... launch ops ...; dev->synchronize();
//   EXPECT_TRUE(chk->violations().empty());   // or: synchronize() throws StreamError naming the op
//
// Note: the wrap happens in Observer::on_launch, which receives the operation that the runtime then enqueues
// (stream.cpp), and in Observer::on_capture for an operation recorded into a graph, which every replay then
// checks; checked() is the explicit form for code that launches by hand.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace moe::rt {

class DeclarationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DeclarationChecker : public Observer, public std::enable_shared_from_this<DeclarationChecker> {
 public:
  static constexpr size_t kGuardBytes = 64;
  static constexpr unsigned char kGuardByte = 0xA5;

  // throw_in_op: a violation also throws DeclarationError from the wrapped op (synchronize() rethrows it).
  explicit DeclarationChecker(bool throw_in_op = true);
  ~DeclarationChecker() override;

  void add_buffer(const void* p, size_t bytes, std::string name);
  void remove_buffer(const void* p);
  // bytes usable at the returned pointer, kGuardBytes of kGuardByte on either side; owned by the checker.
  void* allocate_guarded(size_t bytes, std::string name);
  // Throws DeclarationError naming the buffer and the side when a guard zone changed.
  void verify_guards() const;
  std::vector<std::string> violations() const;

  // The explicit form: `op` wrapped to check itself (what on_launch does to every operation).
  Op checked(Op op, const std::string& stream_name);

  void on_launch(const Stream& s, uint64_t seq, const Op& op) override;
  // A captured operation is wrapped the same way, so that every replay of the graph checks it.
  void on_capture(const Stream& s, const Op& op) override;
  void on_alloc(const void* p, size_t bytes) override;
  void on_free(const void* p, size_t bytes) override;

 private:
  struct Buffer {
    const unsigned char* begin = nullptr;
    size_t bytes = 0;
    std::string name;
  };
  struct Guarded {
    std::unique_ptr<unsigned char[]> storage;
    size_t bytes = 0;
    std::string name;
  };
  struct Snapshot;  // the protected bytes of every buffer before one op

  Snapshot take_snapshot(const AccessList& declared) const;
  void compare(const Snapshot& before, const std::string& op, const std::string& stream,
               const AccessList& declared);

  const bool throw_in_op_;
  mutable std::mutex mu_;
  std::vector<Buffer> buffers_;
  std::vector<Guarded> guarded_;
  std::vector<std::string> violations_;
};

// Registers a checker on `device` (which must have exactly one worker) and returns it.
std::shared_ptr<DeclarationChecker> enable_declaration_check(Device& device, bool throw_in_op = true);

}  // namespace moe::rt
