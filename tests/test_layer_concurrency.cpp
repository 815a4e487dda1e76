// Layers used at the same time and together, under the stream sanitizer:
//   - two layers on one device, with the same side-stream tag (so one process-wide side stream serves both),
//     forwarding from two host threads at once, each on a caller stream of its own, eager and as graph
//     replays, many calls back to back: every output has the bits of a single-threaded run;
//   - four layers' forward() calls (a decoder's consecutive MoE layers, one layer's output the next one's
//     input, each with another schedule) captured in one graph: every replay has the bits of the eager chain.
// MoeLayer::capture() starts a capture of its own (one at a time per device), so the multi-layer graph
// captures the forward() calls between rt::begin_capture and rt::end_capture on the caller's stream.
// MOE_TEST_SCALE=small (the sanitizer runs): fewer iterations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <latch>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check/tiny_configs.h"
#include "layer/moe_layer.h"
#include "layer_test_inputs.h"
#include "runtime/graph.h"
#include "runtime/sanitizer.h"

namespace moe {
namespace {

bool small_scale() {
  const char* s = std::getenv("MOE_TEST_SCALE");
  return s != nullptr && std::string(s) == "small";
}

// H = 128, I = 64, Is = 96: large enough for several tiles per operation on every worker.
constexpr int kSize = 4;
constexpr int64_t kMaxTokens = 16;

MoeConfig family(const std::string& name) {
  for (const TinyConfig& tc : tiny_configs(kSize))
    if (tc.name == name) return tc.config;
  throw std::logic_error("no tiny config named " + name);
}

LayerOptions options() {
  return {.max_tokens = kMaxTokens,
          .policy = OverlapPolicy::always(),
          .side_stream_tag = "11",
          .tuning = {{{1, Schedule::kPhased}, {4, Schedule::kDual}, {8, Schedule::kFused}}}};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_no_hazard(rt::Sanitizer& san, const std::string& what) {
  const std::vector<rt::RaceReport> reports = san.take_reports();
  EXPECT_TRUE(reports.empty()) << what << ": " << reports.size() << " sanitizer reports, the first: "
                               << (reports.empty() ? "" : reports.front().message);
}

// ---- two caller streams at once ---------------------------------------------------------------------------

constexpr int64_t kSlotTokens[] = {1, 3, 8, 16};
constexpr int kSlots = 4;
constexpr Schedule kCycle[] = {Schedule::kDual, Schedule::kPhased, Schedule::kFused, Schedule::kAuto,
                               Schedule::kSerial};

// One thread's share: a layer, its inputs and outputs per slot, what a single-threaded run gave.
struct Caller {
  MoeConfig config;
  LayerWeights weights;
  std::unique_ptr<MoeLayer> layer;
  rt::Stream stream;
  std::vector<std::vector<float>> x, y, expected;
  std::vector<LayerGraph> graphs;  // one per slot, captured on `stream`
  int mismatches = 0;
  std::string first_mismatch;
  std::exception_ptr error;
};

void setup(Caller& c, rt::Device& dev, const std::string& name, uint64_t seed) {
  c.config = family(name);
  c.weights = make_random_weights(c.config, {.dtype = DType::kBF16, .seed = seed});
  c.layer = std::make_unique<MoeLayer>(c.config, c.weights, dev, options());
  c.stream = dev.create_stream(rt::kPriorityDefault, name + " caller");
  for (int k = 0; k < kSlots; ++k) {
    const int64_t n = kSlotTokens[k] * c.config.hidden;
    c.x.push_back(random_input(n, seed * 100 + static_cast<uint64_t>(k)));
    c.y.emplace_back(static_cast<size_t>(n), 0.0f);
  }
}

// Every slot's serial output, one call at a time on the default stream.
void run_single_threaded(Caller& c) {
  for (int k = 0; k < kSlots; ++k) {
    std::vector<float> y(c.x[static_cast<size_t>(k)].size());
    c.layer->forward(c.x[static_cast<size_t>(k)].data(), kSlotTokens[k], y.data(), {.schedule = Schedule::kSerial});
    rt::current_stream(c.layer->device()).synchronize();
    c.expected.push_back(std::move(y));
  }
}

// Slot k of iteration i: a replay of its graph every third time, else an eager call of kCycle's next schedule.
bool replays(int i, int k) { return (i + k) % 3 == 0; }
Schedule eager_schedule(int i, int k) { return kCycle[static_cast<size_t>(i + k) % std::size(kCycle)]; }

// Iteration i: every slot once, back to back, then one synchronisation of the caller's stream.
void run_calls(Caller& c, int iterations, std::latch& start) {
  try {
    rt::StreamGuard guard(c.stream);
    start.arrive_and_wait();
    for (int i = 0; i < iterations; ++i) {
      for (int k = 0; k < kSlots; ++k) {
        const size_t s = static_cast<size_t>(k);
        std::fill(c.y[s].begin(), c.y[s].end(), -1.0f);  // the previous iteration's work is synchronized
        rt::note_host_write(c.layer->device(), c.y[s].data(), c.y[s].size() * sizeof(float));
        if (replays(i, k)) {
          c.layer->replay(c.graphs[s], c.x[s].data(), kSlotTokens[k], c.y[s].data());
        } else {
          c.layer->forward(c.x[s].data(), kSlotTokens[k], c.y[s].data(), {.schedule = eager_schedule(i, k)});
        }
      }
      c.stream.synchronize();
      for (int k = 0; k < kSlots; ++k) {
        const size_t s = static_cast<size_t>(k);
        if (same_bits(c.y[s], c.expected[s])) continue;
        if (c.mismatches++ == 0)
          c.first_mismatch = "iteration " + std::to_string(i) + " slot " + std::to_string(k) + " (" +
                             std::to_string(kSlotTokens[k]) + " tokens, " +
                             (replays(i, k) ? "replay" : std::string(schedule_name(eager_schedule(i, k)))) + ")";
      }
    }
  } catch (...) {
    c.error = std::current_exception();
  }
}

TEST(LayerConcurrency, TwoLayersOnTwoCallerStreamsShareTheSideStreamAndKeepTheirBits) {
  const int iterations = small_scale() ? 40 : 400;
  auto dev = rt::make_cpu_device({.num_workers = 3});
  auto san = rt::enable_sanitizer(*dev, {.throw_on_first = false});
  Caller a, b;
  setup(a, *dev, "qwen3_next", 1);
  setup(b, *dev, "deepseek_v3", 2);
  ASSERT_TRUE(a.layer->side_stream());
  EXPECT_TRUE(a.layer->side_stream() == b.layer->side_stream()) << "one process-wide side stream";
  EXPECT_TRUE(a.layer->side_stream() == dev->stream_for("11"));
  for (Caller* c : {&a, &b}) run_single_threaded(*c);
  // The graphs, one capture at a time, on each caller's stream; each slot its own schedule.
  for (Caller* c : {&a, &b}) {
    rt::StreamGuard guard(c->stream);
    for (int k = 0; k < kSlots; ++k)
      c->graphs.push_back(c->layer->capture(c->x[static_cast<size_t>(k)].data(), kSlotTokens[k],
                                            c->y[static_cast<size_t>(k)].data(), {.schedule = kCycle[k]}));
  }

  std::latch start(2);
  std::thread ta(run_calls, std::ref(a), iterations, std::ref(start));
  std::thread tb(run_calls, std::ref(b), iterations, std::ref(start));
  ta.join();
  tb.join();
  for (Caller* c : {&a, &b}) {
    const std::string name = c->config.model_type;
    if (c->error) {
      try {
        std::rethrow_exception(c->error);
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << " caller thread: " << e.what();
      }
    }
    EXPECT_EQ(c->mismatches, 0) << name << ": " << c->mismatches << " of " << iterations * kSlots
                                << " outputs differ from the single-threaded run; the first at " << c->first_mismatch;
  }
  dev->synchronize();
  expect_no_hazard(*san, "two caller streams");
}

// ---- several layers in one capture ------------------------------------------------------------------------

TEST(LayerConcurrency, FourLayersCapturedInOneGraphReplayTheEagerChain) {
  const int inputs = small_scale() ? 3 : 6;
  constexpr int64_t kTokens = 7;
  auto dev = rt::make_cpu_device({.num_workers = 2});
  auto san = rt::enable_sanitizer(*dev, {.throw_on_first = false});
  struct Stage {
    MoeConfig config;
    Schedule schedule;
    LayerWeights weights;
    std::unique_ptr<MoeLayer> layer;
  };
  std::vector<Stage> stages;
  stages.push_back({family("qwen3_next"), Schedule::kPhased, {}, nullptr});
  stages.push_back({family("deepseek_v3"), Schedule::kDual, {}, nullptr});
  stages.push_back({family("qwen3_moe"), Schedule::kSerial, {}, nullptr});
  stages.push_back({family("qwen2_moe"), Schedule::kFused, {}, nullptr});
  for (size_t i = 0; i < stages.size(); ++i) {
    Stage& s = stages[i];
    ASSERT_EQ(s.config.hidden, stages[0].config.hidden);
    s.weights = make_random_weights(s.config, {.dtype = DType::kBF16, .seed = 30 + i});
    s.layer = std::make_unique<MoeLayer>(s.config, s.weights, *dev, options());
  }
  const int64_t n = kTokens * stages[0].config.hidden;
  // x -> h[0] -> h[1] -> ... : stage i reads h[i - 1] (or x) and writes h[i].
  std::vector<float> x(static_cast<size_t>(n));
  std::vector<std::vector<float>> h(stages.size(), std::vector<float>(static_cast<size_t>(n)));
  rt::Stream main = dev->default_stream();
  auto enqueue_chain = [&] {
    for (size_t i = 0; i < stages.size(); ++i)
      stages[i].layer->forward(i == 0 ? x.data() : h[i - 1].data(), kTokens, h[i].data(),
                               {.schedule = stages[i].schedule});
  };
  auto write_input = [&](int i) {
    const std::vector<float> in = random_input(n, 900 + static_cast<uint64_t>(i));
    std::copy(in.begin(), in.end(), x.begin());
    rt::note_host_write(*dev, x.data(), x.size() * sizeof(float));
  };

  std::vector<std::vector<std::vector<float>>> eager;  // [input][stage]
  for (int i = 0; i < inputs; ++i) {
    write_input(i);
    enqueue_chain();
    main.synchronize();
    eager.push_back(h);
  }

  rt::begin_capture(main);
  try {
    enqueue_chain();
  } catch (...) {
    try {
      rt::end_capture(main);
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  const rt::Graph graph = rt::end_capture(main);
  std::set<int> streams;
  for (const rt::GraphNode& node : graph.nodes()) streams.insert(node.stream_id);
  EXPECT_EQ(streams.size(), 2u) << "the caller's stream and the one side stream";
  // An eager call of every layer after the capture, before the replays: eager calls and replays share the
  // layers' workspaces on one stream.
  for (int i = 0; i < inputs; ++i) {
    write_input(i);
    enqueue_chain();
    main.synchronize();
    for (size_t s = 0; s < stages.size(); ++s)
      EXPECT_TRUE(same_bits(h[s], eager[static_cast<size_t>(i)][s])) << "eager after the capture, input " << i
                                                                     << " stage " << s;
  }

  for (bool fusion : {true, false}) {
    const rt::GraphExec exec = graph.instantiate({.stream_fusion = fusion});
    for (int i = inputs - 1; i >= 0; --i) {  // the other order than the eager runs
      for (auto& v : h) {
        std::fill(v.begin(), v.end(), -1.0f);
        rt::note_host_write(*dev, v.data(), v.size() * sizeof(float));
      }
      write_input(i);
      exec.launch(main);
      // Now and then an eager call after the replay, on the same stream, through the workspaces the replay
      // used: stage 1 again (another schedule) on the replay's h[0], into h.back().
      const bool eager_after = i % 2 == 0;
      if (eager_after)
        stages[1].layer->forward(h[0].data(), kTokens, h.back().data(), {.schedule = Schedule::kPhased});
      main.synchronize();
      const char* how = fusion ? "stream-fused replay" : "per-stream-order replay";
      for (size_t s = 0; s < stages.size(); ++s) {
        const size_t from = eager_after && s + 1 == stages.size() ? 1 : s;
        EXPECT_TRUE(same_bits(h[s], eager[static_cast<size_t>(i)][from]))
            << how << " of input " << i << ": stage " << from << " (" << stages[from].config.model_type << ", "
            << schedule_name(stages[from].schedule) << ") differs from eager"
            << (from != s ? " (the eager call after the replay)" : "");
      }
    }
  }
  dev->synchronize();
  expect_no_hazard(*san, "one graph of four layers");
}

}  // namespace
}  // namespace moe
