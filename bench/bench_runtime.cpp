// Runtime overheads on the CPU device: what an empty operation costs to enqueue and complete, what one
// empty tile costs to hand out and count, what a cross-stream record/wait pair costs, and (graph mode)
// replay cost per node against eager launch per op.
//
// The first argument is the worker count: 1, 2 and 16. Workers beyond the machine's cores
// (std::thread::hardware_concurrency) oversubscribe it: those rows measure the scheduler under contention
// (workers preempted while they hold or wait for it), not a speed-up, and say so in their label.
//
//   build/bench/bench_runtime --benchmark_min_time=0.1 --benchmark_repetitions=5
//                             --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/graph.h"
#include "runtime/runtime.h"

namespace moe::rt {
namespace {

std::unique_ptr<Device> bench_device(benchmark::State& state) {
  CpuDeviceOptions o;
  o.num_workers = static_cast<int>(state.range(0));
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  if (cores > 0 && o.num_workers > cores) {
    std::string label = "oversubscribed: ";
    label += std::to_string(o.num_workers);
    label += " workers on ";
    label += std::to_string(cores);
    label += " cores (contention only)";
    state.SetLabel(label);
  }
  return make_cpu_device(o);
}

// Worker counts: one, the two of the reference machine, and an oversubscribed 16 (see above).
void workers(benchmark::internal::Benchmark* b) {
  for (int w : {1, 2, 16}) b->Arg(w);
}

// Round trip: launch one empty 1-tile op and wait for it (host -> worker -> host latency).
void BM_EmptyOpRoundTrip(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream s = dev->default_stream();
  for (auto _ : state) {
    s.launch({.name = "empty", .num_tiles = 1, .tile = [](int) {}});
    s.synchronize();
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EmptyOpRoundTrip)->Apply(workers)->UseRealTime();

// Per-operation overhead: a batch of empty 1-tile ops per synchronize; time per op is enqueue + schedule +
// complete.
void BM_EmptyOpPipelined(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream s = dev->default_stream();
  constexpr int kBatch = 256;
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) s.launch({.name = "empty", .num_tiles = 1, .tile = [](int) {}});
    s.synchronize();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_EmptyOpPipelined)->Apply(workers)->UseRealTime();

// Per-tile overhead: one op of kTiles empty tiles per synchronize; time per item is what handing out and
// counting one tile costs (the op's own enqueue and completion are amortised over the tiles).
constexpr int kTiles = 4096;
void BM_EmptyTiles(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream s = dev->default_stream();
  for (auto _ : state) {
    s.launch({.name = "wide", .num_tiles = kTiles, .tile = [](int) {}});
    s.synchronize();
  }
  state.SetItemsProcessed(state.iterations() * kTiles);
}
BENCHMARK(BM_EmptyTiles)->Apply(workers)->UseRealTime();

// Per-tile overhead with several streams at once: four streams, each a short queue of 16-tile ops, so the
// workers take tiles of different ops concurrently and ops complete often. Items are tiles.
void BM_EmptyTilesFourStreams(benchmark::State& state) {
  auto dev = bench_device(state);
  std::vector<Stream> streams;
  for (const char* name : {"s0", "s1", "s2", "s3"}) streams.push_back(dev->create_stream(kPriorityDefault, name));
  constexpr int kOps = 16, kOpTiles = 16;
  for (auto _ : state) {
    for (int i = 0; i < kOps; ++i)
      for (Stream& s : streams) s.launch({.name = "op", .num_tiles = kOpTiles, .tile = [](int) {}});
    dev->synchronize();
  }
  state.SetItemsProcessed(state.iterations() * 4 * kOps * kOpTiles);
}
BENCHMARK(BM_EmptyTilesFourStreams)->Apply(workers)->UseRealTime();

// A zero-tile op completes at enqueue on an idle stream: the pure host-side cost of launch().
void BM_ZeroTileLaunch(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream s = dev->default_stream();
  for (auto _ : state) s.launch({.name = "nothing", .num_tiles = 0});
  s.synchronize();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ZeroTileLaunch)->Arg(1)->UseRealTime();

// A fork/join pair per iteration: record on main, wait on side, a 1-tile op on side, record on side, wait
// on main. Reports time per record/wait pair (two pairs per iteration).
void BM_RecordWaitPair(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream main = dev->default_stream();
  Stream side = dev->stream_for("11");
  Event fork, join;
  constexpr int kBatch = 128;
  for (auto _ : state) {
    for (int i = 0; i < kBatch; ++i) {
      main.record(fork);
      side.wait(fork);
      side.launch({.name = "side", .num_tiles = 1, .tile = [](int) {}});
      side.record(join);
      main.wait(join);
    }
    main.synchronize();
  }
  state.SetItemsProcessed(state.iterations() * kBatch * 2);
}
BENCHMARK(BM_RecordWaitPair)->Apply(workers)->UseRealTime();

// The layer's shape in miniature: fork, kOpsPerStream empty 1-tile ops on each of main and side, join.
constexpr int kOpsPerStream = 32;
void fork_join_program(Stream& main, Stream& side) {
  Event fork, join;
  main.record(fork);
  side.wait(fork);
  for (int i = 0; i < kOpsPerStream; ++i) {
    main.launch({.name = "routed", .num_tiles = 1, .tile = [](int) {}});
    side.launch({.name = "shared", .num_tiles = 1, .tile = [](int) {}});
  }
  side.record(join);
  main.wait(join);
}

// Eager: the host issues every launch/record/wait each iteration. Items are operations.
void BM_ForkJoinEager(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream main = dev->default_stream();
  Stream side = dev->stream_for("11");
  for (auto _ : state) {
    fork_join_program(main, side);
    main.synchronize();
  }
  state.SetItemsProcessed(state.iterations() * 2 * kOpsPerStream);
}
BENCHMARK(BM_ForkJoinEager)->Apply(workers)->UseRealTime();

// Replay of the same program captured once: one launch per iteration. Items are nodes. range(1): 1 = stream
// fusion (one DAG), 0 = per-stream order.
void BM_ForkJoinReplay(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream main = dev->default_stream();
  Stream side = dev->stream_for("11");
  begin_capture(main);
  fork_join_program(main, side);
  GraphExec exec = end_capture(main).instantiate({.stream_fusion = state.range(1) != 0});
  for (auto _ : state) {
    exec.launch(main);
    main.synchronize();
  }
  state.SetItemsProcessed(state.iterations() * 2 * kOpsPerStream);
}
BENCHMARK(BM_ForkJoinReplay)
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({16, 1})
    ->Args({1, 0})
    ->Args({2, 0})
    ->UseRealTime();

// Per-tile overhead in a replay: a captured chain of 8 nodes of 512 empty tiles each. Items are tiles.
void BM_GraphTiles(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream main = dev->default_stream();
  constexpr int kNodes = 8, kNodeTiles = 512;
  begin_capture(main);
  for (int i = 0; i < kNodes; ++i) main.launch({.name = "node", .num_tiles = kNodeTiles, .tile = [](int) {}});
  GraphExec exec = end_capture(main).instantiate();
  for (auto _ : state) {
    exec.launch(main);
    main.synchronize();
  }
  state.SetItemsProcessed(state.iterations() * kNodes * kNodeTiles);
}
BENCHMARK(BM_GraphTiles)->Apply(workers)->UseRealTime();

// Host cost alone: what the calling thread spends issuing one iteration (eager: 64 launches + 2 record/wait
// pairs; graph: one launch), measured with the workers idle between iterations.
void BM_ForkJoinHostIssueEager(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream main = dev->default_stream();
  Stream side = dev->stream_for("11");
  for (auto _ : state) {
    fork_join_program(main, side);
    state.PauseTiming();
    main.synchronize();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * 2 * kOpsPerStream);
}
BENCHMARK(BM_ForkJoinHostIssueEager)->Arg(2);

void BM_ForkJoinHostIssueReplay(benchmark::State& state) {
  auto dev = bench_device(state);
  Stream main = dev->default_stream();
  Stream side = dev->stream_for("11");
  begin_capture(main);
  fork_join_program(main, side);
  GraphExec exec = end_capture(main).instantiate();
  for (auto _ : state) {
    exec.launch(main);
    state.PauseTiming();
    main.synchronize();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * 2 * kOpsPerStream);
}
BENCHMARK(BM_ForkJoinHostIssueReplay)->Arg(2);

}  // namespace
}  // namespace moe::rt

BENCHMARK_MAIN();
