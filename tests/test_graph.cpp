// Graph mode on the CPU device: the same multi-stream test body run eagerly and under capture + replay gives
// bitwise identical results (both replay modes), replays with new data in the same buffers, ordering of a
// replay against the launching stream, the trace of a replay, and every capture error.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/graph.h"
#include "runtime/runtime.h"

namespace moe::rt {
namespace {

constexpr int kN = 1024;
constexpr int kChunk = 64;
constexpr int kTiles = kN / kChunk;

// A small fork/join pipeline in the shape of the MoE layer: main computes a "routed" value in two steps,
// side a "shared" value, main combines them. Results depend on every step, and on the order within
// each stream (the second main step reads the first's output).
struct Buffers {
  std::vector<float> x = std::vector<float>(kN), routed = std::vector<float>(kN), routed2 = std::vector<float>(kN),
                     shared = std::vector<float>(kN), out = std::vector<float>(kN);
};

Op chunked(const std::string& name, std::function<void(int)> body) {
  return Op{.name = name, .num_tiles = kTiles, .tile = [body = std::move(body)](int t) {
              for (int i = t * kChunk; i < (t + 1) * kChunk; ++i) body(i);
            }};
}

void pipeline_body(Stream& main, Stream& side, Buffers& buffers) {
  Buffers* bp = &buffers;
  Event fork, join;
  main.record(fork);
  side.wait(fork);
  side.launch(chunked("shared_expert", [bp](int i) { bp->shared[i] = bp->x[i] * bp->x[i] * 0.5f + 1.0f; }));
  main.launch(chunked("routed", [bp](int i) { bp->routed[i] = bp->x[i] * 3.0f - 2.0f; }));
  main.launch({.name = "empty_expert", .num_tiles = 0});
  main.launch(chunked("routed2", [bp](int i) { bp->routed2[i] = bp->routed[i] * bp->routed[i] + bp->x[i]; }));
  side.record(join);
  main.wait(join);
  main.launch(chunked("combine", [bp](int i) { bp->out[i] = bp->routed2[i] + bp->shared[i]; }));
}

void fill_input(Buffers& b, int round) {
  for (int i = 0; i < kN; ++i) b.x[i] = static_cast<float>((i * 7 + round * 13) % 101) * 0.03125f - 1.5f;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class GraphModes : public ::testing::TestWithParam<bool> {};

TEST_P(GraphModes, ReplayMatchesEagerBitwiseWithNewInputsEveryRound) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream main = dev->default_stream();
  Stream side = dev->stream_for("11");
  Buffers eager, graph;

  begin_capture(main);
  pipeline_body(main, side, graph);
  Graph g = end_capture(main);
  EXPECT_FALSE(is_capturing(main));
  EXPECT_FALSE(is_capturing(side));
  ASSERT_EQ(g.num_nodes(), 5u);
  GraphExec exec = g.instantiate({.stream_fusion = GetParam()});

  for (int round = 0; round < 30; ++round) {
    fill_input(eager, round);
    pipeline_body(main, side, eager);
    main.synchronize();
    fill_input(graph, round);  // new data, same buffers
    exec.launch(main);
    main.synchronize();
    ASSERT_TRUE(bitwise_equal(eager.out, graph.out)) << "round " << round;
    ASSERT_TRUE(bitwise_equal(eager.shared, graph.shared)) << "round " << round;
  }
}

// Polling operations (a transfer that completes elsewhere) replay like eager ones: polled after their tiles
// until done, their successors released only then, in both replay modes, again at every replay.
TEST_P(GraphModes, PollingNodesReplay) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream main = dev->default_stream();
  Stream side = dev->create_stream();
  std::atomic<int> sent{0}, received{0}, polls{0}, staged{0};
  int consumed = -1;
  begin_capture(main);
  Event fork, join;
  main.launch({.name = "produce", .num_tiles = 1, .tile = [&](int) { sent = sent + 1; }});
  main.record(fork);
  side.wait(fork);
  // Tiles first, then polls: "arrives" on the third poll of each replay.
  side.launch({.name = "transfer", .num_tiles = 2, .tile = [&](int) { staged++; }, .poll = [&] {
                 if (++polls % 3 != 0) return false;
                 received = sent.load();
                 return true;
               }});
  side.launch({.name = "ack", .num_tiles = 0, .poll = [&] { return received.load() == sent.load(); }});
  side.record(join);
  main.wait(join);
  main.launch({.name = "consume", .num_tiles = 1, .tile = [&](int) { consumed = received.load(); }});
  GraphExec exec = end_capture(main).instantiate({.stream_fusion = GetParam()});
  for (int round = 1; round <= 3; ++round) {
    exec.launch(main);
    main.synchronize();
    EXPECT_EQ(consumed, round) << "round " << round;  // consume ran after the transfer arrived
    EXPECT_EQ(polls.load(), 3 * round);
    EXPECT_EQ(staged.load(), 2 * round);
  }
}

// A pure polling op may leave num_tiles at its default: it has no tile to run, captured or not.
TEST(Graph, PollOnlyOpWithTheDefaultTileCount) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream main = dev->default_stream();
  std::atomic<int> polls{0};
  begin_capture(main);
  main.launch({.name = "link", .poll = [&] { return ++polls % 2 == 0; }});
  const GraphExec exec = end_capture(main).instantiate();
  EXPECT_EQ(exec.nodes().at(0).op.num_tiles, 0);
  exec.launch(main);
  exec.launch(main);
  main.synchronize();
  EXPECT_EQ(polls.load(), 4);
}

