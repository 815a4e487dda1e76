// The real layer's checks can fail, and its failures reach the caller:
//   - each schedule's placement has the shape forward_plan.h describes;
//   - a fault planted in the placement (check/planted_faults.h) is reported by the stream sanitizer and
//     turned into a wrong output by the schedule fuzzer; the two that only change phased's pacing are not;
//   - an operation of the shared branch that throws, under dual, phased and fused, eager and replayed, makes
//     synchronize() on the caller's stream throw, naming the operation, with y left unwritten; the next call
//     is correct.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check/planted_faults.h"
#include "check/tiny_configs.h"
#include "layer/moe_layer.h"
#include "layer_test_inputs.h"
#include "runtime/graph.h"
#include "runtime/sanitizer.h"
#include "runtime/schedule_fuzz.h"

namespace moe {
namespace {

constexpr int64_t kTokens = 5;

MoeConfig gated_config() {
  for (const TinyConfig& t : tiny_configs())
    if (t.config.shared_expert_gate && t.config.has_shared_expert()) return t.config;
  throw std::runtime_error("no tiny config with a gated shared expert");
}

struct Fixture {
  MoeConfig config = gated_config();
  LayerWeights weights = make_random_weights(config, {.seed = 5});
  std::vector<float> x = random_input(kTokens * config.hidden, 9);
  LayerOptions options{.max_tokens = 8, .policy = OverlapPolicy::always()};

