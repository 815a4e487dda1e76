// Unit tests of the stream runtime on the CPU device: every event rule, wait_stream, priorities, the tag
// registry, the current-stream guard, polling ops, tracing, observers and lifetime (errors:
// test_runtime_errors.cpp).
//
// Ops that must stay "in flight" while the host checks something block on a Gate the test opens, so no
// test depends on timing.
#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime.h"

namespace moe::rt {
namespace {

// A latch a tile can block on until the test opens it.
class Gate {
 public:
  void open() {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

Op blocking_op(const std::string& name, Gate& gate) {
  return Op{.name = name, .num_tiles = 1, .tile = [&gate](int) { gate.wait(); }};
}

// An op that appends its tag to a log (under a lock), to observe execution order.
struct Log {
  std::mutex mu;
  std::vector<int> items;
  void add(int v) {
    std::lock_guard<std::mutex> lk(mu);
    items.push_back(v);
  }
  std::vector<int> get() {
    std::lock_guard<std::mutex> lk(mu);
    return items;
  }
};

Op log_op(Log& log, int v) {
  return Op{.name = "log" + std::to_string(v), .num_tiles = 1, .tile = [&log, v](int) { log.add(v); }};
}

TEST(RuntimeBasics, LaunchRunsEveryTileOnce) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream s = dev->default_stream();
  std::vector<std::atomic<int>> hits(100);
  s.launch({.name = "fill", .num_tiles = 100, .tile = [&](int t) { hits[t].fetch_add(1); }});
  s.synchronize();
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(RuntimeBasics, StreamIsInOrder) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream s = dev->create_stream();
  Log log;
  for (int i = 0; i < 50; ++i) s.launch(log_op(log, i));
  s.synchronize();
  auto items = log.get();
  ASSERT_EQ(items.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(items[i], i);
}

TEST(RuntimeBasics, ZeroTileOpCompletes) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream s = dev->default_stream();
  s.launch({.name = "empty", .num_tiles = 0});
  s.synchronize();
  EXPECT_TRUE(s.query());
}

TEST(RuntimeBasics, RejectsBadOps) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream s = dev->default_stream();
  EXPECT_THROW(s.launch({.name = "neg", .num_tiles = -1, .tile = [](int) {}}), std::invalid_argument);
  EXPECT_THROW(s.launch({.name = "no_fn", .num_tiles = 3}), std::invalid_argument);
  EXPECT_THROW(Stream().launch({.name = "x"}), std::logic_error);
}

// Workers pinned from another CPU on (ranks sharing a machine) run on those CPUs; a negative start is refused.
TEST(RuntimeBasics, WorkersPinnedFromAnOffset) {
  EXPECT_THROW(make_cpu_device({.num_workers = 1, .first_cpu = -1}), std::invalid_argument);
  auto dev = make_cpu_device({.num_workers = 1, .first_cpu = 1});
  std::atomic<int> cpu{-1};
  dev->default_stream().launch({.name = "where", .num_tiles = 1, .tile = [&](int) { cpu = sched_getcpu(); }});
  dev->synchronize();
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.size() < 2) GTEST_SKIP() << "one CPU: nothing is pinned";
  EXPECT_EQ(cpu.load(), cpus[1]);
}

TEST(RuntimeBasics, LaunchIsAsynchronousToTheHost) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream s = dev->default_stream();
  Gate gate;
  std::atomic<bool> ran{false};
  s.launch(blocking_op("blocked", gate));
  s.launch({.name = "after", .num_tiles = 1, .tile = [&](int) { ran = true; }});
  // launch returned although the first op cannot finish until the gate opens.
  EXPECT_FALSE(ran.load());
  EXPECT_FALSE(s.query());
  gate.open();
  s.synchronize();
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(s.query());
}

// ---- events --------------------------------------------------------------------------------------------

