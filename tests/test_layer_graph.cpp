// Graph mode of the layer: the same forward body run eagerly and as a captured, replayed graph gives the same
// bits for every family, schedule and token-count bucket; new inputs written into the captured buffer are
// picked up by the replay; a replay that differs from its capture fails loudly; policies are fixed at capture.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "layer/moe_layer.h"
#include "layer_test_inputs.h"
#include "check/tiny_configs.h"

namespace moe {
namespace {

LayerOptions always(int64_t max_tokens = 64) { return {.max_tokens = max_tokens, .policy = OverlapPolicy::always()}; }

enum class Mode { kEager, kGraph };

// One test body, run in both modes (as CUB runs each test eagerly and under capture). In graph mode the
// capture happens once per bucket, then each input is written into the captured buffer and replayed.
std::vector<std::vector<float>> run_body(MoeLayer& layer, Mode mode, Schedule s, int64_t tokens,
                                         const std::vector<std::vector<float>>& inputs) {
  std::vector<float> x(inputs[0].size()), y(inputs[0].size(), -1.0f);
  std::vector<std::vector<float>> outputs;
  LayerGraph graph;
  if (mode == Mode::kGraph) graph = layer.capture(x.data(), tokens, y.data(), {.schedule = s});
  for (const auto& in : inputs) {
    std::copy(in.begin(), in.end(), x.begin());
    if (mode == Mode::kGraph) {
      layer.replay(graph, x.data(), tokens, y.data());
    } else {
      layer.forward(x.data(), tokens, y.data(), {.schedule = s});
    }
    rt::current_stream(layer.device()).synchronize();
    outputs.push_back(y);
  }
  return outputs;
}

TEST(LayerGraph, ReplayIsBitwiseEagerForEveryFamilyScheduleAndBucket) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  for (const TinyConfig& tc : tiny_configs()) {
    const LayerWeights w = make_random_weights(tc.config, {.dtype = DType::kBF16, .seed = 41});
    MoeLayer layer(tc.config, w, *dev, always());
    for (int64_t tokens : {1, 7, 33}) {
      std::vector<std::vector<float>> inputs;
      for (uint64_t i = 0; i < 3; ++i) inputs.push_back(random_input(tokens * tc.config.hidden, 100 * tokens + i));
      const auto serial = run_body(layer, Mode::kEager, Schedule::kSerial, tokens, inputs);
      for (Schedule s : kRunnableSchedules) {
        for (Mode mode : {Mode::kEager, Mode::kGraph}) {
          const auto out = run_body(layer, mode, s, tokens, inputs);
          for (size_t i = 0; i < inputs.size(); ++i)
            EXPECT_EQ(std::memcmp(out[i].data(), serial[i].data(), out[i].size() * 4), 0)
                << tc.name << " " << schedule_name(s) << (mode == Mode::kGraph ? " replayed" : " eager") << " tokens "
                << tokens << " input " << i;
        }
      }
    }
  }
}

TEST(LayerGraph, CaptureRecordsTheScheduleAcrossBothStreams) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  const MoeConfig c = tiny_configs()[0].config;  // qwen2_moe
  const LayerWeights w = make_random_weights(c, {.seed = 42});
  MoeLayer layer(c, w, *dev, always());
  std::vector<float> x(4 * c.hidden), y(x.size());
  const LayerGraph dual = layer.capture(x.data(), 4, y.data(), {.schedule = Schedule::kDual});
  std::set<int> streams;
  std::set<std::string> names;
  for (const rt::GraphNode& n : dual.exec().nodes()) {
    streams.insert(n.stream_id);
    names.insert(n.op.name);
  }
  EXPECT_EQ(streams.size(), 2u);
  EXPECT_TRUE(names.count("shared.down") && names.count("experts") && names.count("sum"));
  EXPECT_EQ(dual.decision().schedule, Schedule::kDual);
  const LayerGraph serial = layer.capture(x.data(), 4, y.data(), {.schedule = Schedule::kSerial});
  EXPECT_EQ(serial.num_nodes(), dual.num_nodes());
}

TEST(LayerGraph, PoliciesAreDecidedPerBucketAtCapture) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  const MoeConfig c = tiny_configs()[0].config;
  const LayerWeights w = make_random_weights(c, {.seed = 43});
  MoeLayer layer(c, w, *dev, {.max_tokens = 64, .policy = {.multi_stream = true, .decode_only = true, .token_threshold = 8}});
  std::vector<float> x(16 * c.hidden), y(x.size());
  const LayerGraph small = layer.capture(x.data(), 8, y.data(), {.schedule = Schedule::kPhased});
  const LayerGraph big = layer.capture(x.data(), 16, y.data(), {.schedule = Schedule::kPhased});
  EXPECT_EQ(small.decision().schedule, Schedule::kPhased);
  EXPECT_EQ(big.decision().schedule, Schedule::kSerial);
  EXPECT_NE(big.decision().reason.find("threshold"), std::string::npos);
  for (const rt::GraphNode& n : big.exec().nodes()) EXPECT_EQ(n.stream_id, dev->default_stream().id()) << n.op.name;
}

TEST(LayerGraph, ReplayThatDiffersFromTheCaptureThrows) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  const MoeConfig c = tiny_configs()[5].config;  // deepseek_v3
  const LayerWeights w = make_random_weights(c, {.seed = 44});
  MoeLayer layer(c, w, *dev, always()), other(c, w, *dev, always());
  std::vector<float> x(8 * c.hidden), y(x.size()), x2(x.size()), y2(x.size());
  const LayerGraph g = layer.capture(x.data(), 8, y.data(), {.schedule = Schedule::kDual});
  auto expect_named = [&](auto&& call, const std::string& named) {
    try {
      call();
      ADD_FAILURE() << "expected a replay error naming " << named;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  };
  expect_named([&] { layer.replay(g, x.data(), 7, y.data()); }, "token count");
  expect_named([&] { layer.replay(g, x2.data(), 8, y.data()); }, "input pointer x");
  expect_named([&] { layer.replay(g, x.data(), 8, y2.data()); }, "output pointer y");
  expect_named([&] { other.replay(g, x.data(), 8, y.data()); }, "another layer");
  EXPECT_NO_THROW(layer.replay(g, x.data(), 8, y.data()));
  EXPECT_NO_THROW(dev->default_stream().synchronize());
}

}  // namespace
}  // namespace moe