  std::vector<float> serial_output() const {
    auto dev = rt::make_cpu_device({.num_workers = 1});
    MoeLayer layer(config, weights, *dev, options);
    std::vector<float> y(x.size());
    layer.forward(x.data(), kTokens, y.data(), {.schedule = Schedule::kSerial});
    dev->synchronize();
    return y;
  }
};

// ---- placements ----------------------------------------------------------------------------------------

int count_launches(const ForwardPlan& p, std::string_view name, StreamRole s) {
  int n = 0;
  for (const PlacedAction& a : p.actions)
    if (a.kind == PlacedAction::Kind::kLaunch && a.stream == s && p.steps[a.step].name == name) ++n;
  return n;
}

int position(const ForwardPlan& p, PlacedAction::Kind kind, StreamRole s, int event_or_step) {
  for (size_t i = 0; i < p.actions.size(); ++i) {
    const PlacedAction& a = p.actions[i];
    if (a.kind != kind || a.stream != s) continue;
    if ((kind == PlacedAction::Kind::kLaunch ? a.step : a.event) == event_or_step) return static_cast<int>(i);
  }
  return -1;
}

int step_index(const ForwardPlan& p, std::string_view name) {
  for (size_t i = 0; i < p.steps.size(); ++i)
    if (p.steps[i].name == name) return static_cast<int>(i);
  return -1;
}

TEST(ForwardPlan, EveryScheduleLaunchesEveryStepOnceOnItsStream) {
  const Fixture f;
  const std::vector<ForwardStep> steps = describe_forward(f.config);
  for (Schedule s : kRunnableSchedules) {
    const ForwardPlan p = place(s, steps);
    SCOPED_TRACE(std::string(schedule_name(s)) + ":\n" + to_string(p));
    for (const ForwardStep& st : steps) {
      const bool multi = s == Schedule::kDual || s == Schedule::kPhased;
      const StreamRole where = multi && st.branch == Branch::kShared ? StreamRole::kSide : StreamRole::kMain;
      // fused runs the shared steps inside the routed experts' one.
      const int expected = s == Schedule::kFused && st.branch == Branch::kShared ? 0 : 1;
      EXPECT_EQ(count_launches(p, st.name, where), expected) << st.name;
    }
  }
  // Without a shared expert only serial is placed, and it has no side stream.
  MoeConfig plain = f.config;
  plain.shared_intermediate = 0;
  plain.shared_expert_gate = false;
  EXPECT_THROW(place(Schedule::kDual, describe_forward(plain)), std::invalid_argument);
  EXPECT_THROW(place(Schedule::kAuto, steps), std::invalid_argument);
}

TEST(ForwardPlan, ForksAndJoinsAreWhereTheScheduleSaysTheyAre) {
  const Fixture f;
  const ForwardPlan dual = place(Schedule::kDual, describe_forward(f.config));
  using K = PlacedAction::Kind;
  const StreamRole M = StreamRole::kMain, S = StreamRole::kSide;
  // dual: the side waits for the fork before its first step; the sum waits for the join; the shared branch
  // is issued before the routed path.
  EXPECT_LT(position(dual, K::kWait, S, kForkEvent), position(dual, K::kLaunch, S, step_index(dual, "shared_gate")));
  EXPECT_LT(position(dual, K::kLaunch, S, step_index(dual, "shared.down")), position(dual, K::kRecord, S, kJoinEvent));
  EXPECT_LT(position(dual, K::kWait, M, kJoinEvent), position(dual, K::kLaunch, M, step_index(dual, "sum")));
  EXPECT_LT(position(dual, K::kLaunch, S, step_index(dual, "shared.down")),
            position(dual, K::kLaunch, M, step_index(dual, "router")));
  // phased: segment s of the shared branch waits for the event main records after its segment s-1.
  const ForwardPlan ph = place(Schedule::kPhased, describe_forward(f.config));
  EXPECT_LT(position(ph, K::kLaunch, M, step_index(ph, "router")), position(ph, K::kRecord, M, kSegmentEvent1));
  EXPECT_LT(position(ph, K::kWait, S, kSegmentEvent1), position(ph, K::kLaunch, S, step_index(ph, "shared.gate_up")));
  EXPECT_LT(position(ph, K::kLaunch, M, step_index(ph, "dispatch")), position(ph, K::kRecord, M, kSegmentEvent2));
  EXPECT_LT(position(ph, K::kWait, S, kSegmentEvent2), position(ph, K::kLaunch, S, step_index(ph, "shared.act")));
  EXPECT_LT(position(ph, K::kLaunch, M, step_index(ph, "experts")), position(ph, K::kRecord, M, kSegmentEvent3));
  EXPECT_LT(position(ph, K::kWait, S, kSegmentEvent3), position(ph, K::kLaunch, S, step_index(ph, "shared.down")));
  EXPECT_LT(position(ph, K::kWait, M, kJoinEvent), position(ph, K::kLaunch, M, step_index(ph, "sum")));
}

// ---- planted faults ------------------------------------------------------------------------------------

// Two calls back to back (the second hands over what the first left) under `plan`.
std::vector<float> run_plan(rt::Device& dev, const Fixture& f, Schedule s, const PlantedFault* fault) {
  MoeLayer layer(f.config, f.weights, dev, f.options);
  const ForwardPlan p = fault ? plant(layer.plan(s), *fault) : layer.plan(s);
  std::vector<float> y(f.x.size());
  for (int call = 0; call < 2; ++call) layer.forward_plan(p, f.x.data(), kTokens, y.data());
  dev.synchronize();
  return y;
}

struct Case {
  Schedule schedule;
  PlantedFault fault;
  std::string name() const { return std::string(fault_name(fault)) + " under " + std::string(schedule_name(schedule)); }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Schedule s : {Schedule::kDual, Schedule::kPhased})
    for (PlantedFault f : kAllPlantedFaults)
      if (applies(f, s)) out.push_back({s, f});
  return out;
}

TEST(PlantedFaults, TheSanitizerReportsEachFaultAndNothingElse) {
  const Fixture f;
  for (const Case& c : cases()) {
    auto dev = rt::make_cpu_device({.num_workers = 2});
    dev->add_interposer(std::make_shared<rt::Poisoner>());  // a hand-over is an operation the sanitizer sees
    auto san = rt::enable_sanitizer(*dev, {.throw_on_first = false});
    run_plan(*dev, f, c.schedule, &c.fault);
    const std::vector<rt::RaceReport> reports = san->take_reports();
    if (breaks_ordering(c.fault)) {
      ASSERT_FALSE(reports.empty()) << c.name() << ": the sanitizer missed it";
      std::printf("planted fault %s: sanitizer reports %zu hazards, first: %s\n", c.name().c_str(), reports.size(),
                  reports[0].message.substr(0, 160).c_str());
    } else {
      EXPECT_TRUE(reports.empty()) << c.name() << " only paces the overlap, yet: " << reports[0].message;
      std::printf("planted fault %s: no hazard (pacing only), as expected\n", c.name().c_str());
    }
  }
}

TEST(PlantedFaults, TheFuzzerTurnsEachFaultIntoAWrongOutput) {
  const Fixture f;
  const std::vector<float> serial = f.serial_output();
  for (const Case& c : cases()) {
    const rt::FuzzOutcome out = rt::run_fuzzed(
        [&](rt::Device& dev) {
          std::vector<float> y = run_plan(dev, f, c.schedule, &c.fault);
          if (std::memcmp(y.data(), serial.data(), y.size() * sizeof(float)) != 0)
            throw std::runtime_error("output differs from serial");
          return rt::bytes_of(y);
        },
        {.num_delay_runs = 2, .max_delay_us = 30, .sanitize = false});
    if (breaks_ordering(c.fault)) {
      ASSERT_FALSE(out.ok()) << c.name() << ": every fuzzed run gave the serial output";
      // Not by chance: a serialized order (all work queued before any runs) exposes each one every time.
      EXPECT_TRUE(std::any_of(out.failures.begin(), out.failures.end(),
                              [](const std::string& m) { return m.find("[serialized") != std::string::npos; }))
          << c.name() << ": only timing-dependent runs caught it: " << out.summary();
      std::printf("planted fault %s: fuzzer: %zu of %d runs wrong, first: %s\n", c.name().c_str(),
                  out.failures.size(), out.num_runs, out.failures[0].substr(0, 120).c_str());
    } else {
      EXPECT_TRUE(out.ok()) << c.name() << ": " << out.summary();
    }
  }
}

TEST(PlantedFaults, TheUnalteredPlacementsPassBoth) {
  const Fixture f;
  const std::vector<float> serial = f.serial_output();
  for (Schedule s : {Schedule::kDual, Schedule::kPhased}) {
    const rt::FuzzOutcome out = rt::run_fuzzed([&](rt::Device& dev) {
      std::vector<float> y = run_plan(dev, f, s, nullptr);
      if (std::memcmp(y.data(), serial.data(), y.size() * sizeof(float)) != 0)
        throw std::runtime_error("output differs from serial");
      return rt::bytes_of(y);
    });
    EXPECT_TRUE(out.ok()) << schedule_name(s) << ": " << out.summary();
  }
}

// A layer whose last forward() was captured into a caller's graph (its events recorded inside that capture)
// is destroyed without waiting on them (nothing of it runs but the graph's replays) and without aborting.
TEST(LayerLifetime, DestroyedAfterAForwardCapturedByTheCaller) {
  const Fixture f;
  auto dev = rt::make_cpu_device({.num_workers = 2});
  rt::Stream main = dev->default_stream();
  std::vector<float> y(f.x.size());
  rt::GraphExec exec;
  {
    MoeLayer layer(f.config, f.weights, *dev, f.options);
    rt::begin_capture(main);
    layer.forward(f.x.data(), kTokens, y.data(), {.schedule = Schedule::kDual});
    exec = rt::end_capture(main).instantiate();
    exec.launch(main);
    main.synchronize();
  }
  EXPECT_EQ(std::memcmp(y.data(), f.serial_output().data(), y.size() * sizeof(float)), 0);
}

// ---- errors of the shared branch reach the caller --------------------------------------------------------

// Makes one operation, by name, throw from its first tile while armed; launched and captured ops alike.
class FailingOp : public rt::Interposer {
 public:
  explicit FailingOp(std::string name) : name_(std::move(name)) {}
  std::atomic<bool> armed{false};
  void before_launch(const rt::Stream&, rt::Op& op) override {
    if (op.name != name_ || !op.tile) return;
    op.tile = [inner = std::move(op.tile), this](int t) {
      if (t == 0 && armed.load()) throw std::runtime_error("planted failure");
      inner(t);
    };
  }

