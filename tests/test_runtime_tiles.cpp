// The CPU device's tile scheduler at 1, 2 and 16 workers (16 oversubscribes a small machine on purpose:
// workers are preempted mid-claim): every tile of every op runs exactly once (a counter per tile), in
// stream order, across many concurrent streams; a failing tile stops its op's other tiles and fails the
// stream as runtime.h says; polling ops poll only after their tiles and never concurrently; graph replays
// run every node's tiles once per replay after its dependencies; a higher-priority op and a due poll get
// a worker between two tiles of a long op; an idle worker stays awake while another runs tiles.
//
// Size: MOE_TEST_SCALE=small (the sanitizer CI runs) shrinks the programs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cpu_affinity.h"
#include "runtime/graph.h"
#include "runtime/runtime.h"

namespace moe::rt {
namespace {

bool small_scale() {
  const char* s = std::getenv("MOE_TEST_SCALE");
  return s != nullptr && std::string(s) == "small";
}

struct TileConfig {
  const char* name;
  int workers;
  FuzzOptions fuzz;
  int spin_us = 50;
};

void PrintTo(const TileConfig& c, std::ostream* os) { *os << c.name; }

CpuDeviceOptions options(const TileConfig& c) {
  CpuDeviceOptions o;
  o.num_workers = c.workers;
  o.fuzz = c.fuzz;
  o.spin_us = c.spin_us;
  return o;
}

// Per-tile run counts of one op, and how many of its tiles finished (its successors check it).
struct OpCounts {
  explicit OpCounts(int n) : runs(static_cast<size_t>(n)) {}
  std::vector<std::atomic<int>> runs;
  std::atomic<int> finished{0};
  int num_tiles() const { return static_cast<int>(runs.size()); }
};

// A tile that counts itself and checks that every predecessor op has finished all of its tiles.
Op counting_op(const std::string& name, OpCounts* self, std::vector<OpCounts*> preds) {
  return {.name = name, .num_tiles = self->num_tiles(), .tile = [self, preds](int t) {
            for (OpCounts* p : preds) {
              if (p->finished.load(std::memory_order_acquire) != p->num_tiles())
                throw std::runtime_error("a predecessor op has not finished");
            }
            self->runs[static_cast<size_t>(t)].fetch_add(1, std::memory_order_relaxed);
            self->finished.fetch_add(1, std::memory_order_acq_rel);
          }};
}

void expect_each_tile_once(const OpCounts& c, const std::string& what) {
  for (int t = 0; t < c.num_tiles(); ++t)
    ASSERT_EQ(c.runs[static_cast<size_t>(t)].load(), 1) << what << " tile " << t;
}

class RuntimeTiles : public ::testing::TestWithParam<TileConfig> {};

// Many streams, each a queue of ops of 1..257 tiles (a few empty), with cross-stream waits: every tile runs
// exactly once, and no tile starts before the ops it depends on (stream order and the waits) finished.
TEST_P(RuntimeTiles, EveryTileRunsExactlyOnceAcrossManyStreams) {
  auto dev = make_cpu_device(options(GetParam()));
  const int num_streams = 8;
  const int ops_per_stream = small_scale() ? 12 : 40;
  std::vector<Stream> streams;
  for (int i = 0; i < num_streams; ++i)
    streams.push_back(dev->create_stream(i % 3 - 1, "s" + std::to_string(i)));
  std::mt19937 rng(42);
  std::vector<std::unique_ptr<OpCounts>> ops;
  std::vector<OpCounts*> last(num_streams, nullptr);
  for (int k = 0; k < ops_per_stream; ++k) {
    for (int s = 0; s < num_streams; ++s) {
      std::vector<OpCounts*> preds;
      if (last[s]) preds.push_back(last[s]);
      int other = static_cast<int>(rng() % num_streams);
      if (other != s && last[other] && rng() % 3 == 0) {
        streams[s].wait_stream(streams[other]);
        preds.push_back(last[other]);
      }
      int tiles = rng() % 10 == 0 ? 0 : 1 + static_cast<int>(rng() % 257);
      ops.push_back(std::make_unique<OpCounts>(tiles));
      streams[s].launch(counting_op("op" + std::to_string(ops.size() - 1), ops.back().get(), preds));
      last[s] = ops.back().get();
    }
  }
  dev->synchronize();  // rethrows a tile that saw an unfinished predecessor
  for (size_t i = 0; i < ops.size(); ++i) expect_each_tile_once(*ops[i], "op" + std::to_string(i));
}

// A failing tile in the middle of a wide op: the stream's error names the op; the op's other tiles stop
// being handed out (far fewer than all run; none twice); the stream skips its later work and a stream
// waiting on it inherits the error; after the report both streams run again, every tile once.
TEST_P(RuntimeTiles, FailingTileStopsItsOpAndFailsTheStream) {
  auto dev = make_cpu_device(options(GetParam()));
  Stream s = dev->create_stream(kPriorityDefault, "wide_stream");
  Stream waiter = dev->create_stream(kPriorityDefault, "waiter");
  const int n = small_scale() ? 4000 : 20000;
  const int bad = 50;  // the 51st tile to start fails (whichever index it is: the order may be shuffled)
  std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
  std::atomic<int> started{0};
  std::atomic<bool> after_ran{false}, waiter_ran{false};
  s.launch({.name = "wide", .num_tiles = n, .tile = [&](int t) {
              runs[static_cast<size_t>(t)].fetch_add(1, std::memory_order_relaxed);
              if (started.fetch_add(1) == bad) throw std::runtime_error("tile 50 failed");
              // Slow enough that the rest of the op cannot run before the failure is seen.
              std::this_thread::sleep_for(std::chrono::microseconds(20));
            }});
  s.launch({.name = "after", .num_tiles = 4, .tile = [&](int) { after_ran = true; }});
  waiter.wait_stream(s);
  waiter.launch({.name = "joined", .num_tiles = 4, .tile = [&](int) { waiter_ran = true; }});
  try {
    waiter.synchronize();
    FAIL() << "the waiter must inherit the error";
  } catch (const StreamError& e) {
    EXPECT_NE(std::string(e.what()).find("op 'wide'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tile 50 failed"), std::string::npos) << e.what();
  }
  s.synchronize();  // reported once: cleared on both streams
  EXPECT_FALSE(after_ran.load());
  EXPECT_FALSE(waiter_ran.load());
  int ran = 0;
  for (int t = 0; t < n; ++t) {
    int r = runs[static_cast<size_t>(t)].load();
    ASSERT_LE(r, 1) << "tile " << t;
    ran += r;
  }
  EXPECT_LT(ran, n / 2) << "tiles went on being handed out after the failure";

  OpCounts again(300), joined(77);
  s.launch(counting_op("again", &again, {}));
  waiter.wait_stream(s);
  waiter.launch(counting_op("joined2", &joined, {&again}));
  dev->synchronize();
  expect_each_tile_once(again, "again");
  expect_each_tile_once(joined, "joined2");
}

// Polling ops with tiles, on several streams: poll() is called only after all of the op's tiles finished,
// never concurrently with itself, and the op completes (its successor runs) only after poll() said done.
TEST_P(RuntimeTiles, PollingOpsPollAfterTheirTilesOnly) {
  auto dev = make_cpu_device(options(GetParam()));
  const int num_streams = 4;
  const int ops_per_stream = small_scale() ? 4 : 12;
  struct PollState {
    std::atomic<int> in_poll{0};
    std::atomic<int> polls{0};
    std::atomic<bool> done{false};
    std::atomic<int> errors{0};
  };
  std::vector<Stream> streams;
  for (int i = 0; i < num_streams; ++i)
    streams.push_back(dev->create_stream(kPriorityDefault, "p" + std::to_string(i)));
  std::vector<std::unique_ptr<OpCounts>> counts;
  std::vector<std::unique_ptr<PollState>> polls;
  for (int k = 0; k < ops_per_stream; ++k) {
    for (Stream& st : streams) {
      counts.push_back(std::make_unique<OpCounts>(1 + k * 13 % 97));
      polls.push_back(std::make_unique<PollState>());
      OpCounts* c = counts.back().get();
      PollState* p = polls.back().get();
      Op op = counting_op("polled", c, {});
      op.poll = [c, p] {
        if (p->in_poll.fetch_add(1) != 0) p->errors++;
        if (c->finished.load(std::memory_order_acquire) != c->num_tiles()) p->errors++;
        bool done = p->polls.fetch_add(1) + 1 >= 3;  // done at the third poll
        if (done) p->done = true;
        p->in_poll.fetch_sub(1);
        return done;
      };
      st.launch(std::move(op));
      st.launch({.name = "next", .num_tiles = 2, .tile = [p](int) {
                   if (!p->done.load()) throw std::runtime_error("ran before the polling op completed");
                 }});
    }
  }
  dev->synchronize();
  for (size_t i = 0; i < counts.size(); ++i) {
    expect_each_tile_once(*counts[i], "polled op " + std::to_string(i));
    EXPECT_EQ(polls[i]->polls.load(), 3);
    EXPECT_EQ(polls[i]->errors.load(), 0) << "polled op " << i;
  }
}

// A captured fork/join over three streams, nodes of many tiles, replayed many times: every node's tiles run
// once per replay, after its dependencies finished theirs; then a replay whose node fails fails the stream
// (naming the node), and the next replay runs whole again.
TEST_P(RuntimeTiles, GraphReplaysRunEveryTileOncePerReplay) {
  auto dev = make_cpu_device(options(GetParam()));
  Stream main = dev->default_stream();
  Stream a = dev->create_stream(kPriorityDefault, "a");
  Stream b = dev->create_stream(kPriorityHigh, "b");
  struct Node {
    std::vector<std::atomic<int>> runs;
    std::atomic<int> finished{0};  // tiles finished in this replay
    explicit Node(int n) : runs(static_cast<size_t>(n)) {}
  };
  std::vector<std::unique_ptr<Node>> nodes;
  std::atomic<int> replay{0};  // replays completed before this one
  std::atomic<int> fail_tile{-1};
  std::atomic<int> order_errors{0};
  auto node_op = [&](int tiles, std::vector<Node*> preds) {
    nodes.push_back(std::make_unique<Node>(tiles));
    Node* self = nodes.back().get();
    return Op{.name = "n" + std::to_string(nodes.size() - 1), .num_tiles = tiles, .tile = [&, self, preds](int t) {
                for (Node* p : preds) {
                  if (p->finished.load(std::memory_order_acquire) != static_cast<int>(p->runs.size())) order_errors++;
                }
                if (self == nodes[2].get() && t == fail_tile.load()) throw std::runtime_error("node tile failed");
                self->runs[static_cast<size_t>(t)].fetch_add(1, std::memory_order_relaxed);
                self->finished.fetch_add(1, std::memory_order_acq_rel);
              }};
  };
  begin_capture(main);
  Event fork, ja, jb;
  main.launch(node_op(64, {}));  // n0
  main.record(fork);
  a.wait(fork);
  b.wait(fork);
  a.launch(node_op(300, {nodes[0].get()}));                   // n1
  b.launch(node_op(129, {nodes[0].get()}));                   // n2
  a.launch(node_op(7, {nodes[1].get()}));                     // n3
  b.launch(node_op(1, {nodes[2].get()}));                     // n4
  main.launch(node_op(200, {nodes[0].get()}));                // n5
  a.record(ja);
  b.record(jb);
  main.wait(ja);
  main.wait(jb);
  main.launch(node_op(33, {nodes[3].get(), nodes[4].get(), nodes[5].get()}));  // n6
  GraphExec exec = end_capture(main).instantiate();
  const int replays = small_scale() ? 6 : 25;
  auto reset = [&] {
    for (auto& n : nodes) n->finished = 0;
  };
  for (int r = 0; r < replays; ++r) {
    reset();
    exec.launch(main);
    main.synchronize();
    replay++;
  }
  EXPECT_EQ(order_errors.load(), 0);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t t = 0; t < nodes[i]->runs.size(); ++t)
      ASSERT_EQ(nodes[i]->runs[t].load(), replays) << "node " << i << " tile " << t;