TEST(Graph, AThrowingPollFailsTheReplayNamingTheNode) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream main = dev->default_stream();
  std::atomic<bool> fail{true};
  int after = 0;
  begin_capture(main);
  main.launch({.name = "link", .num_tiles = 0, .poll = [&]() -> bool {
                 if (fail.load()) throw std::runtime_error("peer gone");
                 return true;
               }});
  main.launch({.name = "after", .num_tiles = 1, .tile = [&](int) { ++after; }});
  GraphExec exec = end_capture(main).instantiate();
  exec.launch(main);
  try {
    main.synchronize();
    FAIL() << "expected the poll's error";
  } catch (const StreamError& e) {
    EXPECT_NE(std::string(e.what()).find("'link'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("peer gone"), std::string::npos) << e.what();
  }
  EXPECT_EQ(after, 0);  // the failed stream skips the rest of the replay
  fail = false;
  exec.launch(main);
  main.synchronize();
  EXPECT_EQ(after, 1);
}

INSTANTIATE_TEST_SUITE_P(Fusion, GraphModes, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "fused" : "per_stream"; });

TEST(Graph, NothingRunsDuringCapture) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream main = dev->default_stream();
  std::atomic<int> runs{0};
  begin_capture(main);
  EXPECT_TRUE(is_capturing(main));
  main.launch({.name = "count", .num_tiles = 4, .tile = [&](int) { runs++; }});
  Graph g = end_capture(main);
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(runs.load(), 0);
  EXPECT_TRUE(main.query());
  GraphExec exec = g.instantiate();
  for (int i = 0; i < 100; ++i) exec.launch(main);
  main.synchronize();
  EXPECT_EQ(runs.load(), 400);
}

