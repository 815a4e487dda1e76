// Randomized stress of the CPU device: several streams, thousands of ops with random cross-stream waits,
// under every scheduler setting (worker counts, schedule fuzzing). A checker verifies from the trace that
// every happens-before edge (stream order and event edges) held, and every op checks in its tile that its
// direct predecessors' writes are visible (plain, non-atomic memory: ThreadSanitizer sees any missing
// synchronisation). Also: the overlap test (from the trace, a many-tile op used the free worker while a
// one-tile op ran on the other stream) and the fuzzing options' own guarantees.
//
// Size: MOE_STRESS_OPS (default 3000; 400 when MOE_TEST_SCALE=small, as in the sanitizer CI runs).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime.h"

namespace moe::rt {
namespace {

int stress_ops() {
  if (const char* v = std::getenv("MOE_STRESS_OPS")) return std::max(1, std::atoi(v));
  if (const char* s = std::getenv("MOE_TEST_SCALE"); s && std::string(s) == "small") return 400;
  return 3000;
}

// The program the stress test enqueues, and the predecessors each op must see.
struct StressProgram {
  struct OpInfo {
    int stream = 0;
    uint64_t seq = 0;
    std::vector<int> preds;  // op ids that must have completed before this op starts
  };
  std::vector<OpInfo> ops;
  std::vector<char> done;  // written by each op's tile 0, read by its successors (plain memory on purpose)
};

struct StressConfig {
  const char* name;
  CpuDeviceOptions options;
};

void PrintTo(const StressConfig& c, std::ostream* os) { *os << c.name; }

class RuntimeStress : public ::testing::TestWithParam<StressConfig> {};

// Enqueues the random program. Host-side bookkeeping mirrors the runtime's rules: a record captures the
// last op enqueued on its stream so far; a wait adds the captured op as a predecessor of the waiting stream's
// next op.
StressProgram run_program(Device& dev, std::vector<Stream>& streams, int num_ops, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int num_streams = static_cast<int>(streams.size());
  StressProgram prog;
  prog.ops.reserve(num_ops);
  prog.done.assign(num_ops, 0);
  std::vector<int> last_op(num_streams, -1);
  std::vector<std::vector<int>> pending_preds(num_streams);
  struct EventState {
    Event event;
    int captured_op = -1;  // last op of the recording stream at record time
    bool recorded = false;
  };
  std::vector<EventState> events(6);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  for (int i = 0; i < num_ops;) {
    int s = pick(num_streams);
    int action = pick(10);
    if (action < 2) {  // record (re-record overwrites)
      EventState& ev = events[pick(static_cast<int>(events.size()))];
      streams[s].record(ev.event);
      ev.captured_op = last_op[s];
      ev.recorded = true;
    } else if (action < 4) {  // wait on an event as bound now (maybe never recorded: a no-op)
      EventState& ev = events[pick(static_cast<int>(events.size()))];
      streams[s].wait(ev.event);
      if (ev.recorded && ev.captured_op >= 0) pending_preds[s].push_back(ev.captured_op);
    } else if (action < 5) {  // wait_stream
      int t = pick(num_streams);
      streams[s].wait_stream(streams[t]);
      if (last_op[t] >= 0) pending_preds[s].push_back(last_op[t]);
    } else {  // an op of 1..4 tiles that checks its predecessors' writes
      StressProgram::OpInfo info;
      info.stream = s;
      info.preds = std::move(pending_preds[s]);
      pending_preds[s].clear();
      if (last_op[s] >= 0) info.preds.push_back(last_op[s]);
      int id = i++;
      int num_tiles = 1 + pick(4);
      std::vector<int> preds = info.preds;
      prog.ops.push_back(std::move(info));
      char* done = prog.done.data();
      streams[s].launch({.name = "op" + std::to_string(id), .num_tiles = num_tiles, .tile = [done, id, preds](int t) {
                           for (int p : preds) {
                             if (done[p] != 1) throw std::runtime_error("predecessor op" + std::to_string(p) + " not visible");
                           }
                           if (t == 0) done[id] = 1;
                         }});
      last_op[s] = id;
    }
  }
  dev.synchronize();
  return prog;
}

TEST_P(RuntimeStress, EveryHappensBeforeEdgeHolds) {
  const StressConfig& cfg = GetParam();
  auto dev = make_cpu_device(cfg.options);
  std::vector<Stream> streams{dev->default_stream(), dev->create_stream(kPriorityHigh, "hi"),
                              dev->create_stream(kPriorityDefault, "s2"), dev->stream_for("11"),
                              dev->create_stream(1, "low")};
  dev->set_tracing(true);
  const int num_ops = stress_ops();
  StressProgram prog = run_program(*dev, streams, num_ops, 12345);  // synchronize() rethrows any tile error
  Trace trace = dev->take_trace();

  // Map trace records back to op ids by name.
  std::vector<const OpRecord*> rec(num_ops, nullptr);
  for (const auto& r : trace.ops) rec[std::stoi(r.name.substr(2))] = &r;
  int64_t num_edges = 0;
  for (int id = 0; id < num_ops; ++id) {
    ASSERT_NE(rec[id], nullptr) << "op" << id << " missing from the trace";
    EXPECT_EQ(prog.done[id], 1);
    for (int p : prog.ops[id].preds) {
      ++num_edges;
      ASSERT_LE(rec[p]->end_ns, rec[id]->start_ns) << "op" << p << " must finish before op" << id << " starts";
      for (const auto& t : rec[id]->tiles) ASSERT_LE(rec[p]->end_ns, t.start_ns);
    }
  }
  EXPECT_GT(num_edges, num_ops);  // the program really has cross-stream edges
}

CpuDeviceOptions fuzzed(FuzzOptions f, int workers = 2) {
  CpuDeviceOptions o;
  o.num_workers = workers;
  o.fuzz = f;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Schedulers, RuntimeStress,
    ::testing::Values(StressConfig{"two_workers", fuzzed({}, 2)}, StressConfig{"one_worker", fuzzed({}, 1)},
                      StressConfig{"four_workers_no_spin", [] {
                                     auto o = fuzzed({}, 4);
                                     o.spin_us = 0;
                                     return o;
                                   }()},
                      // More workers than cores: workers are preempted between claiming and counting tiles.
                      StressConfig{"sixteen_workers", fuzzed({}, 16)},
                      StressConfig{"sixteen_workers_shuffled", fuzzed({.seed = 13, .shuffle_tiles = true}, 16)},
                      StressConfig{"shuffle_delay", fuzzed({.seed = 7, .max_delay_us = 20, .shuffle_tiles = true})},
                      StressConfig{"serialized", fuzzed({.seed = 3, .serialize_streams = true})},
                      StressConfig{"serialized_reverse",
                                   fuzzed({.seed = 3, .serialize_streams = true, .serialize_reverse = true})}),
    [](const ::testing::TestParamInfo<StressConfig>& p) { return std::string(p.param.name); });

// ---- overlap -------------------------------------------------------------------------------------------

// Stream A runs one long single-tile op; stream B a 16-tile op. With 2 workers, B's tiles must run on the
// other worker while A's op runs. A's tile stays in flight until every B tile has run its body (bounded by a
// generous timeout that only a scheduler bug reaches), then the trace shows where and when B's tiles ran:
// each started after A's tile started and before it ended. (A tile's end stamp is taken after its body
// returns, so "B's tiles ended before A's" would race with A seeing the last increment.)
TEST(RuntimeOverlap, ManyTileOpUsesTheFreeWorker) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream(kPriorityDefault, "a");
  Stream b = dev->create_stream(kPriorityDefault, "b");
  constexpr int kTiles = 16;
  std::atomic<bool> a_started{false};
  std::atomic<int> b_done{0};
  dev->set_tracing(true);
  a.launch({.name = "long", .num_tiles = 1, .tile = [&](int) {
              a_started = true;
              std::this_thread::sleep_for(std::chrono::milliseconds(3));
              auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
              while (b_done.load() < kTiles && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
            }});
  while (!a_started.load()) std::this_thread::yield();
  b.launch({.name = "wide", .num_tiles = kTiles, .tile = [&](int) { b_done++; }});
  dev->synchronize();
  Trace t = dev->take_trace();
  ASSERT_EQ(t.ops.size(), 2u);
  const OpRecord& ra = t.ops[0].name == "long" ? t.ops[0] : t.ops[1];
  const OpRecord& rb = t.ops[0].name == "long" ? t.ops[1] : t.ops[0];
  ASSERT_EQ(ra.tiles.size(), 1u);
  ASSERT_EQ(rb.tiles.size(), static_cast<size_t>(kTiles));
  for (const auto& tile : rb.tiles) {
    EXPECT_NE(tile.worker, ra.tiles[0].worker);
    EXPECT_GE(tile.start_ns, ra.tiles[0].start_ns);
    EXPECT_LT(tile.start_ns, ra.tiles[0].end_ns);
  }
  EXPECT_LT(rb.start_ns, ra.end_ns);
}

// ---- fuzzing options -----------------------------------------------------------------------------------

TEST(RuntimeFuzz, ShuffleHandsOutTilesInAnotherOrder) {
  auto dev = make_cpu_device(fuzzed({.seed = 11, .shuffle_tiles = true}, 1));
  Stream s = dev->default_stream();
  dev->set_tracing(true);
  std::vector<int> hits(64, 0);
  s.launch({.name = "wide", .num_tiles = 64, .tile = [&](int t) { hits[t]++; }});
  s.synchronize();
  Trace t = dev->take_trace();
  ASSERT_EQ(t.ops.size(), 1u);
  std::vector<int> order;
  for (const auto& tr : t.ops[0].tiles) order.push_back(tr.tile);
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(order, sorted);  // one worker: trace order is hand-out order
  for (int h : hits) EXPECT_EQ(h, 1);
}

// Under serialize_streams no two streams' ops ever overlap in time, and the preferred order shows when
// both streams are ready at once.
void check_serialized(bool reverse) {
  auto dev = make_cpu_device(fuzzed({.seed = 5, .serialize_streams = true, .serialize_reverse = reverse}, 2));
  Stream first = dev->create_stream(kPriorityDefault, "first");
  Stream second = dev->create_stream(kPriorityDefault, "second");
  Stream gate_stream = dev->create_stream(kPriorityDefault, "gate");
  std::atomic<bool> open{false};
  gate_stream.launch({.name = "gate", .num_tiles = 1, .tile = [&](int) {
                        while (!open.load()) std::this_thread::yield();
                      }});
  Event gate;
  gate_stream.record(gate);
  first.wait(gate);
  second.wait(gate);
  dev->set_tracing(true);
  for (int i = 0; i < 5; ++i) {
    first.launch({.name = "f", .num_tiles = 4, .tile = [](int) {}});
    second.launch({.name = "s", .num_tiles = 4, .tile = [](int) {}});
  }
  open = true;
  dev->synchronize();
  Trace t = dev->take_trace();
  ASSERT_EQ(t.ops.size(), 10u);
  std::vector<OpRecord> ops = t.ops;
  std::sort(ops.begin(), ops.end(), [](const OpRecord& x, const OpRecord& y) { return x.start_ns < y.start_ns; });
  for (size_t i = 1; i < ops.size(); ++i) EXPECT_LE(ops[i - 1].end_ns, ops[i].start_ns);
  EXPECT_EQ(ops[0].stream_name, reverse ? "second" : "first");
}

TEST(RuntimeFuzz, SerializeStreamsRunsOneStreamAtATime) { check_serialized(false); }
TEST(RuntimeFuzz, SerializeReversePrefersLaterStreams) { check_serialized(true); }

// hold_until_host_waits: nothing issued runs until the host waits, so a serialized run's order is the
// preferred stream's whole queue first, however the host interleaved its launches.
TEST(RuntimeFuzz, HoldUntilHostWaitsQueuesEverythingFirst) {
  for (bool reverse : {false, true}) {
    auto dev = make_cpu_device(
        fuzzed({.seed = 7, .serialize_streams = true, .serialize_reverse = reverse, .hold_until_host_waits = true}, 2));
    Stream first = dev->create_stream(kPriorityDefault, "first");
    Stream second = dev->create_stream(kPriorityDefault, "second");
    std::atomic<int> ran{0};
    std::vector<std::string> order;  // one stream at a time: the tiles never run concurrently
    for (int i = 0; i < 3; ++i)
      for (Stream* s : {&second, &first})  // the less preferred stream issues first
        s->launch({.name = s->name(), .num_tiles = 1, .tile = [&, s](int) {
                     order.push_back(s->name());
                     ++ran;
                   }});
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(ran.load(), 0) << "work ran before the host waited";
    EXPECT_FALSE(first.query());
    dev->synchronize();
    const std::string a = reverse ? "second" : "first", b = reverse ? "first" : "second";
    EXPECT_EQ(order, (std::vector<std::string>{a, a, a, b, b, b})) << "reverse " << reverse;
    // Held again after the wait; an event's wait releases it too.
    first.launch({.name = "late", .num_tiles = 1, .tile = [&](int) { ++ran; }});
    Event e;
    first.record(e);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(ran.load(), 6);
    e.synchronize();
    EXPECT_EQ(ran.load(), 7);
  }
}

}  // namespace
}  // namespace moe::rt