  reset();
  fail_tile = 60;
  exec.launch(main);
  try {
    main.synchronize();
    FAIL() << "a failing node must fail the replay's stream";
  } catch (const StreamError& e) {
    EXPECT_NE(std::string(e.what()).find("graph node 2 op 'n2'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(nodes[6]->finished.load(), 0) << "a node after the failed one ran";
  for (auto& n : nodes)
    for (auto& c : n->runs) ASSERT_LE(c.load(), replays + 1);

  fail_tile = -1;
  for (auto& n : nodes)
    for (auto& c : n->runs) c = 0;
  reset();
  exec.launch(main);
  main.synchronize();
  EXPECT_EQ(order_errors.load(), 0);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t t = 0; t < nodes[i]->runs.size(); ++t)
      ASSERT_EQ(nodes[i]->runs[t].load(), 1) << "node " << i << " tile " << t;
}

INSTANTIATE_TEST_SUITE_P(
    Workers, RuntimeTiles,
    ::testing::Values(TileConfig{"one_worker", 1, {}}, TileConfig{"two_workers", 2, {}},
                      TileConfig{"sixteen_workers", 16, {}}, TileConfig{"sixteen_workers_no_spin", 16, {}, 0},
                      TileConfig{"two_workers_shuffled", 2, {.seed = 9, .shuffle_tiles = true}},
                      TileConfig{"sixteen_workers_fuzzed", 16, {.seed = 4, .max_delay_us = 5, .shuffle_tiles = true}}),
    [](const ::testing::TestParamInfo<TileConfig>& p) { return std::string(p.param.name); });

// ---- a worker leaves a long op between two tiles -------------------------------------------------------

// One worker runs a long low-priority op; the host enqueues an op on a higher-priority stream once a few of
// its tiles ran: the worker takes it at the next tile boundary, not after the long op.
TEST(RuntimeTilesPreempt, HigherPriorityOpRunsBetweenTilesOfALongOp) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream low = dev->create_stream(kPriorityDefault, "low");
  Stream high = dev->create_stream(kPriorityHigh, "high");
  constexpr int kTiles = 2000;
  std::atomic<int> low_done{0};
  std::atomic<int> seen{-1};
  low.launch({.name = "long", .num_tiles = kTiles, .tile = [&](int) {
                std::this_thread::sleep_for(std::chrono::microseconds(20));
                low_done++;
              }});
  while (low_done.load() < 5) std::this_thread::yield();
  high.launch({.name = "urgent", .num_tiles = 1, .tile = [&](int) { seen = low_done.load(); }});
  dev->synchronize();
  ASSERT_GE(seen.load(), 5);
  EXPECT_LT(seen.load(), kTiles) << "the high-priority op waited for the whole low-priority op";
}

// One worker runs a long op while another stream's op is in its poll phase: the poll is made between tiles
// (every poll interval), so the op that waits for it runs long before the long op ends.
TEST(RuntimeTilesPreempt, DuePollRunsBetweenTilesOfALongOp) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream comm = dev->create_stream(kPriorityHigh, "comm");
  Stream compute = dev->create_stream(kPriorityDefault, "compute");
  constexpr int kTiles = 2000;
  std::atomic<int> long_done{0};
  std::atomic<int> seen{-1};
  comm.launch({.name = "transfer", .num_tiles = 0, .poll = [&] { return long_done.load() >= 5; }});
  comm.launch({.name = "consume", .num_tiles = 1, .tile = [&](int) { seen = long_done.load(); }});
  compute.launch({.name = "long", .num_tiles = kTiles, .tile = [&](int) {
                    std::this_thread::sleep_for(std::chrono::microseconds(20));
                    long_done++;
                  }});
  dev->synchronize();
  ASSERT_GE(seen.load(), 5);
  EXPECT_LT(seen.load(), kTiles) << "the poll waited for the whole long op";
}

// A worker that spins while another runs tiles still polls: a poll falls due with time, not with a
// scheduling change, and only a change ends the spin past spin_us, so that spin is off while an op polls.
// One worker runs a tile that lasts until the polled op's successor ran (or 10 s); the other must poll the
// op (done at its third poll) and run the successor meanwhile. The spin's bound is raised past the 10 s, so
// a worker that kept spinning beside the running one would poll no more until that tile ended.
TEST(RuntimeTilesPreempt, AWorkerSpinningBesideARunningOnePolls) {
  if (allowed_cpus().size() < 2) GTEST_SKIP() << "needs a core per worker";
  auto dev = make_cpu_device({.num_workers = 2, .spin_while_running_us = 60'000'000});
  Stream comm = dev->create_stream(kPriorityHigh, "comm");
  Stream compute = dev->create_stream(kPriorityDefault, "compute");
  std::atomic<bool> started{false}, consumed{false}, long_running{true};
  compute.launch({.name = "long", .num_tiles = 1, .tile = [&](int) {
                    started = true;
                    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                    while (!consumed.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
                    long_running = false;
                  }});
  while (!started.load()) std::this_thread::yield();
  int polls = 0;  // poll() never runs concurrently with itself
  comm.launch({.name = "transfer", .num_tiles = 0, .poll = [&] { return ++polls == 3; }});
  bool during = false;
  comm.launch({.name = "consume", .num_tiles = 1, .tile = [&](int) {
                 during = long_running.load();
                 consumed = true;
               }});
  dev->synchronize();
  EXPECT_EQ(polls, 3);
  EXPECT_TRUE(during) << "the polled op completed only after the long tile ended";
}

// Tracing under the claiming scheduler: one record per tile that ran, the failing one included (claim order
// with one worker), none for the tiles skipped after it.
TEST(RuntimeTilesTrace, TileRecordsAreTheTilesThatRan) {
  auto dev = make_cpu_device({.num_workers = 1, .fuzz = {.seed = 3, .shuffle_tiles = true}});
  Stream s = dev->default_stream();
  dev->set_tracing(true);
  s.launch({.name = "ok", .num_tiles = 100, .tile = [](int) {}});
  s.synchronize();
  std::atomic<int> ran{0};
  s.launch({.name = "bad", .num_tiles = 100, .tile = [&](int) {
              if (ran++ == 10) throw std::runtime_error("eleventh tile failed");
            }});
  EXPECT_THROW(s.synchronize(), StreamError);
  Trace t = dev->take_trace();
  ASSERT_EQ(t.ops.size(), 2u);
  const OpRecord& ok = t.ops[0];
  ASSERT_EQ(ok.tiles.size(), 100u);
  std::vector<int> seen;
  for (const TileRecord& r : ok.tiles) {
    seen.push_back(r.tile);
    EXPECT_EQ(r.worker, 0);
    EXPECT_LE(ok.start_ns, r.start_ns);
    EXPECT_LE(r.start_ns, r.end_ns);
    EXPECT_LE(r.end_ns, ok.end_ns);
  }
  std::vector<int> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(seen, sorted);  // the shuffled hand-out order
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_EQ(t.ops[1].tiles.size(), 11u);  // the ten that ran before the failing one, and that one
}

// An idle worker spins, instead of sleeping, while another runs tiles (when each has a core): the end of
// that work is what readies its next op, and waking a sleeper then would cost the finishing worker a system
// call. Two workers both awake (a two-tile op whose tiles wait for each other), then one runs a 50 ms tile,
// 1000 times spin_us: the other must not be asleep at any time between its start and the next op's (the cap
// is raised so that a slow machine cannot reach it). Without spinning it sleeps at once, which the trace
// shows (so the check can fail).
TEST(RuntimeTilesTrace, AnIdleWorkerStaysAwakeWhileAnotherRunsTiles) {
  if (allowed_cpus().size() < 2) GTEST_SKIP() << "needs a core per worker";
  for (const int spin_us : {50, 0}) {
    auto dev = make_cpu_device(
        {.num_workers = 2, .spin_us = spin_us, .spin_while_running_us = spin_us > 0 ? 60'000'000 : 0});
    Stream s = dev->default_stream();
    dev->set_tracing(true);
    std::atomic<int> arrived{0};
    s.launch({.name = "both", .num_tiles = 2, .tile = [&](int) {
                arrived++;
                const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
                while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
              }});
    s.launch({.name = "long", .num_tiles = 1,
              .tile = [](int) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }});
    s.launch({.name = "next", .num_tiles = 2, .tile = [](int) {}});
    s.synchronize();
    Trace t = dev->take_trace();
    ASSERT_EQ(t.ops.size(), 3u);
    ASSERT_EQ(t.ops[0].tiles.size(), 2u);
    ASSERT_NE(t.ops[0].tiles[0].worker, t.ops[0].tiles[1].worker) << "the first op's tiles wait for each other";
    int slept = 0;
    for (const SleepRecord& z : t.sleeps) {
      EXPECT_LE(z.start_ns, z.end_ns);
      if (z.end_ns > t.ops[1].start_ns && z.start_ns < t.ops[2].start_ns) ++slept;  // asleep during "long"
    }
    if (spin_us > 0) {
      EXPECT_EQ(slept, 0) << "a worker fell asleep while the other ran a tile";
    } else {
      EXPECT_GE(slept, 1) << "without spinning the idle worker sleeps, and the trace records it";
    }
  }
}

}  // namespace
}  // namespace moe::rt