// A replay starts after prior work on the launching stream, and later work on it waits for every node,
// including those captured on the side stream.
TEST(Graph, ReplayIsOrderedOnTheLaunchingStream) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream main = dev->default_stream();
  Stream side = dev->create_stream(kPriorityDefault, "side");
  std::atomic<bool> before_done{false};
  std::atomic<bool> saw_before{false};
  std::atomic<bool> side_done{false};
  begin_capture(main);
  Event fork, join;
  main.record(fork);
  side.wait(fork);
  side.launch({.name = "side_node", .num_tiles = 1, .tile = [&](int) {
                 std::this_thread::sleep_for(std::chrono::milliseconds(2));
                 side_done = true;
               }});
  main.launch({.name = "main_node", .num_tiles = 1, .tile = [&](int) { saw_before = before_done.load(); }});
  side.record(join);
  main.wait(join);
  GraphExec exec = end_capture(main).instantiate();

  main.launch({.name = "before", .num_tiles = 1, .tile = [&](int) {
                 std::this_thread::sleep_for(std::chrono::milliseconds(2));
                 before_done = true;
               }});
  exec.launch(main);
  std::atomic<bool> after_saw_side{false};
  main.launch({.name = "after", .num_tiles = 1, .tile = [&](int) { after_saw_side = side_done.load(); }});
  main.synchronize();
  EXPECT_TRUE(saw_before.load());
  EXPECT_TRUE(after_saw_side.load());
}

// The trace of a replay shows the nodes under their original streams, and (stream fusion) the side node runs
// on the other worker while the main node is in flight: each node waits until the other has started (a
// rendezvous only concurrent execution passes; the timeout is reached only by a scheduling bug), so their
// tile intervals must overlap.
TEST(Graph, ReplayTraceShowsBothStreamsInterleaved) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream main = dev->default_stream();
  Stream side = dev->stream_for("11");
  std::atomic<bool> routed_started{false}, shared_started{false}, timed_out{false};
  auto rendezvous = [&](std::atomic<bool>& mine, std::atomic<bool>& other) {
    mine = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!other.load()) {
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out = true;
        return;
      }
      std::this_thread::yield();
    }
  };
  begin_capture(main);
  Event fork, join;
  main.record(fork);
  side.wait(fork);
  main.launch({.name = "routed", .num_tiles = 1, .tile = [&](int) { rendezvous(routed_started, shared_started); }});
  side.launch({.name = "shared", .num_tiles = 1, .tile = [&](int) { rendezvous(shared_started, routed_started); }});
  side.record(join);
  main.wait(join);
  GraphExec exec = end_capture(main).instantiate();
  dev->set_tracing(true);
  exec.launch(main);
  main.synchronize();
  EXPECT_FALSE(timed_out.load()) << "the two nodes never ran at the same time";
  Trace t = dev->take_trace();
  ASSERT_EQ(t.ops.size(), 2u);
  const OpRecord& routed = t.ops[0].name == "routed" ? t.ops[0] : t.ops[1];
  const OpRecord& shared = t.ops[0].name == "routed" ? t.ops[1] : t.ops[0];
  EXPECT_EQ(routed.stream_id, main.id());
  EXPECT_EQ(shared.stream_id, side.id());
  EXPECT_EQ(shared.stream_name, "11");
  EXPECT_GE(routed.graph_node, 0);
  EXPECT_GE(shared.graph_node, 0);
  ASSERT_EQ(shared.tiles.size(), 1u);
  ASSERT_EQ(routed.tiles.size(), 1u);
  EXPECT_NE(shared.tiles[0].worker, routed.tiles[0].worker);
  EXPECT_LT(shared.tiles[0].start_ns, routed.tiles[0].end_ns);
  EXPECT_LT(routed.tiles[0].start_ns, shared.tiles[0].end_ns);
}

TEST(Graph, SameExecLaunchedOnTwoStreamsRunsOneReplayAtATime) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream a = dev->create_stream();
  Stream b = dev->create_stream();
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::atomic<int> runs{0};
  begin_capture(a);
  a.launch({.name = "node", .num_tiles = 1, .tile = [&](int) {
              if (inside.fetch_add(1) != 0) overlapped = true;
              std::this_thread::sleep_for(std::chrono::microseconds(200));
              runs++;
              inside.fetch_sub(1);
            }});
  GraphExec exec = end_capture(a).instantiate();
  for (int i = 0; i < 10; ++i) {
    exec.launch(a);
    exec.launch(b);
  }
  dev->synchronize();
  EXPECT_EQ(runs.load(), 20);
  EXPECT_FALSE(overlapped.load());
}

