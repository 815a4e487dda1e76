// Runtime overheads on the CPU device: what an empty operation costs to enqueue and complete, what a
// cross-stream record/wait pair costs, and (graph mode) replay cost per node against eager launch per op.
//
//   build-rt/bench/bench_runtime --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <memory>

#include "runtime/graph.h"
#include "runtime/runtime.h"

namespace moe::rt {
namespace {

std::unique_ptr<Device> bench_device(const benchmark::State& state) {
  CpuDeviceOptions o;
  o.num_workers = static_cast<int>(state.range(0));
  return make_cpu_device(o);
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
BENCHMARK(BM_EmptyOpRoundTrip)->Arg(1)->Arg(2)->UseRealTime();

// Throughput: a batch of empty 1-tile ops per synchronize; time per op is enqueue + schedule + complete.
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
BENCHMARK(BM_EmptyOpPipelined)->Arg(1)->Arg(2)->UseRealTime();

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
BENCHMARK(BM_RecordWaitPair)->Arg(1)->Arg(2)->UseRealTime();

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
BENCHMARK(BM_ForkJoinEager)->Arg(1)->Arg(2)->UseRealTime();

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
BENCHMARK(BM_ForkJoinReplay)->Args({1, 1})->Args({2, 1})->Args({1, 0})->Args({2, 0})->UseRealTime();

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
