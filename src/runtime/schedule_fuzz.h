// Schedule fuzzing: run one program under many timings and orders and require bitwise-identical output.
//
// A correct multi-stream program depends only on its events, so its output cannot change when the scheduler
// delays a stream, runs the streams one at a time in either order, or hands out tiles in a random order, nor
// when scratch memory holds NaN instead of whatever the last user left. run_fuzzed runs `body` on a fresh
// device per setting (the plan), with poisoning on and optionally the stream sanitizer attached, and compares
// every output with the first run's.
//
// Example:
//   auto outcome = moe::rt::run_fuzzed([&](moe::rt::Device& dev) {
//     ... enqueue the program on dev, synchronize ...
//     return moe::rt::bytes_of(output);
//   });
//   EXPECT_TRUE(outcome.ok()) << outcome.summary();
//
// Poisoning (every run but the baseline): run_fuzzed installs a Poisoner (an Interposer) on the run's device.
// Memory announced with Device::notify_alloc is filled with NaN at once (announce before initialising), and
// memory that changes hands, announced with Device::notify_reuse(stream, p, bytes, what) (a workspace at the
// start of a call, a freed output), is filled on that stream with 0xFF, a NaN in f32, bf16 and f16, by an
// operation declared as a write (Op::fills_garbage) so that the sanitizer checks the hand-over too. Without
// an interposer, notify_reuse costs one empty-vector check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/runtime.h"
#include "runtime/sanitizer.h"

namespace moe::rt {

inline constexpr unsigned char kPoisonByte = 0xFF;  // all-ones: a NaN in every IEEE float format

// Fills [p, p + bytes) with kPoisonByte now, on the host.
void poison_now(void* p, size_t bytes);
// Enqueues the fill on `s` (declared as a write, Op::fills_garbage).
void launch_poison(Stream& s, void* p, size_t bytes, const std::string& what = "scratch");

// The interposer that poisons: fresh allocations at once, reused memory on its stream.
class Poisoner : public Interposer {
 public:
  void after_alloc(void* p, size_t bytes) override { poison_now(p, bytes); }
  void on_reuse(Stream& s, void* p, size_t bytes, const char* what) override { launch_poison(s, p, bytes, what); }
};

// One setting of the plan.
struct FuzzSetting {
  std::string name;
  CpuDeviceOptions options;
  bool poison = false;
};

struct FuzzConfig {
  int num_workers = 2;
  uint64_t seed = 1;
  int num_delay_runs = 2;  // random delays (of every stream) with different seeds
  int max_delay_us = 50;
  bool shuffle_tiles = true;
  bool poison = true;  // every run but the baseline poisons (so a read of stale scratch changes the output)
  bool sanitize = true;  // attach a collecting sanitizer to every run; any report is a failure
};

// baseline (no fuzzing, no poison), poisoned, serialized in creation order and in reverse (each holding the
// work until the host waits, so that the order does not depend on how far the host got), shuffled tiles,
// random delays.
std::vector<FuzzSetting> fuzz_plan(const FuzzConfig& config);

struct FuzzOutcome {
  int num_runs = 0;
  std::vector<std::string> failures;  // one line per failed run or sanitizer report
  bool ok() const { return failures.empty(); }
  std::string summary() const;
};

using FuzzBody = std::function<std::vector<std::byte>(Device&)>;
using DeviceFactory = std::function<std::unique_ptr<Device>(const CpuDeviceOptions&)>;

// Runs `body` once per setting of fuzz_plan(config), each on a fresh device from `make` (default:
// make_cpu_device). A run fails when the body throws, the sanitizer reports, or the output differs from the
// first run's in any byte.
FuzzOutcome run_fuzzed(const FuzzBody& body, const FuzzConfig& config = {}, const DeviceFactory& make = {});

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}
inline std::vector<std::byte> bytes_of(const void* p, size_t bytes) {
  std::vector<std::byte> out(bytes);
  if (bytes) std::memcpy(out.data(), p, bytes);
  return out;
}

}  // namespace moe::rt
