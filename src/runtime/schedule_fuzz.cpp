// Schedule fuzzing: the plan of fuzz settings, the runner that compares outputs, and NaN poisoning.
#include "runtime/schedule_fuzz.h"

#include <cstdio>
#include <exception>

namespace moe::rt {

namespace {

std::string hex_byte(std::byte b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned>(b));
  return buf;
}

// Empty when equal, else where and how the two outputs differ.
std::string difference(const std::vector<std::byte>& ref, const std::vector<std::byte>& got) {
  if (ref.size() != got.size()) {
    return "output has " + std::to_string(got.size()) + " bytes, the first run had " + std::to_string(ref.size());
  }
  size_t first = ref.size();
  size_t count = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] == got[i]) continue;
    if (first == ref.size()) first = i;
    ++count;
  }
  if (count == 0) return "";
  return std::to_string(count) + " of " + std::to_string(ref.size()) + " bytes differ from the first run, first at byte " +
         std::to_string(first) + " (" + hex_byte(got[first]) + ", expected " + hex_byte(ref[first]) + ")";
}

}  // namespace

void poison_now(void* p, size_t bytes) {
  if (p != nullptr && bytes > 0) std::memset(p, kPoisonByte, bytes);
}

void launch_poison(Stream& s, void* p, size_t bytes, const std::string& what) {
  if (p == nullptr || bytes == 0) return;
  s.launch({.name = "poison: " + what,
            .num_tiles = 1,
            .tile = [p, bytes](int) { poison_now(p, bytes); },
            .accesses = {writes(p, bytes)},
            .fills_garbage = true});
}

std::vector<FuzzSetting> fuzz_plan(const FuzzConfig& config) {
  std::vector<FuzzSetting> plan;
  auto base = [&] {
    CpuDeviceOptions o;
    o.num_workers = config.num_workers;
    return o;
  };
  const bool poison = config.poison;
  plan.push_back({"baseline", base(), false});
  if (poison) plan.push_back({"poisoned", base(), true});
  CpuDeviceOptions fwd = base();
  fwd.fuzz = {.seed = config.seed, .serialize_streams = true, .hold_until_host_waits = true};
  plan.push_back({"serialized, creation order", fwd, poison});
  CpuDeviceOptions rev = fwd;
  rev.fuzz.serialize_reverse = true;
  plan.push_back({"serialized, reverse order", rev, poison});
  if (config.shuffle_tiles) {
    CpuDeviceOptions sh = base();
    sh.fuzz = {.seed = config.seed, .shuffle_tiles = true};
    plan.push_back({"shuffled tiles", sh, poison});
  }
  for (int i = 0; i < config.num_delay_runs; ++i) {
    CpuDeviceOptions d = base();
    d.fuzz = {.seed = config.seed + 1 + static_cast<uint64_t>(i), .max_delay_us = config.max_delay_us,
              .shuffle_tiles = config.shuffle_tiles};
    plan.push_back({"random delays, seed " + std::to_string(d.fuzz.seed), d, poison});
  }
  return plan;
}

std::string FuzzOutcome::summary() const {
  std::string s = std::to_string(num_runs) + " fuzzed runs, " + std::to_string(failures.size()) + " failures";
  for (const std::string& f : failures) s += "\n  " + f;
  return s;
}

FuzzOutcome run_fuzzed(const FuzzBody& body, const FuzzConfig& config, const DeviceFactory& make) {
  FuzzOutcome outcome;
  std::vector<std::byte> reference;
  bool have_reference = false;
  for (const FuzzSetting& setting : fuzz_plan(config)) {
    ++outcome.num_runs;
    std::unique_ptr<Device> dev = make ? make(setting.options) : make_cpu_device(setting.options);
    if (setting.poison) dev->add_interposer(std::make_shared<Poisoner>());
    std::shared_ptr<Sanitizer> san;
    if (config.sanitize) san = enable_sanitizer(*dev, {.throw_on_first = false});
    std::vector<std::byte> out;
    try {
      out = body(*dev);
      dev->synchronize();
    } catch (const std::exception& e) {
      outcome.failures.push_back("[" + setting.name + "] threw: " + e.what());
      continue;
    }
    if (san) {
      for (const RaceReport& r : san->take_reports()) outcome.failures.push_back("[" + setting.name + "] " + r.message);
      disable_sanitizer(*dev, *san);
    }
    if (!have_reference) {
      reference = std::move(out);
      have_reference = true;
      continue;
    }
    std::string diff = difference(reference, out);
    if (!diff.empty()) outcome.failures.push_back("[" + setting.name + "] " + diff);
  }
  return outcome;
}

}  // namespace moe::rt