TEST(Graph, NodeErrorIsAStreamErrorAndTheGraphRunsAgain) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream main = dev->default_stream();
  std::atomic<bool> fail{true};
  std::atomic<int> later{0};
  begin_capture(main);
  main.launch({.name = "may_fail", .num_tiles = 2, .tile = [&](int) {
                 if (fail.load()) throw std::runtime_error("bad input");
               }});
  main.launch({.name = "later", .num_tiles = 1, .tile = [&](int) { later++; }});
  GraphExec exec = end_capture(main).instantiate();
  exec.launch(main);
  try {
    main.synchronize();
    FAIL();
  } catch (const StreamError& e) {
    EXPECT_NE(std::string(e.what()).find("may_fail"), std::string::npos) << e.what();
  }
  EXPECT_EQ(later.load(), 0);
  fail = false;
  exec.launch(main);
  main.synchronize();
  EXPECT_EQ(later.load(), 1);
}

TEST(Graph, WaitStreamAndEmptyGraphs) {
  auto dev = make_cpu_device({.num_workers = 2});
  Stream main = dev->default_stream();
  Stream side = dev->create_stream();
  std::vector<int> v(4, 0);
  begin_capture(main);
  main.launch({.name = "a", .num_tiles = 1, .tile = [&](int) { v[0] = 1; }});
  side.wait_stream(main);
  side.launch({.name = "b", .num_tiles = 1, .tile = [&](int) { v[1] = v[0] + 1; }});
  main.wait_stream(side);
  main.launch({.name = "c", .num_tiles = 1, .tile = [&](int) { v[2] = v[1] + 1; }});
  GraphExec exec = end_capture(main).instantiate();
  exec.launch(main);
  main.synchronize();
  EXPECT_EQ(v, (std::vector<int>{1, 2, 3, 0}));

  begin_capture(main);
  main.launch({.name = "nothing", .num_tiles = 0});
  GraphExec empty = end_capture(main).instantiate();
  begin_capture(main);
  GraphExec none = end_capture(main).instantiate();
  EXPECT_EQ(none.num_nodes(), 0u);
  empty.launch(main);
  none.launch(main);
  main.synchronize();
}

// ---- capture errors ------------------------------------------------------------------------------------

// Runs `f`, expects a std::logic_error whose message contains `needle`.
template <class F>
void expect_logic_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected std::logic_error containing '" << needle << "'";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(GraphErrors, UnjoinedForkAtEndCapture) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream main = dev->default_stream();
  Stream side = dev->create_stream(kPriorityDefault, "side");
  begin_capture(main);
  Event fork;
  main.record(fork);
  side.wait(fork);
  side.launch({.name = "forgotten", .num_tiles = 1, .tile = [](int) {}});
  main.launch({.name = "m", .num_tiles = 1, .tile = [](int) {}});
  expect_logic_error([&] { end_capture(main); }, "unjoined fork: operation 'forgotten' captured on stream 'side'");
  // The capture is discarded: both streams run eagerly again.
  EXPECT_FALSE(is_capturing(main));
  EXPECT_FALSE(is_capturing(side));
  std::atomic<bool> ran{false};
  side.launch({.name = "eager", .num_tiles = 1, .tile = [&](int) { ran = true; }});
  side.synchronize();
  EXPECT_TRUE(ran.load());
}

TEST(GraphErrors, WaitOnAnEventRecordedOutsideTheCapture) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream main = dev->default_stream();
  Stream other = dev->create_stream(kPriorityDefault, "other");
  Event outside;
  other.record(outside);
  begin_capture(main);
  expect_logic_error([&] { main.wait(outside); }, "recorded outside the capture");
  Event never;
  main.wait(never);  // a never-recorded event stays a no-op
  Graph g = end_capture(main);  // the failed call had no effect
  EXPECT_EQ(g.num_nodes(), 0u);
}

