// Every schedule of every family, eager and replayed as a graph, under the schedule fuzzer (both serialized
// orders, random delays, shuffled tiles, NaN-poisoned workspaces) and the stream sanitizer: the output stays
// bitwise equal to the plain serial run and no hazard is reported. MOE_TEST_SCALE=small: fewer delayed runs.
#include "runtime/schedule_fuzz.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "layer/moe_layer.h"
#include "check/tiny_configs.h"

namespace moe {
namespace {

bool small_scale() {
  const char* s = std::getenv("MOE_TEST_SCALE");
  return s != nullptr && std::string(s) == "small";
}

std::vector<float> input(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  return x;
}

constexpr int64_t kTokens = 6;
const LayerOptions kOptions{.max_tokens = 16, .policy = OverlapPolicy::always()};

// Two calls back to back (the second reuses the workspaces the first left), eager or as graph replays.
std::vector<float> forward(rt::Device& dev, const TinyConfig& tc, const LayerWeights& w, const std::vector<float>& x,
                           Schedule s, bool graph) {
  MoeLayer layer(tc.config, w, dev, kOptions);
  std::vector<float> y(x.size());
  if (graph) {
    LayerGraph g = layer.capture(x.data(), kTokens, y.data(), {.schedule = s});
    layer.replay(g, x.data(), kTokens, y.data());
    layer.replay(g, x.data(), kTokens, y.data());
  } else {
    layer.forward(x.data(), kTokens, y.data(), {.schedule = s});
    layer.forward(x.data(), kTokens, y.data(), {.schedule = s});
  }
  dev.synchronize();
  return y;
}

TEST(ScheduleFuzz, EverySchedulePassesTheFuzzerAndTheSanitizer) {
  const rt::FuzzConfig config{.num_delay_runs = small_scale() ? 1 : 2, .max_delay_us = 20};
  int checked = 0;
  for (const TinyConfig& tc : tiny_configs()) {
    const LayerWeights w = make_random_weights(tc.config, {.seed = 71});
    const std::vector<float> x = input(kTokens * tc.config.hidden);
    std::vector<float> serial;
    {
      auto dev = rt::make_cpu_device({.num_workers = 2});
      serial = forward(*dev, tc, w, x, Schedule::kSerial, false);
    }
    for (Schedule s : kRunnableSchedules) {
      for (bool graph : {false, true}) {
        const std::string at = tc.name + " " + std::string(schedule_name(s)) + (graph ? " graph" : " eager");
        rt::FuzzOutcome out = rt::run_fuzzed(
            [&](rt::Device& dev) {
              std::vector<float> y = forward(dev, tc, w, x, s, graph);
              if (std::memcmp(y.data(), serial.data(), y.size() * sizeof(float)) != 0)
                throw std::runtime_error("output differs from the plain serial run");
              return rt::bytes_of(y);
            },
            config);
        EXPECT_TRUE(out.ok()) << at << ": " << out.summary();
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, static_cast<int>(tiny_configs().size() * std::size(kRunnableSchedules)) * 2);
}

}  // namespace
}  // namespace moe
