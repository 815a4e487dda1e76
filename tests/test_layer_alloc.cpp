// No hidden allocation on the hot path: an eager forward of every overlap schedule, and every graph
// replay, allocate nothing once the layer is warm (counted by replacing the global operator new for this
// binary); and the in-place containers that make it so (SmallFunction, SmallVector, the queue's block
// pool) behave like the standard ones. Under a sanitizer, which owns operator new, only the latter run.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "layer/moe_layer.h"
#include "check/tiny_configs.h"
#include "layer_test_inputs.h"
#include "runtime/small_function.h"
#include "runtime/small_vector.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MOE_COUNT_ALLOCS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MOE_COUNT_ALLOCS 0
#endif
#endif
#ifndef MOE_COUNT_ALLOCS
#define MOE_COUNT_ALLOCS 1
#endif

namespace {
std::atomic<long> g_allocs{0};
std::atomic<long> g_off_main_allocs{0};  // on any thread but the one that runs the tests (the workers)
const std::thread::id g_main_thread = std::this_thread::get_id();
}  // namespace

#if MOE_COUNT_ALLOCS
// GCC pairs the inlined std::allocator calls with malloc/free through these and warns of a mismatch that
// the replacement makes consistent.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (std::this_thread::get_id() != g_main_thread) g_off_main_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
#endif