TEST(RuntimeEvents, NeverRecordedEventQueriesTrueAndWaitIsNoOp) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream s = dev->create_stream();
  Event e;
  EXPECT_FALSE(e.recorded());
  EXPECT_TRUE(e.query());
  e.synchronize();  // returns at once
  std::atomic<bool> ran{false};
  s.wait(e);
  s.launch({.name = "after", .num_tiles = 1, .tile = [&](int) { ran = true; }});
  s.synchronize();
  EXPECT_TRUE(ran.load());
}

TEST(RuntimeEvents, RecordCapturesWorkEnqueuedSoFar) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream();
  Gate g1, g2;
  a.launch(blocking_op("first", g1));
  Event e;
  a.record(e);
  a.launch(blocking_op("second", g2));  // enqueued after the record: not captured
  EXPECT_TRUE(e.recorded());
  EXPECT_FALSE(e.query());
  g1.open();
  e.synchronize();  // completes although "second" is still blocked
  EXPECT_TRUE(e.query());
  EXPECT_FALSE(a.query());
  g2.open();
  a.synchronize();
}

TEST(RuntimeEvents, ReRecordOverwritesTheCapture) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream();
  Stream b = dev->create_stream();
  Event e;
  a.record(e);  // captures nothing: complete at once
  EXPECT_TRUE(e.query());
  Gate gate;
  b.launch(blocking_op("b_op", gate));
  b.record(e);  // overwrites: now bound to b's blocked op
  EXPECT_FALSE(e.query());
  gate.open();
  e.synchronize();
  EXPECT_TRUE(e.query());
}

TEST(RuntimeEvents, WaitBindsToTheLatestRecordAtWaitTime) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream(kPriorityDefault, "a");
  Stream b = dev->create_stream(kPriorityDefault, "b");
  Gate g1, g2;
  std::atomic<bool> first_done{false};
  a.launch({.name = "first", .num_tiles = 1, .tile = [&](int) {
              g1.wait();
              first_done = true;
            }});
  Event e;
  a.record(e);
  std::atomic<bool> waiter_saw_first{false};
  b.wait(e);  // binds to the record after "first"
  b.launch({.name = "waiter", .num_tiles = 1, .tile = [&](int) { waiter_saw_first = first_done.load(); }});
  // A later re-record of e after a blocked op must not move b's wait.
  a.launch(blocking_op("second", g2));
  a.record(e);
  g1.open();
  b.synchronize();  // must finish while "second" is still blocked
  EXPECT_TRUE(waiter_saw_first.load());
  EXPECT_FALSE(e.query());
  g2.open();
  a.synchronize();
}

TEST(RuntimeEvents, WaitHoldsLaterWorkOfTheWaitingStream) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream();
  Stream b = dev->create_stream();
  Gate gate;
  a.launch(blocking_op("producer", gate));
  Event e;
  a.record(e);
  b.wait(e);
  std::atomic<bool> ran{false};
  b.launch({.name = "consumer", .num_tiles = 1, .tile = [&](int) { ran = true; }});
  // Give the scheduler every chance to run the consumer early; it must not.
  for (int i = 0; i < 100; ++i) std::this_thread::yield();
  EXPECT_FALSE(ran.load());
  EXPECT_FALSE(b.query());
  gate.open();
  b.synchronize();
  EXPECT_TRUE(ran.load());
}

TEST(RuntimeEvents, WaitStreamOrdersAfterAllPriorWork) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream();
  Stream b = dev->create_stream();
  Log log;
  Gate gate;
  a.launch({.name = "a0", .num_tiles = 1, .tile = [&](int) {
              gate.wait();
              log.add(0);
            }});
  a.launch(log_op(log, 1));
  b.wait_stream(a);
  b.launch(log_op(log, 2));
  gate.open();
  b.synchronize();
  EXPECT_EQ(log.get(), (std::vector<int>{0, 1, 2}));
}

// ---- priorities, tags, guard ---------------------------------------------------------------------------

