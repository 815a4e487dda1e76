// The cost of the stream sanitizer: host time per launch of a zero-tile operation with declared accesses
// (sanitizer off = the runtime's empty observer-list check; on = clocks + interval map), per fork/join round
// of a two-stream program, and per forward of a tiny MoE layer (dual schedule), each off and on.
//
//   build-san/bench/bench_sanitizer --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "layer/moe_layer.h"
#include "check/tiny_configs.h"
#include "runtime/runtime.h"
#include "runtime/sanitizer.h"

namespace moe::rt {
namespace {

// state.range(0): 0 = sanitizer off, 1 = on.
std::unique_ptr<Device> device(const benchmark::State& state, int workers = 1) {
  auto dev = make_cpu_device({.num_workers = workers});
  if (state.range(0)) enable_sanitizer(*dev);
  return dev;
}

// Host cost of launch() for an op that reads two ranges and writes one (zero tiles: nothing runs).
void BM_LaunchDeclaredOp(benchmark::State& state) {
  auto dev = device(state);
  Stream s = dev->default_stream();
  std::vector<float> a(1024), b(1024), c(1024);
  int i = 0;
  for (auto _ : state) {
    // Slide the ranges so the interval map sees partial overlaps, not one fixed key.
    size_t off = static_cast<size_t>(i++ & 255);
    s.launch({.name = "op", .num_tiles = 0,
              .accesses = {reads(a.data() + off, 512 * 4), reads(b.data(), 4096), writes(c.data() + off, 256 * 4)}});
  }
  s.synchronize();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LaunchDeclaredOp)->Arg(0)->Arg(1)->ArgName("sanitizer");

// One fork/join round: 2 ops on main, 2 on side, 2 record/wait pairs; zero-tile ops (host cost only).
void BM_ForkJoinRound(benchmark::State& state) {
  auto dev = device(state);
  Stream main = dev->default_stream(), side = dev->stream_for("11");
  std::vector<float> x(4096), ws_main(4096), ws_side(4096), y(4096);
  Event fork, join;
  for (auto _ : state) {
    main.launch({.name = "produce", .num_tiles = 0, .accesses = {writes(x.data(), 16384)}});
    main.record(fork);
    side.wait(fork);
    side.launch({.name = "shared", .num_tiles = 0, .accesses = {reads(x.data(), 16384), writes(ws_side.data(), 16384)}});
    main.launch({.name = "routed", .num_tiles = 0, .accesses = {reads(x.data(), 16384), writes(ws_main.data(), 16384)}});
    side.record(join);
    main.wait(join);
    main.launch({.name = "combine", .num_tiles = 0,
                 .accesses = {reads(ws_main.data(), 16384), reads(ws_side.data(), 16384), writes(y.data(), 16384)}});
  }
  dev->synchronize();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ForkJoinRound)->Arg(0)->Arg(1)->ArgName("sanitizer");

// A whole forward of a tiny deepseek_v3 layer, dual schedule, 4 tokens, 2 workers, synchronized.
void BM_TinyLayerForward(benchmark::State& state) {
  auto dev = device(state, 2);
  const TinyConfig tc = tiny_configs()[5];
  const LayerWeights w = make_random_weights(tc.config, {.seed = 3});
  MoeLayer layer(tc.config, w, *dev, {.max_tokens = 16, .policy = OverlapPolicy::always()});
  std::vector<float> x(4 * tc.config.hidden, 0.5f), y(x.size());
  Stream main = dev->default_stream();
  for (auto _ : state) {
    layer.forward(x.data(), 4, y.data(), {.schedule = Schedule::kDual});
    main.synchronize();
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(tc.name);
}
BENCHMARK(BM_TinyLayerForward)->Arg(0)->Arg(1)->ArgName("sanitizer")->UseRealTime();

}  // namespace
}  // namespace moe::rt

BENCHMARK_MAIN();
