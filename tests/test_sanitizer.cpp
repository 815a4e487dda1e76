// The stream sanitizer: the planted bugs of the field are caught (one test each, naming both operations, both
// streams and the bytes), their correct versions pass, and the clock rules follow CUDA's event semantics.
#include "runtime/sanitizer.h"

#include <gtest/gtest.h>

#include "runtime/graph.h"

#include <string>
#include <vector>

#include "test_sanitizer_program.h"

namespace moe::rt {
namespace {

using test::MiniLayer;
using test::PlantedBugs;

constexpr size_t kBytes = MiniLayer::kBytes;

// An op with no tiles: the sanitizer sees its declared accesses, nothing runs (no real race in the test).
Op declared(const char* name, std::vector<Access> acc) { return {.name = name, .num_tiles = 0, .accesses = std::move(acc)}; }

RaceReport expect_race(const std::function<void()>& f) {
  try {
    f();
  } catch (const RaceError& e) {
    return e.report();
  }
  ADD_FAILURE() << "no RaceError";
  return {};
}

void expect_names(const RaceReport& r, const std::string& cur_op, const Stream& cur, const std::string& prev_op,
                  const Stream& prev) {
  EXPECT_EQ(r.current.op, cur_op) << r.message;
  EXPECT_EQ(r.current.stream_id, cur.id()) << r.message;
  EXPECT_EQ(r.previous.op, prev_op) << r.message;
  EXPECT_EQ(r.previous.stream_id, prev.id()) << r.message;
  for (const std::string& s : {cur_op, prev_op, cur.name(), prev.name()}) {
    EXPECT_NE(r.message.find("'" + s + "'"), std::string::npos) << "message lacks '" << s << "': " << r.message;
  }
}

struct SanitizerTest : ::testing::Test {
  std::unique_ptr<Device> dev = make_cpu_device({.num_workers = 2});
  std::shared_ptr<Sanitizer> san = enable_sanitizer(*dev);
  Stream main = dev->default_stream();
  Stream side = dev->stream_for("11");
};

TEST_F(SanitizerTest, CorrectProgramPassesAndComputes) {
  {
    MiniLayer layer(*dev);
    layer.run();
    layer.run();  // a second pass: the workspace is reused across calls
    dev->synchronize();
    for (int i = 0; i < MiniLayer::kElems; ++i) {
      float x = 0.25f * static_cast<float>(i % 13) - 1.0f;
      ASSERT_EQ(layer.out()[i], (3.0f * x - 0.5f) + (2.0f * x + 1.0f) * 0.5f) << i;
    }
  }
  EXPECT_EQ(san->num_reports(), 0u);
}

TEST_F(SanitizerTest, MissingForkWait) {
  MiniLayer layer(*dev);
  RaceReport r = expect_race([&] { layer.run({.no_fork_wait = true}); });
  EXPECT_EQ(r.kind, HazardKind::kReadAfterWrite);
  expect_names(r, "shared_up", side, "produce_x", main);
  EXPECT_EQ(r.ptr, layer.x());
  EXPECT_EQ(r.bytes, kBytes);
  EXPECT_EQ(r.buffer, layer.x());
}

TEST_F(SanitizerTest, MissingJoin) {
  MiniLayer layer(*dev);
  RaceReport r = expect_race([&] { layer.run({.no_join = true}); });
  EXPECT_EQ(r.kind, HazardKind::kReadAfterWrite);
  expect_names(r, "combine", main, "shared_down", side);
  EXPECT_EQ(r.ptr, layer.shared_out());
  EXPECT_EQ(r.bytes, kBytes);
}

TEST_F(SanitizerTest, RoutedPathWritesTheInputInPlace) {
  MiniLayer layer(*dev);
  RaceReport r = expect_race([&] { layer.run({.routed_in_place = true}); });
  EXPECT_EQ(r.kind, HazardKind::kWriteAfterRead);
  expect_names(r, "routed_up", main, "shared_up", side);
  EXPECT_EQ(r.current.mode, AccessMode::kReadWrite);
  EXPECT_EQ(r.previous.mode, AccessMode::kRead);
  EXPECT_EQ(r.ptr, layer.x());
  EXPECT_EQ(r.bytes, kBytes);
}

TEST_F(SanitizerTest, OneWorkspaceSharedByTwoStreams) {
  MiniLayer layer(*dev);
  RaceReport r = expect_race([&] { layer.run({.shared_workspace = true}); });
  EXPECT_EQ(r.kind, HazardKind::kWriteAfterWrite);
  expect_names(r, "routed_up", main, "shared_up", side);
  EXPECT_EQ(r.ptr, layer.workspace());
  EXPECT_EQ(r.bytes, kBytes);
  EXPECT_EQ(r.buffer_bytes, 2 * kBytes);  // the report names the whole workspace and the half in conflict
}

TEST_F(SanitizerTest, UninitialisedScratchRead) {
  MiniLayer layer(*dev);
  RaceReport r = expect_race([&] { layer.run({.partial_scratch = true}); });
  EXPECT_EQ(r.kind, HazardKind::kUninitializedRead);
  EXPECT_EQ(r.current.op, "shared_down");
  EXPECT_EQ(r.current.stream_id, side.id());
  // Only the rows shared_up skipped: the second half of the side's half of the workspace.
  EXPECT_EQ(r.ptr, layer.workspace() + MiniLayer::kElems + MiniLayer::kElems / 2);
  EXPECT_EQ(r.bytes, kBytes / 2);
  EXPECT_NE(r.message.find("allocation #"), std::string::npos) << r.message;
}

TEST(Sanitizer, CollectModeReportsEveryPlantedBug) {
  // One worker: the racing ops do run in collect mode, but never at the same time as each other.
  auto dev = make_cpu_device({.num_workers = 1});
  auto col = enable_sanitizer(*dev, {.throw_on_first = false});
  std::vector<std::pair<PlantedBugs, HazardKind>> cases = {
      {{.no_fork_wait = true}, HazardKind::kReadAfterWrite},   {{.no_join = true}, HazardKind::kReadAfterWrite},
      {{.routed_in_place = true}, HazardKind::kWriteAfterRead}, {{.shared_workspace = true}, HazardKind::kWriteAfterWrite},
      {{.partial_scratch = true}, HazardKind::kUninitializedRead}};
  for (const auto& [bugs, kind] : cases) {
    {
      MiniLayer layer(*dev);
      layer.run(bugs);  // collect mode lets the racing ops run; the values do not matter here
    }
    std::vector<RaceReport> reports = col->take_reports();
    ASSERT_FALSE(reports.empty());
    EXPECT_EQ(reports.front().kind, kind) << reports.front().message;
    col->reset();
  }
}

// An output released on the host while the consumer's stream may still read it.
TEST_F(SanitizerTest, OutputFreedBeforeConsumerFinished) {
  std::vector<float> h(MiniLayer::kElems);
  dev->notify_alloc(h.data(), kBytes);
  main.launch(declared("router", {writes(h.data(), kBytes)}));
  Event fork, join;
  main.record(fork);
  side.wait(fork);
  side.launch(declared("shared_expert", {reads(h.data(), kBytes)}));
  side.record(join);
  main.synchronize();  // the producer's stream is done, but the consumer is on the side stream
  RaceReport r = expect_race([&] { dev->notify_free(h.data(), kBytes); });
  EXPECT_EQ(r.kind, HazardKind::kFreeWhileInUse);
  EXPECT_EQ(r.previous.op, "shared_expert");
  EXPECT_EQ(r.previous.stream_id, side.id());
  EXPECT_EQ(r.ptr, h.data());
  EXPECT_NE(r.message.find("synchronize stream '" + side.name() + "'"), std::string::npos) << r.message;
  // Correct: wait for the consumer's event, then free and reuse.
  join.synchronize();
  dev->notify_free(h.data(), kBytes);
  dev->notify_alloc(h.data(), kBytes);
  main.launch(declared("next_router", {writes(h.data(), kBytes)}));
  EXPECT_EQ(san->num_reports(), 1u);
}

// The same with a caching allocator's stream-ordered frees: the reuse by another stream is the bug.
TEST(Sanitizer, OutputReallocatedBeforeConsumerFinished) {
  for (bool correct : {false, true}) {
    auto dev = make_cpu_device({.num_workers = 1});
    auto san = enable_sanitizer(*dev, {.host_ordered_free = false});
    Stream main = dev->default_stream(), side = dev->stream_for("11");
    std::vector<float> h(MiniLayer::kElems);
    dev->notify_alloc(h.data(), kBytes);
    main.launch(declared("router", {writes(h.data(), kBytes)}));
    Event fork, join;
    main.record(fork);
    side.wait(fork);
    side.launch(declared("shared_expert", {reads(h.data() + 8, 16)}));
    side.record(join);
    dev->notify_free(h.data(), kBytes);  // stream-ordered: fine so far
    dev->notify_alloc(h.data(), kBytes);
    if (correct) main.wait(join);
    if (correct) {
      main.launch(declared("next_router", {writes(h.data(), kBytes)}));
      EXPECT_EQ(san->num_reports(), 0u);
    } else {
      RaceReport r = expect_race([&] { main.launch(declared("next_router", {writes(h.data(), kBytes)})); });
      EXPECT_EQ(r.kind, HazardKind::kReuseBeforeOrdered);
      expect_names(r, "next_router", main, "shared_expert", side);
      EXPECT_EQ(r.ptr, h.data() + 8);  // exactly the bytes the consumer still reads
      EXPECT_EQ(r.bytes, 16u);
    }
    dev->synchronize();
  }
}

TEST_F(SanitizerTest, ByteRangesNotBasePointers) {
  std::vector<unsigned char> buf(256);
  side.launch(declared("write_view", {writes(buf.data() + 64, 64)}));
  main.launch(declared("read_other_view", {reads(buf.data(), 64)}));  // disjoint: fine
  main.launch(declared("write_other_view", {writes(buf.data() + 128, 128)}));
  EXPECT_EQ(san->num_reports(), 0u);
  RaceReport r = expect_race([&] { main.launch(declared("read_overlap", {reads(buf.data() + 100, 100)})); });
  EXPECT_EQ(r.kind, HazardKind::kReadAfterWrite);
  EXPECT_EQ(r.previous.op, "write_view");
  EXPECT_EQ(r.ptr, buf.data() + 100);
  EXPECT_EQ(r.bytes, 28u);  // [100, 128): the overlap with side's write only
}

TEST_F(SanitizerTest, WaitBindsToTheRecordAtWaitTime) {
  std::vector<float> a(16), b(16);
  Event e;
  main.launch(declared("write_a", {writes(a.data(), 64)}));
  main.record(e);
  side.wait(e);
  main.launch(declared("write_b", {writes(b.data(), 64)}));
  main.record(e);  // re-record: side's wait stays bound to the first record
  side.launch(declared("read_a", {reads(a.data(), 64)}));
  RaceReport r = expect_race([&] { side.launch(declared("read_b", {reads(b.data(), 64)})); });
  expect_names(r, "read_b", side, "write_b", main);
  side.wait(e);  // a new wait binds to the new record
  side.launch(declared("read_b", {reads(b.data(), 64)}));
  EXPECT_EQ(san->num_reports(), 1u);
}

TEST_F(SanitizerTest, WaitOnNeverRecordedEventOrdersNothing) {
  std::vector<float> a(16);
  Event never;
  main.launch(declared("write_a", {writes(a.data(), 64)}));
  side.wait(never);
  RaceReport r = expect_race([&] { side.launch(declared("read_a", {reads(a.data(), 64)})); });
  EXPECT_EQ(r.kind, HazardKind::kReadAfterWrite);
}

TEST_F(SanitizerTest, HostSynchronisationOrdersEveryStream) {
  std::vector<float> a(16);
  auto round = [&](const char* name, const std::function<void()>& sync) {
    side.launch(declared(name, {writes(a.data(), 64)}));
    sync();
    main.launch(declared("read_after_sync", {reads(a.data(), 64)}));
    main.launch(declared("write_after_sync", {writes(a.data(), 64)}));
    main.synchronize();
  };
  round("stream_sync", [&] { side.synchronize(); });
  round("device_sync", [&] { dev->synchronize(); });
  round("event_sync", [&] {
    Event e;
    side.record(e);
    e.synchronize();
  });
  Stream late = dev->create_stream(kPriorityDefault, "late");  // created after the syncs: sees them
  late.launch(declared("late_write", {writes(a.data(), 64)}));
  late.synchronize();
  EXPECT_EQ(san->num_reports(), 0u);
  // Without a sync, a third stream's write races with main's last write.
  Stream third = dev->create_stream(kPriorityDefault, "third");
  main.launch(declared("main_write", {writes(a.data(), 64)}));
  RaceReport r = expect_race([&] { third.launch(declared("third_write", {writes(a.data(), 64)})); });
  expect_names(r, "third_write", third, "main_write", main);
}

TEST_F(SanitizerTest, TransitiveOrderThroughAThirdStream) {
  std::vector<float> a(16);
  Stream third = dev->create_stream(kPriorityDefault, "third");
  main.launch(declared("write_a", {writes(a.data(), 64)}));
  side.wait_stream(main);
  third.wait_stream(side);  // main -> side -> third
  third.launch(declared("read_a", {reads(a.data(), 64)}));
  EXPECT_EQ(san->num_reports(), 0u);
}

TEST_F(SanitizerTest, UseAfterFreeAndHostWrites) {
  std::vector<float> a(16);
  dev->notify_alloc(a.data(), 64);
  RaceReport uninit = expect_race([&] { side.launch(declared("read_fresh", {reads(a.data(), 64)})); });
  EXPECT_EQ(uninit.kind, HazardKind::kUninitializedRead);
  note_host_write(*dev, a.data(), 64);  // a host fill initialises
  side.launch(declared("read_filled", {reads(a.data(), 64)}));
  // A host write while side's read may still run.
  RaceReport war = expect_race([&] { san->host_write(a.data(), 64); });
  EXPECT_EQ(war.kind, HazardKind::kWriteAfterRead);
  EXPECT_EQ(war.current.stream_name, "host");
  side.synchronize();
  dev->notify_free(a.data(), 64);
  // Host-ordered frees hand the bytes back to the heap, which may give them to memory nobody announces.
  main.launch(declared("unannounced_reuse", {reads(a.data() + 4, 8)}));
  EXPECT_EQ(san->num_reports(), 2u);
}

TEST(Sanitizer, UseAfterStreamOrderedFree) {
  auto dev = make_cpu_device({.num_workers = 1});
  auto san = enable_sanitizer(*dev, {.host_ordered_free = false});
  Stream main = dev->default_stream();
  std::vector<float> a(16);
  dev->notify_alloc(a.data(), 64);
  main.launch(declared("write_a", {writes(a.data(), 64)}));
  dev->notify_free(a.data(), 64);  // back in the pool, not reallocated
  RaceReport uaf = expect_race([&] { main.launch(declared("read_freed", {reads(a.data() + 4, 8)})); });
  EXPECT_EQ(uaf.kind, HazardKind::kUseAfterFree);
  EXPECT_EQ(uaf.current.op, "read_freed");
  EXPECT_EQ(uaf.ptr, a.data() + 4);
  EXPECT_EQ(uaf.bytes, 8u);
}

TEST_F(SanitizerTest, RejectedLaunchIsNotEnqueued) {
  std::vector<float> a(16);
  int ran = 0;
  main.launch(declared("write_a", {writes(a.data(), 64)}));
  EXPECT_THROW(side.launch({.name = "racy", .num_tiles = 1, .tile = [&](int) { ++ran; },
                            .accesses = {reads(a.data(), 64)}}),
               RaceError);
  dev->synchronize();
  EXPECT_EQ(ran, 0);
}

TEST_F(SanitizerTest, IntervalMapStaysSmall) {
  std::vector<unsigned char> buf(1 << 16);
  for (size_t off = 0; off < buf.size(); off += 64) main.launch(declared("chunk", {writes(buf.data() + off, 64)}));
  main.launch(declared("whole", {writes(buf.data(), buf.size())}));
  EXPECT_EQ(san->num_ranges(), 1u);  // one write covers all: adjacent ranges merge
  for (int i = 0; i < 1000; ++i) main.launch(declared("again", {reads(buf.data(), buf.size())}));
  EXPECT_EQ(san->num_ranges(), 1u);
}

// Graph mode: the captured DAG is checked on its own, and each replay against the eager work of other streams.
TEST_F(SanitizerTest, GraphReplaysOfTheCorrectProgramPass) {
  MiniLayer layer(*dev);
  begin_capture(main);
  layer.run();
  GraphExec exec = end_capture(main).instantiate();
  for (int i = 0; i < 3; ++i) exec.launch(main);
  dev->synchronize();
  EXPECT_EQ(san->num_reports(), 0u);
  EXPECT_EQ(layer.out()[5], (3.0f * 0.25f - 0.5f) + (2.0f * 0.25f + 1.0f) * 0.5f);
}

TEST_F(SanitizerTest, GraphWithAnUnorderedPairOfNodes) {
  std::vector<float> a(16), b(16);
  begin_capture(main);
  Event fork, join;
  main.record(fork);
  side.wait(fork);
  side.launch(declared("side_write", {writes(a.data(), 64)}));
  main.launch(declared("main_read", {reads(a.data() + 8, 32)}));  // before the join: unordered
  side.record(join);
  main.wait(join);
  main.launch(declared("main_write_b", {writes(b.data(), 64)}));
  Graph g = end_capture(main);
  std::vector<RaceReport> inner = check_graph(g.nodes());
  ASSERT_EQ(inner.size(), 1u);
  EXPECT_EQ(inner[0].kind, HazardKind::kReadAfterWrite);
  EXPECT_NE(inner[0].current.op.find("main_read"), std::string::npos) << inner[0].message;
  EXPECT_NE(inner[0].previous.op.find("side_write"), std::string::npos) << inner[0].message;
  EXPECT_EQ(inner[0].ptr, a.data() + 8);
  EXPECT_EQ(inner[0].bytes, 32u);
  GraphExec exec = g.instantiate();
  EXPECT_THROW(exec.launch(main), RaceError);
  // A replay on main races with an eager read of its output on side that does not wait for it.
  exec.launch(main);  // checked once per graph: this replay goes ahead
  RaceReport r = expect_race([&] { side.launch(declared("eager_read_b", {reads(b.data(), 64)})); });
  EXPECT_EQ(r.previous.op, "main_write_b (graph replay)");
  EXPECT_EQ(r.previous.stream_id, main.id());
  side.wait_stream(main);
  side.launch(declared("eager_read_b", {reads(b.data(), 64)}));
}

TEST(Sanitizer, OffByDefaultAndDetachable) {
  auto dev = make_cpu_device({.num_workers = 1});
  Stream main = dev->default_stream(), side = dev->stream_for("11");
  std::vector<float> a(16);
  main.launch(declared("write_a", {writes(a.data(), 64)}));
  side.launch(declared("read_a", {reads(a.data(), 64)}));  // racy, but no sanitizer: nothing is checked
  auto san = enable_sanitizer(*dev);
  disable_sanitizer(*dev, *san);
  main.launch(declared("write_a", {writes(a.data(), 64)}));
  side.launch(declared("read_a", {reads(a.data(), 64)}));
  EXPECT_EQ(san->num_reports(), 0u);
  dev->synchronize();
}

}  // namespace
}  // namespace moe::rt