TEST(RuntimePriorities, HigherPriorityStreamIsTakenFirst) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream low = dev->create_stream(kPriorityDefault, "low");
  Stream high = dev->create_stream(kPriorityHigh, "high");
  Stream blocker = dev->create_stream(kPriorityHigh - 1, "blocker");
  Gate gate;
  Log log;
  blocker.launch(blocking_op("hold", gate));  // occupies the only worker
  Event held;
  blocker.record(held);
  low.wait(held);
  high.wait(held);
  low.launch(log_op(log, 1));   // enqueued first
  high.launch(log_op(log, 2));  // higher priority: must run first
  gate.open();
  dev->synchronize();
  EXPECT_EQ(log.get(), (std::vector<int>{2, 1}));
  EXPECT_EQ(high.priority(), kPriorityHigh);
}

TEST(RuntimeRegistry, SameTagSameStream) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream a = dev->stream_for("11");
  Stream b = dev->stream_for("11");
  Stream c = dev->stream_for("12");
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == c);
  EXPECT_EQ(a.name(), "11");
  EXPECT_FALSE(a == dev->default_stream());
  EXPECT_EQ(&a.device(), dev.get());
}

TEST(RuntimeGuard, CurrentStreamFollowsTheGuard) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream side = dev->create_stream();
  EXPECT_TRUE(current_stream(*dev) == dev->default_stream());
  {
    StreamGuard g(side);
    EXPECT_TRUE(current_stream(*dev) == side);
    {
      Stream inner = dev->create_stream();
      StreamGuard g2(inner);
      EXPECT_TRUE(current_stream(*dev) == inner);
    }
    EXPECT_TRUE(current_stream(*dev) == side);
  }
  EXPECT_TRUE(current_stream(*dev) == dev->default_stream());
  // A guard for another device does not leak into this one.
  auto other = make_cpu_device({.num_workers = 1});
  StreamGuard g(other->default_stream());
  EXPECT_TRUE(current_stream(*dev) == dev->default_stream());
}

// ---- polling ops ---------------------------------------------------------------------------------------

TEST(RuntimePolling, PollingOpCompletesWithoutOccupyingAWorker) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream comm = dev->create_stream(kPriorityDefault, "comm");
  Stream compute = dev->create_stream(kPriorityDefault, "compute");
  std::atomic<bool> transfer_done{false};
  std::atomic<int> polls{0};
  std::atomic<int> in_poll{0};
  bool concurrent_poll = false;
  comm.launch({.name = "transfer", .num_tiles = 0, .poll = [&] {
                 if (in_poll.fetch_add(1) != 0) concurrent_poll = true;
                 polls++;
                 bool d = transfer_done.load();
                 in_poll.fetch_sub(1);
                 return d;
               }});
  std::atomic<bool> after{false};
  comm.launch({.name = "after_transfer", .num_tiles = 1, .tile = [&](int) { after = true; }});
  // The single worker must still run the other stream while the transfer is pending; that op is what
  // finishes the transfer, so this deadlocks if polling held the worker.
  compute.launch({.name = "compute", .num_tiles = 4, .tile = [&](int t) {
                    if (t == 3) transfer_done = true;
                  }});
  comm.synchronize();
  EXPECT_TRUE(after.load());
  EXPECT_GE(polls.load(), 1);
  EXPECT_FALSE(concurrent_poll);
  compute.synchronize();
}

TEST(RuntimePolling, PollExceptionIsAStreamError) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream s = dev->create_stream();
  s.launch({.name = "bad_poll", .num_tiles = 0, .poll = []() -> bool { throw std::runtime_error("link down"); }});
  try {
    s.synchronize();
    FAIL();
  } catch (const StreamError& e) {
    EXPECT_NE(std::string(e.what()).find("bad_poll"), std::string::npos);
  }
}

// ---- tracing -------------------------------------------------------------------------------------------

