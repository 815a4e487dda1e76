// Runtime overheads on the CPU device: what an empty operation costs to enqueue and complete, what a
// cross-stream record/wait pair costs, and (graph mode) replay cost per node against eager launch per op.
//
//   build-rt/bench/bench_runtime --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <memory>

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

}  // namespace
}  // namespace moe::rt

BENCHMARK_MAIN();
