// Unit tests of the stream runtime's error propagation on the CPU device: a failing tile is reported once
// with its operation and stream, and reaches every waiter through events, wait chains and
// device_synchronize, but not work ordered before the failure.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>

#include "runtime/runtime.h"

namespace moe::rt {
namespace {

TEST(RuntimeErrors, TileExceptionIsRethrownOnceWithTheOpName) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream s = dev->create_stream(kPriorityDefault, "side");
  std::atomic<int> later_ran{0};
  s.launch({.name = "bad_op", .num_tiles = 4, .tile = [](int t) {
              if (t == 2) throw std::runtime_error("boom");
            }});
  s.launch({.name = "later", .num_tiles = 3, .tile = [&](int) { later_ran++; }});
  try {
    s.synchronize();
    FAIL() << "expected StreamError";
  } catch (const StreamError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("bad_op"), std::string::npos) << msg;
    EXPECT_NE(msg.find("side"), std::string::npos) << msg;
    EXPECT_NE(msg.find("boom"), std::string::npos) << msg;
  }
  EXPECT_EQ(later_ran.load(), 0);  // skipped, not run on bad data
  // Reported once; the stream works again.
  s.synchronize();
  s.launch({.name = "again", .num_tiles = 3, .tile = [&](int) { later_ran++; }});
  s.synchronize();
  EXPECT_EQ(later_ran.load(), 3);
}

// What synchronize() threw, or "" when it returned.
std::string sync_error(Stream& s) {
  try {
    s.synchronize();
  } catch (const StreamError& e) {
    return e.what();
  }
  return "";
}

Op failing_op(const std::string& name) {
  return {.name = name, .num_tiles = 2, .tile = [](int t) {
            if (t == 1) throw std::runtime_error("tile failed");
          }};
}

TEST(RuntimeErrors, FailureReachesTheWaiterThroughAnEvent) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream side = dev->create_stream(kPriorityDefault, "side");
  Stream main = dev->create_stream(kPriorityDefault, "main");
  Event fork, join;
  main.record(fork);
  side.wait(fork);
  side.launch(failing_op("shared.down"));
  side.record(join);
  main.wait(join);
  std::atomic<bool> sum_ran{false};
  main.launch({.name = "sum", .num_tiles = 1, .tile = [&](int) { sum_ran = true; }});
  const std::string msg = sync_error(main);  // the caller synchronizes main only
  EXPECT_NE(msg.find("op 'shared.down'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stream 'side'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tile failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reached stream 'main'"), std::string::npos) << msg;
  EXPECT_FALSE(sum_ran.load());  // skipped: it would have read what the failed op did not write
  // Reported once, on both: the origin is cleared with the stream that reported it, and both run again.
  EXPECT_EQ(sync_error(side), "");
  EXPECT_EQ(sync_error(main), "");
  main.record(fork);
  side.wait(fork);
  side.launch({.name = "shared.down", .num_tiles = 1, .tile = [](int) {}});
  side.record(join);
  main.wait(join);
  main.launch({.name = "sum", .num_tiles = 1, .tile = [&](int) { sum_ran = true; }});
  EXPECT_EQ(sync_error(main), "");
  EXPECT_TRUE(sum_ran.load());
}

TEST(RuntimeErrors, AWaitOnWorkBeforeTheFailureDoesNotInherit) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream(kPriorityDefault, "a");
  Stream b = dev->create_stream(kPriorityDefault, "b");
  Event before;
  a.launch({.name = "good", .num_tiles = 1, .tile = [](int) {}});
  a.record(before);
  a.launch(failing_op("bad"));
  b.wait(before);
  std::atomic<bool> ran{false};
  b.launch({.name = "b_op", .num_tiles = 1, .tile = [&](int) { ran = true; }});
  EXPECT_EQ(sync_error(b), "");
  EXPECT_TRUE(ran.load());
  EXPECT_NE(sync_error(a).find("op 'bad'"), std::string::npos);
}

TEST(RuntimeErrors, FailureTravelsAlongAChainOfWaits) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream(kPriorityDefault, "a");
  Stream b = dev->create_stream(kPriorityDefault, "b");
  Stream c = dev->create_stream(kPriorityDefault, "c");
  a.launch(failing_op("first"));
  b.wait_stream(a);
  b.launch({.name = "middle", .num_tiles = 1, .tile = [](int) {}});
  c.wait_stream(b);
  const std::string msg = sync_error(c);
  EXPECT_NE(msg.find("op 'first'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stream 'a'"), std::string::npos) << msg;
  // Reported once: a and b, which held it too, are clear; work b skipped still carries it.
  EXPECT_EQ(sync_error(a), "");
  EXPECT_EQ(sync_error(b), "");
  Event skipped_on_b;
  b.record(skipped_on_b);  // after the report: clean, so this does not inherit
  c.wait(skipped_on_b);
  EXPECT_EQ(sync_error(c), "");
}

TEST(RuntimeErrors, AWaitOnASkippedPositionInheritsEvenAfterTheReport) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream(kPriorityDefault, "a");
  Stream b = dev->create_stream(kPriorityDefault, "b");
  a.launch(failing_op("bad"));
  Event skipped;
  a.record(skipped);
  EXPECT_NE(sync_error(a), "");  // reported and cleared on a
  b.wait(skipped);                // still captures work that never ran
  EXPECT_NE(sync_error(b).find("op 'bad'"), std::string::npos);
  Event fresh;
  a.record(fresh);  // after the report: clean
  b.wait(fresh);
  EXPECT_EQ(sync_error(b), "");
}

TEST(RuntimeErrors, DeviceSynchronizeRethrows) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream s = dev->create_stream();
  s.launch({.name = "bad", .num_tiles = 1, .tile = [](int) { throw 42; }});
  EXPECT_THROW(dev->synchronize(), StreamError);
  dev->synchronize();
}

}  // namespace
}  // namespace moe::rt
