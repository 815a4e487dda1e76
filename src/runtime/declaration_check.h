// A debug check that an operation writes only the bytes it declared, and reads only the registered bytes it
// declared, so that the sanitizer's input (the declared accesses) can be trusted. Opt-in and slow: for tests.
//
// Reads (check_reads): before its real run, the operation runs twice more, once with every registered byte
// outside its declared ranges set to 0x00 and once to 0xFF, the state restored after each; if what it writes
// differs from the real run, its result depends on memory it did not declare, and that is reported. So an
// operation runs three times under the check: host-side effects of its tiles (counters) triple too.
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
// The wrap happens in Interposer::before_launch, for an operation enqueued eagerly or recorded into a graph (every
// replay then checks it); checked() is the explicit form for code that launches by hand. The buffers
// announced with Device::notify_alloc arrive through the Observer side.
#pragma once

#include <cstddef>
#include <functional>
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

class DeclarationChecker : public Interposer,
                           public Observer,
                           public std::enable_shared_from_this<DeclarationChecker> {
 public:
  static constexpr size_t kGuardBytes = 64;
  static constexpr unsigned char kGuardByte = 0xA5;

  // throw_in_op: a violation also throws DeclarationError from the wrapped op (synchronize() rethrows it).
  // check_reads: also catch reads of undeclared registered memory (above).
  explicit DeclarationChecker(bool throw_in_op = true, bool check_reads = true);
  ~DeclarationChecker() override;

  void add_buffer(const void* p, size_t bytes, std::string name);
  void remove_buffer(const void* p);
  // bytes usable at the returned pointer, kGuardBytes of kGuardByte on either side; owned by the checker.
  void* allocate_guarded(size_t bytes, std::string name);
  // Throws DeclarationError naming the buffer and the side when a guard zone changed.
  void verify_guards() const;
  std::vector<std::string> violations() const;

  // The explicit form: `op` wrapped to check itself (what before_launch does to every operation).
  Op checked(Op op, const std::string& stream_name);

  // Interposer: every operation, launched or captured, is wrapped to check itself.
  void before_launch(const Stream& s, Op& op) override;
  // Observer: announced buffers are registered while they live.
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
  void probe_reads(const Snapshot& before, const std::function<void()>& run, const std::string& op,
                   const std::string& stream, const AccessList& declared);

  const bool throw_in_op_;
  const bool check_reads_;
  mutable std::mutex mu_;
  std::vector<Buffer> buffers_;
  std::vector<Guarded> guarded_;
  std::vector<std::string> violations_;
};

// Registers a checker on `device` (which must have exactly one worker) and returns it.
std::shared_ptr<DeclarationChecker> enable_declaration_check(Device& device, bool throw_in_op = true,
                                                             bool check_reads = true);

}  // namespace moe::rt