TEST(GraphErrors, SynchronizeWhileCapturing) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream main = dev->default_stream();
  Stream side = dev->create_stream(kPriorityDefault, "side");
  begin_capture(main);
  Event fork, join;
  main.record(fork);
  side.wait(fork);
  expect_logic_error([&] { main.synchronize(); }, "being captured");
  expect_logic_error([&] { side.synchronize(); }, "being captured");
  expect_logic_error([&] { dev->synchronize(); }, "during graph capture");
  expect_logic_error([&] { fork.synchronize(); }, "inside a graph capture");
  side.record(join);
  main.wait(join);
  end_capture(main);
  main.synchronize();
  // An event recorded in an ended capture cannot be waited on eagerly.
  expect_logic_error([&] { side.wait(fork); }, "capture that has ended");
}

TEST(GraphErrors, AllocationInsideCapture) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream main = dev->default_stream();
  float buf[8];
  dev->notify_alloc(buf, sizeof(buf));
  begin_capture(main);
  expect_logic_error([&] { dev->notify_alloc(buf, sizeof(buf)); }, "during graph capture");
  end_capture(main);
  dev->notify_alloc(buf, sizeof(buf));
}

TEST(GraphErrors, TwoCapturesAtOnce) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream a = dev->create_stream(kPriorityDefault, "a");
  Stream b = dev->create_stream(kPriorityDefault, "b");
  begin_capture(a);
  expect_logic_error([&] { begin_capture(b); }, "a capture started on stream 'a'");
  expect_logic_error([&] { begin_capture(a); }, "still running");
  expect_logic_error([&] { end_capture(b); }, "not capturing");
  end_capture(a);
  begin_capture(b);  // fine once the first one ended
  end_capture(b);
}

TEST(GraphErrors, EndCaptureOnAJoinedStreamAndLaunchIntoCapture) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream main = dev->default_stream();
  Stream side = dev->create_stream(kPriorityDefault, "side");
  begin_capture(main);
  Event fork, join;
  main.record(fork);
  side.wait(fork);
  expect_logic_error([&] { end_capture(side); }, "end the capture on its origin");
  GraphExec nothing;
  expect_logic_error([&] { nothing.launch(main); }, "empty GraphExec");
  side.record(join);
  main.wait(join);
  GraphExec exec = end_capture(main).instantiate();
  begin_capture(main);
  expect_logic_error([&] { exec.launch(main); }, "graphs do not nest");
  end_capture(main);
}

TEST(GraphObservers, OnlyCaptureHooksDuringCaptureOneHookPerReplay) {
  struct Count : Observer {
    int launches = 0, records = 0, waits = 0, graphs = 0, captures = 0;
    size_t last_nodes = 0;
    void on_launch(const Stream&, uint64_t, const Op&) override { launches++; }
    void on_capture(const Stream&, const Op&) override { captures++; }
    void on_record(const Stream&, uint64_t, const Event&) override { records++; }
    void on_wait(const Stream&, uint64_t, const Event&) override { waits++; }
    void on_graph_launch(const Stream&, uint64_t, const GraphExec& e) override {
      graphs++;
      last_nodes = e.num_nodes();
    }
  };
  auto dev = make_cpu_device({.num_workers = 2});
  auto obs = std::make_shared<Count>();
  dev->add_observer(obs);
  Stream main = dev->default_stream();
  Stream side = dev->create_stream();
  Buffers b;
  fill_input(b, 0);
  begin_capture(main);
  pipeline_body(main, side, b);
  GraphExec exec = end_capture(main).instantiate();
  EXPECT_EQ(obs->launches + obs->records + obs->waits, 0);
  EXPECT_EQ(obs->captures, 5);  // each captured operation once (on_capture), none launched
  exec.launch(main);
  exec.launch(main);
  main.synchronize();
  EXPECT_EQ(obs->graphs, 2);
  EXPECT_EQ(obs->last_nodes, 5u);
}

}  // namespace
}  // namespace moe::rt
