// The schedule fuzz runner on a small two-stream program: the correct program gives the same bytes under
// every setting; a missing join changes the output when the streams run one at a time in either order; an
// uninitialised scratch read changes it once scratch is poisoned; the sanitizer reports during fuzzed runs.
#include "runtime/schedule_fuzz.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "test_sanitizer_program.h"

namespace moe::rt {
namespace {

FuzzBody mini_layer(test::PlantedBugs bugs = {}) {
  return [bugs](Device& dev) {
    test::MiniLayer layer(dev);
    layer.run(bugs);
    dev.synchronize();
    return bytes_of(layer.out());
  };
}

bool mentions(const FuzzOutcome& o, const std::string& s) {
  for (const std::string& f : o.failures)
    if (f.find(s) != std::string::npos) return true;
  return false;
}

TEST(ScheduleFuzz, PlanCoversBothOrdersDelaysAndShuffles) {
  std::vector<FuzzSetting> plan = fuzz_plan({.num_delay_runs = 3});
  ASSERT_GE(plan.size(), 7u);
  EXPECT_FALSE(plan[0].poison);
  EXPECT_EQ(plan[0].options.fuzz.seed, 0u);  // the baseline is unfuzzed
  int serialized = 0, reversed = 0, delayed = 0, shuffled = 0;
  for (const FuzzSetting& s : plan) {
    serialized += s.options.fuzz.serialize_streams;
    reversed += s.options.fuzz.serialize_reverse;
    delayed += s.options.fuzz.max_delay_us > 0;
    shuffled += s.options.fuzz.shuffle_tiles;
  }
  EXPECT_EQ(serialized, 2);
  EXPECT_EQ(reversed, 1);
  EXPECT_EQ(delayed, 3);
  EXPECT_GE(shuffled, 1);
}

TEST(ScheduleFuzz, CorrectProgramIsBitwiseStable) {
  FuzzOutcome o = run_fuzzed(mini_layer());
  EXPECT_TRUE(o.ok()) << o.summary();
  EXPECT_GE(o.num_runs, 6);
}

TEST(ScheduleFuzz, MissingJoinChangesTheOutput) {
  // Without the sanitizer, so that the output comparison alone must find it: run in creation order, main's
  // combine reads the shared output before the side stream wrote it.
  // One worker: the racing ops never run at the same time (no real data race under ThreadSanitizer).
  FuzzOutcome o = run_fuzzed(mini_layer({.no_join = true}), {.num_workers = 1, .num_delay_runs = 0, .sanitize = false});
  EXPECT_FALSE(o.ok());
  EXPECT_TRUE(mentions(o, "differ")) << o.summary();
}

TEST(ScheduleFuzz, UninitialisedScratchShowsOnceScratchIsPoisoned) {
  // Deterministic in every order (the scratch of a fresh run holds zeros): only poisoning reveals it.
  FuzzOutcome o = run_fuzzed(mini_layer({.partial_scratch = true}), {.num_delay_runs = 0, .sanitize = false});
  EXPECT_TRUE(mentions(o, "[poisoned]")) << o.summary();
  FuzzOutcome sanitized = run_fuzzed(mini_layer({.partial_scratch = true}), {.num_delay_runs = 0});
  EXPECT_TRUE(mentions(sanitized, "uninitialized-read")) << sanitized.summary();
}

TEST(ScheduleFuzz, SanitizerReportsInFuzzedRuns) {
  FuzzOutcome o = run_fuzzed(mini_layer({.routed_in_place = true}), {.num_workers = 1, .num_delay_runs = 0});
  EXPECT_TRUE(mentions(o, "write-after-read")) << o.summary();
  EXPECT_TRUE(mentions(o, "'routed_up'")) << o.summary();
}

TEST(ScheduleFuzz, BodyErrorsAreFailures) {
  FuzzOutcome o = run_fuzzed([](Device&) -> std::vector<std::byte> { throw std::runtime_error("boom"); },
                             {.num_delay_runs = 0});
  EXPECT_FALSE(o.ok());
  EXPECT_TRUE(mentions(o, "threw: boom")) << o.summary();
}

TEST(Poison, FillsNaNOnTheStreamOnlyWithThePoisoner) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream s = dev->default_stream();
  std::vector<float> v(8, 1.0f);
  dev->notify_reuse(s, v.data(), v.size() * sizeof(float), "v");
  s.synchronize();
  EXPECT_EQ(v[0], 1.0f);  // nothing happens without an interposer
  auto poisoner = std::make_shared<Poisoner>();
  dev->add_interposer(poisoner);
  dev->notify_reuse(s, v.data(), v.size() * sizeof(float), "v");
  s.synchronize();
  for (float f : v) EXPECT_TRUE(std::isnan(f));
  std::vector<float> fresh(4, 1.0f);
  dev->notify_alloc(fresh.data(), fresh.size() * sizeof(float));  // fresh memory: poisoned at once
  for (float f : fresh) EXPECT_TRUE(std::isnan(f));
  dev->remove_interposer(poisoner.get());
  std::fill(v.begin(), v.end(), 1.0f);
  dev->notify_reuse(s, v.data(), v.size() * sizeof(float), "v");
  s.synchronize();
  EXPECT_EQ(v[0], 1.0f);
  uint16_t bf16 = 0;
  poison_now(&bf16, sizeof bf16);
  EXPECT_EQ(bf16 & 0x7F80, 0x7F80);  // exponent all ones, mantissa non-zero: NaN in bf16 (and f16)
  EXPECT_NE(bf16 & 0x007F, 0);
}

}  // namespace
}  // namespace moe::rt