namespace moe {
namespace {

// Allocations (on any thread) while `f` runs and the device drains.
template <class F>
long allocations(rt::Device& dev, F f) {
  const long before = g_allocs.load();
  f();
  dev.synchronize();
  return g_allocs.load() - before;
}

TEST(LayerAlloc, WarmEagerForwardsAndReplaysAllocateNothing) {
  if (!MOE_COUNT_ALLOCS) GTEST_SKIP() << "a sanitizer owns operator new here";
  auto dev = rt::make_cpu_device({.num_workers = 2});
  for (const TinyConfig& tc : tiny_configs()) {
    const MoeConfig& c = tc.config;
    const LayerWeights w = make_random_weights(c, {.seed = 61});
    MoeLayer layer(c, w, *dev, {.max_tokens = 16, .policy = OverlapPolicy::always()});
    const auto x = random_input(16 * c.hidden, 62);
    std::vector<float> y(x.size());
    for (Schedule s : kRunnableSchedules) {
      const std::string at = tc.name + " " + std::string(schedule_name(s));
      // Warm-up: the queues' blocks (as deep as the queues will get below: more calls back to back than
      // are measured) and any first-use state.
      for (int i = 0; i < 8; ++i) layer.forward(x.data(), 9, y.data(), {.schedule = s});
      dev->synchronize();
      const long eager = allocations(*dev, [&] {
        for (int i = 0; i < 3; ++i) layer.forward(x.data(), 9, y.data(), {.schedule = s});
      });
      // fused: the fused operation keeps its parts (one allocation).
      const long allowed = s == Schedule::kFused && c.has_shared_expert() ? 3 * 1 : 0;
      EXPECT_LE(eager, allowed) << at << ": eager forwards allocated";
      const LayerGraph g = layer.capture(x.data(), 9, y.data(), {.schedule = s});
      layer.replay(g, x.data(), 9, y.data());
      dev->synchronize();
      EXPECT_EQ(allocations(*dev, [&] {
                  for (int i = 0; i < 3; ++i) layer.replay(g, x.data(), 9, y.data());
                }),
                0)
          << at << ": replays allocated";
    }
  }
}

// A traced forward records each op on the host when it is enqueued; the worker that retires the op only
// moves the record into room reserved when tracing was switched on. Growing the trace there put 15-25 us
// gaps into traced forwards after the ops where the vector doubled.
TEST(LayerAlloc, TracedForwardsAllocateNothingOnTheWorkers) {
  if (!MOE_COUNT_ALLOCS) GTEST_SKIP() << "a sanitizer owns operator new here";
  auto dev = rt::make_cpu_device({.num_workers = 2});
  const TinyConfig tc = tiny_configs()[0];  // a copy: tiny_configs() returns by value
  const MoeConfig& c = tc.config;
  const LayerWeights w = make_random_weights(c, {.seed = 63});
  MoeLayer layer(c, w, *dev, {.max_tokens = 16, .policy = OverlapPolicy::always()});
  const auto x = random_input(16 * c.hidden, 64);
  std::vector<float> y(x.size());
  for (Schedule s : kRunnableSchedules) {
    for (int i = 0; i < 8; ++i) layer.forward(x.data(), 9, y.data(), {.schedule = s});
    dev->synchronize();
    dev->set_tracing(true);
    const long before = g_off_main_allocs.load();
    for (int i = 0; i < 3; ++i) layer.forward(x.data(), 9, y.data(), {.schedule = s});
    dev->synchronize();
    const long on_workers = g_off_main_allocs.load() - before;
    dev->set_tracing(false);
    EXPECT_GE(dev->take_trace().ops.size(), 3u * 5u) << schedule_name(s);
    EXPECT_EQ(on_workers, 0) << schedule_name(s) << ": traced forwards allocated on the workers";
  }
}

// A counter of live copies, to see that SmallFunction constructs and destroys what it holds exactly once.
struct Counted {
  static inline int live = 0;
  int* calls;
  explicit Counted(int* c) : calls(c) { ++live; }
  Counted(const Counted& o) : calls(o.calls) { ++live; }
  Counted(Counted&& o) noexcept : calls(o.calls) { ++live; }
  ~Counted() { --live; }
  void operator()(int v) const { *calls += v; }
};

TEST(LayerAlloc, SmallFunctionKeepsSmallCallablesInPlaceAndLargeOnesOnTheHeap) {
  using Fn = rt::SmallFunction<void(int), 64>;
  int calls = 0;
  {
    Fn small = Counted(&calls);
    EXPECT_TRUE(small.stored_in_place());
    EXPECT_EQ(Counted::live, 1);
    small(2);
    Fn copy = small;  // copies the callable
    EXPECT_EQ(Counted::live, 2);
    copy(3);
    Fn moved = std::move(copy);  // moves it; the source is empty
    EXPECT_FALSE(static_cast<bool>(copy));  // NOLINT(bugprone-use-after-move): the documented state
    EXPECT_EQ(Counted::live, 2);
    moved(4);
    EXPECT_EQ(calls, 9);
    moved = nullptr;
    EXPECT_EQ(Counted::live, 1);
  }
  EXPECT_EQ(Counted::live, 0);
  {
    const Counted c(&calls);
    char pad[100] = {};
    Fn large = [c, pad](int v) { c(v + pad[0]); };  // 108+ bytes: on the heap
    EXPECT_FALSE(large.stored_in_place());
    Fn copy = large;
    Fn moved = std::move(large);
    copy(1);
    moved(1);
    EXPECT_EQ(calls, 11);
    EXPECT_EQ(Counted::live, 3);  // c, and one in each of copy and moved
  }
  EXPECT_EQ(Counted::live, 0);
  // Empty like std::function: a null or empty source gives an empty function, and calling one throws.
  const Fn none = std::function<void(int)>{};
  EXPECT_FALSE(static_cast<bool>(none));
  void (*null_fn)(int) = nullptr;
  EXPECT_FALSE(static_cast<bool>(Fn(null_fn)));
  EXPECT_THROW(none(1), std::bad_function_call);
  // Move-assigning a function from inside the callable being replaced.
  {
    auto owned = std::make_shared<Fn>(Counted(&calls));
    Fn* inner = owned.get();
    Fn outer = [owned = std::move(owned)](int v) { (*owned)(v); };  // the only owner of *inner
    outer = std::move(*inner);  // *inner dies with outer's old callable (ASan: a use after free if misordered)
    outer(5);
    EXPECT_EQ(calls, 16);
  }
  EXPECT_EQ(Counted::live, 0);
  // Mutable state persists across calls, as with std::function.
  Fn counter = [n = 0](int v) mutable { n += v; EXPECT_EQ(n, v == 1 ? 1 : 3); };
  counter(1);
  counter(2);
}

TEST(LayerAlloc, EveryLayerOperationTileFitsInPlace) {
  const TinyConfig tc = tiny_configs()[0];  // a copy: tiny_configs() returns by value
  auto dev = rt::make_cpu_device({.num_workers = 1});
  const LayerWeights w = make_random_weights(tc.config, {.seed = 63});
  MoeLayer layer(tc.config, w, *dev, {.max_tokens = 4, .policy = OverlapPolicy::always()});
  // The recorded graph holds the operations as built; each tile must have stayed in place.
  const auto x = random_input(4 * tc.config.hidden, 64);
  std::vector<float> y(x.size());
  for (Schedule s : kRunnableSchedules) {
    const LayerGraph g = layer.capture(x.data(), 4, y.data(), {.schedule = s, .check_input = true});
    for (const rt::GraphNode& n : g.exec().nodes()) {
      if (!n.op.tile) continue;
      EXPECT_TRUE(n.op.tile.stored_in_place()) << n.op.name;
      EXPECT_TRUE(n.op.accesses.in_place()) << n.op.name;
      EXPECT_LE(n.op.name.size(), 15u) << n.op.name << ": longer than std::string keeps in place";
    }
  }
}

TEST(LayerAlloc, SmallVectorGrowsPastItsInlineCapacity) {
  rt::SmallVector<int, 2> v = {1, 2};
  EXPECT_TRUE(v.in_place());
  v.push_back(3);
  EXPECT_FALSE(v.in_place());
  v.append(v.begin(), v.begin() + 2);  // from itself, before the growth
  EXPECT_EQ(std::vector<int>(v.begin(), v.end()), (std::vector<int>{1, 2, 3, 1, 2}));
  rt::SmallVector<int, 2> copy = v, moved = std::move(v);
  EXPECT_EQ(copy.size(), 5u);
  EXPECT_EQ(moved[4], 2);
  EXPECT_TRUE(v.empty());  // NOLINT(bugprone-use-after-move): the documented state
  const std::vector<int> from = {7, 8, 9};
  const rt::SmallVector<int, 4> list = from;
  EXPECT_EQ(list.size(), 3u);
  EXPECT_EQ(list[2], 9);
}

}  // namespace
}  // namespace moe