 private:
  std::string name_;
};

TEST(LayerErrors, ASharedBranchFailureReachesTheCallerAndTheLayerRecovers) {
  const Fixture f;
  const std::vector<float> serial = f.serial_output();
  struct Target {
    Schedule schedule;
    const char* op;
  };
  const Target targets[] = {
      {Schedule::kDual, "shared_gate"},    {Schedule::kDual, "shared.gate_up"},   {Schedule::kDual, "shared.act"},
      {Schedule::kDual, "shared.down"},    {Schedule::kPhased, "shared_gate"},    {Schedule::kPhased, "shared.gate_up"},
      {Schedule::kPhased, "shared.act"},   {Schedule::kPhased, "shared.down"},    {Schedule::kFused, "fused"},
      {Schedule::kSerial, "shared.down"},
  };
  for (const Target& t : targets) {
    for (bool graph : {false, true}) {
      const std::string at = std::string(t.op) + " under " + std::string(schedule_name(t.schedule)) +
                             (graph ? ", replayed" : ", eager");
      auto dev = rt::make_cpu_device({.num_workers = 2});
      auto failing = std::make_shared<FailingOp>(t.op);
      dev->add_interposer(failing);
      MoeLayer layer(f.config, f.weights, *dev, f.options);
      rt::Stream main = dev->create_stream(rt::kPriorityDefault, "caller");
      rt::StreamGuard guard(main);
      std::vector<float> y(f.x.size(), std::nanf(""));
      LayerGraph g;
      if (graph) g = layer.capture(f.x.data(), kTokens, y.data(), {.schedule = t.schedule});
      auto call = [&] {
        if (graph) {
          layer.replay(g, f.x.data(), kTokens, y.data());
        } else {
          layer.forward(f.x.data(), kTokens, y.data(), {.schedule = t.schedule});
        }
      };
      failing->armed = true;
      call();
      try {
        main.synchronize();  // the caller's stream only
        ADD_FAILURE() << at << ": synchronize() returned normally";
      } catch (const rt::StreamError& e) {
        EXPECT_NE(std::string(e.what()).find("'" + std::string(t.op) + "'"), std::string::npos) << at << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("planted failure"), std::string::npos) << at << ": " << e.what();
      }
      for (float v : y) ASSERT_TRUE(std::isnan(v)) << at << ": y was written after the failure";
      failing->armed = false;
      call();
      EXPECT_NO_THROW(main.synchronize()) << at;
      EXPECT_EQ(std::memcmp(y.data(), serial.data(), y.size() * sizeof(float)), 0) << at << ": the next call";
    }
  }
}

}  // namespace
}  // namespace moe