TEST(RuntimeTracing, RecordsOpsTilesAndEdges) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream(kPriorityDefault, "a");
  Stream b = dev->create_stream(kPriorityDefault, "b");
  a.launch({.name = "untraced", .num_tiles = 1, .tile = [](int) {}});
  a.synchronize();
  dev->set_tracing(true);
  a.launch({.name = "producer", .num_tiles = 3, .tile = [](int) {}});
  Event e;
  a.record(e);  // a's position 3
  b.wait(e);    // b's position 1
  b.launch({.name = "consumer", .num_tiles = 2, .tile = [](int) {}});
  dev->synchronize();
  dev->set_tracing(false);
  Trace t = dev->take_trace();
  EXPECT_EQ(t.num_workers, 2);
  ASSERT_EQ(t.ops.size(), 2u);
  const OpRecord* prod = nullptr;
  const OpRecord* cons = nullptr;
  for (const auto& op : t.ops) (op.name == "producer" ? prod : cons) = &op;
  ASSERT_TRUE(prod && cons);
  EXPECT_EQ(cons->name, "consumer");
  EXPECT_EQ(prod->stream_id, a.id());
  EXPECT_EQ(prod->stream_name, "a");
  EXPECT_EQ(prod->seq, 2u);
  EXPECT_EQ(cons->seq, 2u);
  EXPECT_EQ(prod->tiles.size(), 3u);
  EXPECT_EQ(cons->tiles.size(), 2u);
  EXPECT_LE(prod->enqueue_ns, prod->start_ns);
  EXPECT_LE(prod->start_ns, prod->end_ns);
  for (const auto& tr : prod->tiles) {
    EXPECT_GE(tr.start_ns, prod->start_ns);
    EXPECT_LE(tr.end_ns, prod->end_ns);
    EXPECT_LE(tr.start_ns, tr.end_ns);
    EXPECT_GE(tr.worker, 0);
    EXPECT_LT(tr.worker, 2);
  }
  EXPECT_LE(prod->end_ns, cons->start_ns);
  ASSERT_EQ(t.edges.size(), 1u);
  EXPECT_EQ(t.edges[0].from_stream, a.id());
  EXPECT_EQ(t.edges[0].from_seq, 3u);
  EXPECT_EQ(t.edges[0].to_stream, b.id());
  EXPECT_EQ(t.edges[0].to_seq, 1u);
  EXPECT_TRUE(dev->take_trace().ops.empty());
}

// ---- observers -----------------------------------------------------------------------------------------

// Records every hook as text, in call order.
class RecordingObserver : public Observer {
 public:
  std::vector<std::string> calls;
  void on_stream_created(const Stream& s) override { calls.push_back("created " + s.name()); }
  void on_launch(const Stream& s, uint64_t seq, const Op& op) override {
    calls.push_back("launch " + s.name() + " " + std::to_string(seq) + " " + op.name + " " +
                    std::to_string(op.accesses.size()));
  }
  void on_record(const Stream& s, uint64_t seq, const Event& e) override {
    calls.push_back("record " + s.name() + " " + std::to_string(seq));
  }
  void on_wait(const Stream& s, uint64_t seq, const Event& e) override {
    calls.push_back("wait " + s.name() + " " + std::to_string(seq) + (e.recorded() ? " bound" : " unbound"));
  }
  void on_stream_synchronize(const Stream& s) override { calls.push_back("sync " + s.name()); }
  void on_event_synchronize(const Event& e) override { calls.push_back("event_sync"); }
  void on_device_synchronize() override { calls.push_back("device_sync"); }
  void on_alloc(const void* p, size_t bytes) override { calls.push_back("alloc " + std::to_string(bytes)); }
  void on_free(const void* p, size_t bytes) override { calls.push_back("free " + std::to_string(bytes)); }
};

TEST(RuntimeObservers, HooksSeeEveryCallInProgramOrderWithPositions) {
  auto dev = make_cpu_device({.num_workers = 2});
  auto obs = std::make_shared<RecordingObserver>();
  dev->add_observer(obs);
  Stream main = dev->default_stream();
  Stream side = dev->stream_for("11");
  float buf[4] = {};
  dev->notify_alloc(buf, sizeof(buf));
  Event never, fork;
  side.wait(never);
  main.launch({.name = "prep", .num_tiles = 1, .tile = [](int) {}, .accesses = {writes(buf, sizeof(buf))}});
  main.record(fork);
  side.wait(fork);
  side.wait_stream(main);
  side.synchronize();
  fork.synchronize();
  dev->synchronize();
  dev->notify_free(buf, sizeof(buf));
  dev->remove_observer(obs.get());
  main.launch({.name = "unseen", .num_tiles = 0});
  std::vector<std::string> expected{"created 11",      "alloc 16",       "wait 11 1 unbound", "launch default 1 prep 1",
                                    "record default 2", "wait 11 2 bound", "record default 3", "wait 11 3 bound",
                                    "sync 11",         "event_sync",     "device_sync",      "free 16"};
  EXPECT_EQ(obs->calls, expected);
}

