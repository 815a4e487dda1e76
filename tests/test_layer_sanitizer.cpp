// The layer under the runtime's correctness tools: the stream sanitizer finds no unordered cross-stream access
// (fork/join and workspace separation are right) for every family and schedule, back to back, eager and
// replayed; the declaration check finds no write outside an op's declared ranges, so the sanitizer's input is
// trustworthy.
#include <gtest/gtest.h>

#include <vector>

#include "layer/moe_layer.h"
#include "layer_test_inputs.h"
#include "check/tiny_configs.h"
#include "runtime/declaration_check.h"
#include "runtime/sanitizer.h"

namespace moe {
namespace {

LayerOptions always() { return {.max_tokens = 64, .policy = OverlapPolicy::always()}; }

TEST(LayerSanitizer, NoUnorderedAccessInAnySchedule) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  auto san = rt::enable_sanitizer(*dev, {.throw_on_first = false});
  for (const TinyConfig& tc : tiny_configs()) {
    const LayerWeights w = make_random_weights(tc.config, {.seed = 51});
    MoeLayer layer(tc.config, w, *dev, always());
    const int64_t tokens = 20;
    auto x = random_input(tokens * tc.config.hidden, 52);
    std::vector<float> y(x.size()), y2(x.size());
    // Back to back without a host synchronisation, switching schedules: consecutive calls reuse workspaces.
    for (Schedule s : {Schedule::kDual, Schedule::kPhased, Schedule::kSerial, Schedule::kFused, Schedule::kPhased,
                       Schedule::kFused, Schedule::kDual})
      layer.forward(x.data(), tokens, (static_cast<int>(s) & 1) ? y.data() : y2.data(), {.schedule = s});
    const LayerGraph g = layer.capture(x.data(), tokens, y.data(), {.schedule = Schedule::kPhased});
    layer.replay(g, x.data(), tokens, y.data());
    layer.forward(x.data(), tokens, y2.data(), {.schedule = Schedule::kDual});
    dev->synchronize();
    for (const rt::RaceReport& r : san->take_reports()) ADD_FAILURE() << tc.name << ": " << r.message;
  }
}

TEST(LayerSanitizer, OpsWriteOnlyWhatTheyDeclare) {
  auto dev = rt::make_cpu_device({.num_workers = 1});
  auto chk = rt::enable_declaration_check(*dev);  // registers the workspaces the layers announce
  for (const TinyConfig& tc : tiny_configs()) {
    const LayerWeights w = make_random_weights(tc.config, {.seed = 53});
    MoeLayer layer(tc.config, w, *dev, always());
    const int64_t tokens = 9;
    const auto x = random_input(tokens * tc.config.hidden, 54);
    float* y = static_cast<float*>(chk->allocate_guarded(x.size() * sizeof(float), "y"));
    for (Schedule s : kRunnableSchedules) {
      layer.forward(x.data(), tokens, y, {.schedule = s, .check_input = true});
      EXPECT_NO_THROW(dev->synchronize()) << tc.name << " " << schedule_name(s);
      // Captured operations are checked at every replay too.
      const LayerGraph g = layer.capture(x.data(), tokens, y, {.schedule = s, .check_input = true});
      layer.replay(g, x.data(), tokens, y);
      EXPECT_NO_THROW(dev->synchronize()) << tc.name << " " << schedule_name(s) << " replayed";
    }
    EXPECT_NO_THROW(chk->verify_guards());
    for (const std::string& v : chk->violations()) ADD_FAILURE() << tc.name << ": " << v;
  }
}

}  // namespace
}  // namespace moe