// Two host threads launching on one stream (two layers' side work on the one side stream): every position an
// observer is told is the one the entry really got, each exactly once.
TEST(RuntimeObservers, ThreadsSharingAStreamReportDistinctTruePositions) {
  struct Positions : Observer {
    std::mutex mu;
    std::vector<uint64_t> seen;
    void on_launch(const Stream&, uint64_t seq, const Op&) override {
      std::lock_guard lk(mu);
      seen.push_back(seq);
    }
    void on_record(const Stream&, uint64_t seq, const Event&) override {
      std::lock_guard lk(mu);
      seen.push_back(seq);
    }
  };
  auto dev = make_cpu_device({.num_workers = 2});
  auto obs = std::make_shared<Positions>();
  dev->add_observer(obs);
  Stream shared = dev->create_stream(kPriorityDefault, "shared");
  constexpr int kPerThread = 2000;
  auto work = [&] {
    Event e;
    for (int i = 0; i < kPerThread; ++i) {
      if (i % 4 == 3) {
        shared.record(e);
      } else {
        shared.launch({.name = "op", .num_tiles = 1, .tile = [](int) {}});
      }
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  shared.synchronize();
  dev->remove_observer(obs.get());
  std::sort(obs->seen.begin(), obs->seen.end());
  ASSERT_EQ(obs->seen.size(), 2u * kPerThread);
  for (size_t i = 0; i < obs->seen.size(); ++i) ASSERT_EQ(obs->seen[i], i + 1) << "position reported twice or skipped";
}

TEST(RuntimeObservers, ThrowingObserverStopsTheCall) {
  struct Refuse : Observer {
    void on_launch(const Stream&, uint64_t, const Op& op) override {
      if (op.name == "bad") throw std::runtime_error("refused");
    }
  };
  auto dev = make_cpu_device({.num_workers = 1});
  dev->add_observer(std::make_shared<Refuse>());
  Stream s = dev->default_stream();
  std::atomic<int> ran{0};
  EXPECT_THROW(s.launch({.name = "bad", .num_tiles = 1, .tile = [&](int) { ran++; }}), std::runtime_error);
  s.launch({.name = "good", .num_tiles = 1, .tile = [&](int) { ran++; }});
  s.synchronize();
  EXPECT_EQ(ran.load(), 1);
}

// ---- lifetime ------------------------------------------------------------------------------------------

TEST(RuntimeLifetime, DestructorDrainsPendingWork) {
  std::atomic<int> count{0};
  {
    auto dev = make_cpu_device({.num_workers = 2});
    Stream s = dev->create_stream();
    for (int i = 0; i < 20; ++i) s.launch({.name = "w", .num_tiles = 5, .tile = [&](int) { count++; }});
  }
  EXPECT_EQ(count.load(), 100);
}

TEST(RuntimeLifetime, HandlesOutliveTheDevice) {
  Stream s;
  Event e;
  {
    auto dev = make_cpu_device({.num_workers = 1});
    s = dev->create_stream(kPriorityDefault, "orphan");
    s.launch({.name = "w", .num_tiles = 1, .tile = [](int) {}});
    s.record(e);
  }
  EXPECT_TRUE(e.query());
  EXPECT_TRUE(s.query());
  s.synchronize();  // the device drained it
  try {
    s.launch({.name = "late", .num_tiles = 1, .tile = [](int) {}});
    FAIL();
  } catch (const std::logic_error& ex) {
    EXPECT_NE(std::string(ex.what()).find("orphan"), std::string::npos);
  }
}

}  // namespace
}  // namespace moe::rt
