// The layer's schedules as the runtime sees them: traces of dual and phased forwards show the shared expert
// running while routed-path operations run, and the fork/join ordering edges; policies and
// effective_schedule; validation of configs, weights and forward() arguments; back-to-back calls.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <vector>

#include "layer/moe_layer.h"
#include "layer_test_inputs.h"
#include "check/tiny_configs.h"

namespace moe {
namespace {

MoeConfig tiny(const std::string& name) {
  for (const TinyConfig& t : tiny_configs())
    if (t.name == name) return t.config;
  throw std::runtime_error("no tiny config " + name);
}

LayerOptions always(int64_t max_tokens = 64) { return {.max_tokens = max_tokens, .policy = OverlapPolicy::always()}; }

// Large enough that the expert and shared-expert ops take several milliseconds each: on a loaded machine a
// sleeping worker can take over a millisecond to wake, and only two running workers can show overlap.
MoeConfig trace_config() {
  MoeConfig c = family_defaults("qwen2_moe");
  c.hidden = 1024;
  c.moe_intermediate = 512;
  c.num_experts = 4;
  c.top_k = 2;
  c.shared_intermediate = 2048;
  return c;
}

const std::set<std::string> kRouted = {"router", "topk", "dispatch", "experts", "combine"};
const std::set<std::string> kShared = {"shared_gate", "shared.gate_up", "shared.act", "shared.down"};

const rt::OpRecord& find(const rt::Trace& t, const std::string& name) {
  for (const rt::OpRecord& r : t.ops)
    if (r.name == name) return r;
  throw std::runtime_error("op " + name + " not in the trace");
}

bool overlapped(const rt::Trace& t) {
  for (const rt::OpRecord& s : t.ops)
    if (kShared.count(s.name))
      for (const rt::OpRecord& r : t.ops)
        if (kRouted.count(r.name) && s.start_ns < r.end_ns && r.start_ns < s.end_ns) return true;
  return false;
}

rt::Trace traced_forward(MoeLayer& layer, rt::Device& dev, const std::vector<float>& x, int64_t tokens,
                         std::vector<float>& y, Schedule s) {
  dev.set_tracing(true);
  layer.forward(x.data(), tokens, y.data(), {.schedule = s, .check_input = true});
  rt::current_stream(dev).synchronize();
  dev.set_tracing(false);
  return dev.take_trace();
}

void expect_before(const rt::Trace& t, const std::string& first, const std::string& second) {
  EXPECT_LE(find(t, first).end_ns, find(t, second).start_ns) << first << " must end before " << second << " starts";
}

TEST(Schedule, TraceShowsSharedExpertOverlappingRoutedPathAndItsOrderingEdges) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  const MoeConfig c = trace_config();
  const LayerWeights w = make_random_weights(c, {.dtype = DType::kF32, .seed = 1});
  MoeLayer layer(c, w, *dev, always());
  const int64_t tokens = 64;
  const auto x = random_input(tokens * c.hidden, 3);
  std::vector<float> y(x.size());
  const int main_id = dev->default_stream().id(), side_id = layer.side_stream().id();
  for (Schedule s : {Schedule::kDual, Schedule::kPhased}) {
    SCOPED_TRACE(std::string(schedule_name(s)));
    // Overlap depends on the OS running both workers at once: up to 10 attempts, at least one must show it.
    bool seen = false;
    int attempts = 0;
    for (; attempts < 10 && !seen; ++attempts) {
      const rt::Trace t = traced_forward(layer, *dev, x, tokens, y, s);
      seen = overlapped(t);
      for (const rt::OpRecord& r : t.ops) EXPECT_EQ(r.stream_id, kShared.count(r.name) ? side_id : main_id) << r.name;
      // Ordering edges, from the recorded times.
      for (const std::string& name : kShared) {
        expect_before(t, "check_input", name);  // the fork: x is ready
        expect_before(t, name, "sum");          // the join
      }
      if (s == Schedule::kPhased) {
        expect_before(t, "router", "shared_gate");
        expect_before(t, "router", "shared.gate_up");
        expect_before(t, "dispatch", "shared.act");
        expect_before(t, "experts", "shared.down");
      }
      int forks = 0, joins = 0;
      for (const rt::EdgeRecord& e : t.edges) {
        forks += e.from_stream == main_id && e.to_stream == side_id;
        joins += e.from_stream == side_id && e.to_stream == main_id;
      }
      EXPECT_EQ(forks, s == Schedule::kDual ? 1 : 3);
      EXPECT_EQ(joins, 1);
    }
    EXPECT_TRUE(seen) << "no shared-expert op ran concurrently with a routed-path op in " << attempts << " forwards";
  }
}

TEST(Schedule, SerialRunsEverythingOnTheCallersStream) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  const MoeConfig c = tiny("deepseek_v3");
  const LayerWeights w = make_random_weights(c, {.seed = 2});
  MoeLayer layer(c, w, *dev, always());
  rt::Stream mine = dev->create_stream(rt::kPriorityDefault, "caller");
  const auto x = random_input(8 * c.hidden, 4);
  std::vector<float> y(x.size());
  dev->set_tracing(true);
  {
    rt::StreamGuard guard(mine);
    layer.forward(x.data(), 8, y.data(), {.schedule = Schedule::kSerial});
  }
  mine.synchronize();
  dev->set_tracing(false);
  const rt::Trace t = dev->take_trace();
  std::set<std::string> names;
  for (const rt::OpRecord& r : t.ops) {
    EXPECT_EQ(r.stream_id, mine.id()) << r.name;
    names.insert(r.name);
  }
  const std::set<std::string> expected = {"router", "topk", "dispatch", "experts", "combine",
                                          "shared.gate_up", "shared.act", "shared.down", "sum"};
  EXPECT_EQ(names, expected);  // deepseek: no shared_gate
}

// fused: the shared expert's tiles join the routed experts' operation; 6 operations, all on the caller's
// stream, the same bits as serial.
TEST(Schedule, FusedFoldsTheSharedExpertIntoTheRoutedOp) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  for (const std::string name : {"qwen2_moe", "deepseek_v3"}) {
    const MoeConfig c = tiny(name);
    const LayerWeights w = make_random_weights(c, {.seed = 5});
    MoeLayer layer(c, w, *dev, always());
    const auto x = random_input(12 * c.hidden, 6);
    std::vector<float> serial(x.size()), fused(x.size());
    layer.forward(x.data(), 12, serial.data(), {.schedule = Schedule::kSerial});
    dev->default_stream().synchronize();
    dev->set_tracing(true);
    layer.forward(x.data(), 12, fused.data(), {.schedule = Schedule::kFused});
    dev->default_stream().synchronize();
    dev->set_tracing(false);
    const rt::Trace t = dev->take_trace();
    std::vector<std::string> names;
    for (const rt::OpRecord& r : t.ops) {
      EXPECT_EQ(r.stream_id, dev->default_stream().id()) << name << " " << r.name;
      names.push_back(r.name);
    }
    const std::vector<std::string> expected = {"router", "topk", "dispatch", "fused", "combine", "sum"};
    EXPECT_EQ(names, expected) << name;
    EXPECT_TRUE(t.edges.empty()) << name << ": no cross-stream edge";
    EXPECT_EQ(std::memcmp(fused.data(), serial.data(), x.size() * 4), 0) << name;
  }
}

TEST(Schedule, OneProcessWideSideStreamForEveryLayer) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  const MoeConfig c = tiny("qwen2_moe");
  const LayerWeights w = make_random_weights(c, {.seed = 3});
  MoeLayer a(c, w, *dev, always()), b(c, w, *dev, always());
  EXPECT_TRUE(a.side_stream() == dev->stream_for("11"));
  EXPECT_TRUE(b.side_stream() == a.side_stream());
  const MoeConfig none = tiny("qwen3_moe");
  const LayerWeights wn = make_random_weights(none, {.seed = 3});
  EXPECT_FALSE(MoeLayer(none, wn, *dev, always()).side_stream());
}

// Calls enqueued back to back (no host synchronisation in between) with changing schedules reuse the
// workspaces safely: each output equals the serial output of its own input.
TEST(Schedule, BackToBackCallsWithMixedSchedules) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  for (const std::string name : {"qwen3_next", "deepseek_v3"}) {
    const MoeConfig c = tiny(name);
    const LayerWeights w = make_random_weights(c, {.seed = 4});
    MoeLayer layer(c, w, *dev, always());
    const Schedule order[] = {Schedule::kDual, Schedule::kPhased, Schedule::kFused, Schedule::kSerial,
                              Schedule::kPhased, Schedule::kFused, Schedule::kDual, Schedule::kDual};
    const int64_t tokens = 24;
    std::vector<std::vector<float>> xs, ys;
    for (size_t i = 0; i < std::size(order); ++i) {
      xs.push_back(random_input(tokens * c.hidden, 50 + i));
      ys.emplace_back(xs.back().size());
    }
    for (size_t i = 0; i < std::size(order); ++i)
      layer.forward(xs[i].data(), tokens, ys[i].data(), {.schedule = order[i]});
    dev->default_stream().synchronize();
    for (size_t i = 0; i < std::size(order); ++i) {
      std::vector<float> ref(xs[i].size());
      layer.forward(xs[i].data(), tokens, ref.data(), {.schedule = Schedule::kSerial});
      dev->default_stream().synchronize();
      EXPECT_EQ(std::memcmp(ref.data(), ys[i].data(), ref.size() * 4), 0) << name << " call " << i;
    }
  }
}

TEST(Policy, EffectiveSchedule) {
  const MoeConfig c = tiny("qwen2_moe");
  OverlapPolicy p{.multi_stream = true, .decode_only = true, .token_threshold = 64};
  EXPECT_EQ(decide_schedule(c, p, Schedule::kDual, 64, false).schedule, Schedule::kDual);
  EXPECT_EQ(decide_schedule(c, p, Schedule::kPhased, 1, false).schedule, Schedule::kPhased);
  const ScheduleDecision big = decide_schedule(c, p, Schedule::kDual, 65, false);
  EXPECT_EQ(big.schedule, Schedule::kSerial);
  EXPECT_NE(big.reason.find("threshold"), std::string::npos) << big.reason;
  const ScheduleDecision prefill = decide_schedule(c, p, Schedule::kDual, 4, true);
  EXPECT_EQ(prefill.schedule, Schedule::kSerial);
  EXPECT_NE(prefill.reason.find("prefill"), std::string::npos);
  p.decode_only = false;
  EXPECT_EQ(decide_schedule(c, p, Schedule::kDual, 4, true).schedule, Schedule::kDual);
  p.multi_stream = false;
  EXPECT_NE(decide_schedule(c, p, Schedule::kDual, 4, false).reason.find("MOE_OVERLAP_MULTI_STREAM"),
            std::string::npos);
  const ScheduleDecision none = decide_schedule(tiny("qwen3_moe"), OverlapPolicy::always(), Schedule::kPhased, 4, false);
  EXPECT_EQ(none.schedule, Schedule::kSerial);
  EXPECT_NE(none.reason.find("no shared expert"), std::string::npos);
  // fused runs on one stream: the overlap policies leave it alone; without a shared expert it is serial.
  const OverlapPolicy off{.multi_stream = false, .decode_only = true, .token_threshold = 64};
  EXPECT_EQ(decide_schedule(c, off, Schedule::kFused, 1000, true).schedule, Schedule::kFused);
  EXPECT_EQ(decide_schedule(tiny("qwen3_moe"), off, Schedule::kFused, 4, false).schedule, Schedule::kSerial);
  EXPECT_EQ(decide_schedule(c, OverlapPolicy::always(), Schedule::kSerial, 4, false).reason, "");
}

TEST(Policy, LayerAppliesPolicyPerCall) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  const MoeConfig c = tiny("glm4_moe");
  const LayerWeights w = make_random_weights(c, {.seed = 5});
  MoeLayer layer(c, w, *dev, {.max_tokens = 64, .policy = {.multi_stream = true, .decode_only = true, .token_threshold = 16}});
  EXPECT_EQ(layer.effective_schedule({.schedule = Schedule::kDual}, 16).schedule, Schedule::kDual);
  EXPECT_EQ(layer.effective_schedule({.schedule = Schedule::kDual}, 17).schedule, Schedule::kSerial);
  EXPECT_EQ(layer.effective_schedule({.schedule = Schedule::kDual, .prefill = true}, 2).schedule, Schedule::kSerial);
  // A call over the threshold runs on one stream: nothing on the side stream.
  const auto x = random_input(32 * c.hidden, 6);
  std::vector<float> y(x.size());
  dev->set_tracing(true);
  layer.forward(x.data(), 32, y.data(), {.schedule = Schedule::kPhased});
  dev->default_stream().synchronize();
  dev->set_tracing(false);
  for (const rt::OpRecord& r : dev->take_trace().ops) EXPECT_EQ(r.stream_id, dev->default_stream().id()) << r.name;
}

TEST(Policy, EnvironmentDefaults) {
  ::setenv("MOE_OVERLAP_MULTI_STREAM", "0", 1);
  ::setenv("MOE_OVERLAP_DECODE_ONLY", "0", 1);
  ::setenv("MOE_OVERLAP_TOKEN_THRESHOLD", "8", 1);
  OverlapPolicy p = OverlapPolicy::from_env();
  EXPECT_FALSE(p.multi_stream);
  EXPECT_FALSE(p.decode_only);
  EXPECT_EQ(p.token_threshold, 8);
  ::setenv("MOE_OVERLAP_MULTI_STREAM", "yes", 1);
  try {
    OverlapPolicy::from_env();
    ADD_FAILURE() << "a malformed MOE_OVERLAP_MULTI_STREAM must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MOE_OVERLAP_MULTI_STREAM"), std::string::npos) << e.what();
  }
  ::unsetenv("MOE_OVERLAP_MULTI_STREAM");
  ::unsetenv("MOE_OVERLAP_DECODE_ONLY");
  ::unsetenv("MOE_OVERLAP_TOKEN_THRESHOLD");
  p = OverlapPolicy::from_env();
  EXPECT_TRUE(p.multi_stream);
  EXPECT_TRUE(p.decode_only);
  EXPECT_EQ(p.token_threshold, 256);
}

// `auto` takes the tuning table's schedule for the call's token count, then the policies apply; without a
// table it runs serial and says why. Whatever it picks, the output is serial's, bit for bit.
TEST(Policy, AutoFollowsTheTuningTable) {
  const TuningTable t{{{1, Schedule::kDual}, {8, Schedule::kPhased}, {64, Schedule::kSerial}}};
  EXPECT_EQ(t.pick(0), Schedule::kDual);  // below every entry: the first one
  EXPECT_EQ(t.pick(7), Schedule::kDual);
  EXPECT_EQ(t.pick(8), Schedule::kPhased);
  EXPECT_EQ(t.pick(63), Schedule::kPhased);
  EXPECT_EQ(t.pick(1000), Schedule::kSerial);
  EXPECT_EQ(TuningTable{}.pick(5), Schedule::kSerial);

  const MoeConfig c = tiny("glm4_moe");
  const ScheduleDecision d = decide_schedule(c, OverlapPolicy::always(), Schedule::kAuto, 4, false, &t);
  EXPECT_EQ(d.schedule, Schedule::kDual);
  EXPECT_NE(d.reason.find("auto: dual"), std::string::npos) << d.reason;
  const ScheduleDecision none = decide_schedule(c, OverlapPolicy::always(), Schedule::kAuto, 4, false, nullptr);
  EXPECT_EQ(none.schedule, Schedule::kSerial);
  EXPECT_NE(none.reason.find("tuning table"), std::string::npos) << none.reason;
  const OverlapPolicy small{.multi_stream = true, .decode_only = true, .token_threshold = 16};
  const ScheduleDecision capped = decide_schedule(c, small, Schedule::kAuto, 32, false, &t);
  EXPECT_EQ(capped.schedule, Schedule::kSerial);
  EXPECT_NE(capped.reason.find("auto: phased"), std::string::npos) << capped.reason;
  EXPECT_NE(capped.reason.find("token threshold"), std::string::npos) << capped.reason;

  auto dev = rt::make_cpu_device({.num_workers = 2});
  const LayerWeights w = make_random_weights(c, {.seed = 8});
  MoeLayer tuned(c, w, *dev, {.max_tokens = 64, .policy = OverlapPolicy::always(), .tuning = t});
  for (int64_t tokens : {1, 8, 64}) {
    EXPECT_EQ(tuned.effective_schedule({.schedule = Schedule::kAuto}, tokens).schedule, t.pick(tokens)) << tokens;
    const auto x = random_input(tokens * c.hidden, 40 + static_cast<uint64_t>(tokens));
    std::vector<float> serial(x.size()), chosen(x.size());
    tuned.forward(x.data(), tokens, serial.data(), {.schedule = Schedule::kSerial});
    tuned.forward(x.data(), tokens, chosen.data(), {.schedule = Schedule::kAuto});
    dev->default_stream().synchronize();
    EXPECT_EQ(0, std::memcmp(serial.data(), chosen.data(), serial.size() * sizeof(float))) << tokens;
  }
}

TEST(Policy, MalformedTuningTablesAreRejectedNamingTheEntry) {
  const TuningTable repeated{{{8, Schedule::kDual}, {8, Schedule::kPhased}}};
  try {
    repeated.validate();
    ADD_FAILURE() << "repeated token counts must be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("entry 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW((TuningTable{{{1, Schedule::kAuto}}}.validate()), std::invalid_argument);
  auto dev = rt::make_cpu_device({.num_workers = 1});
  const MoeConfig c = tiny("glm4_moe");
  const LayerWeights w = make_random_weights(c, {.seed = 9});
  EXPECT_THROW(MoeLayer(c, w, *dev, {.max_tokens = 8, .tuning = repeated}), std::invalid_argument);
}

TEST(Policy, ScheduleNames) {
  for (Schedule s : kRunnableSchedules) EXPECT_EQ(parse_schedule(schedule_name(s)), s);
  EXPECT_EQ(parse_schedule("auto"), Schedule::kAuto);
  EXPECT_THROW(parse_schedule("fused2"), std::invalid_argument);
}

void expect_config_error(const MoeConfig& c, const LayerWeights& w, const std::string& named) {
  auto dev = rt::make_cpu_device({.num_workers = 1});
  try {
    MoeLayer layer(c, w, *dev, always());
    ADD_FAILURE() << "expected a ConfigError naming " << named;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
  }
}

TEST(Validation, BadConfigsAndWeightsAreRejectedNamingTheField) {
  const MoeConfig c = tiny("deepseek_v3");
  const LayerWeights w = make_random_weights(c, {.seed = 7});
  MoeConfig k = c;
  k.top_k = c.num_experts + 1;
  expect_config_error(k, w, "num_experts_per_tok");
  MoeConfig g = c;
  g.n_group = 3;
  expect_config_error(g, w, "n_group");
  MoeConfig tg = c;
  tg.topk_group = c.n_group + 1;
  expect_config_error(tg, w, "topk_group");
  MoeConfig wider = c;
  wider.hidden = c.hidden * 2;
  expect_config_error(wider, w, "mlp.gate.weight");
  LayerWeights bad_down = make_random_weights(c, {.seed = 7});
  bad_down.experts[1].down.rows -= 1;
  expect_config_error(c, bad_down, "mlp.experts.1.down_proj");
  LayerWeights no_bias = make_random_weights(c, {.seed = 7});
  no_bias.correction_bias = nullptr;
  expect_config_error(c, no_bias, "e_score_correction_bias");
  const MoeConfig q = tiny("qwen2_moe");
  LayerWeights no_gate = make_random_weights(q, {.seed = 7});
  no_gate.shared_gate = WeightView{};
  expect_config_error(q, no_gate, "mlp.shared_expert_gate.weight");
}

TEST(Validation, ForwardArguments) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  const MoeConfig c = tiny("qwen3_next");
  const LayerWeights w = make_random_weights(c, {.seed = 8});
  MoeLayer layer(c, w, *dev, always(16));
  auto x = random_input(17 * c.hidden, 9);
  std::vector<float> y(x.size());
  try {
    layer.forward(x.data(), 17, y.data());
    ADD_FAILURE() << "17 tokens > max_tokens 16 must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("max_tokens=16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(layer.forward(x.data(), -1, y.data()), std::invalid_argument);
  EXPECT_THROW(layer.forward(x.data(), 4, x.data()), std::invalid_argument);  // y aliases x

  // A NaN in x: check_input fails the stream naming the token and the column; the stream recovers.
  x[static_cast<size_t>(5 * c.hidden + 7)] = std::numeric_limits<float>::quiet_NaN();
  for (Schedule s : kRunnableSchedules) {
    layer.forward(x.data(), 16, y.data(), {.schedule = s, .check_input = true});
    try {
      dev->default_stream().synchronize();
      ADD_FAILURE() << "expected the NaN to be reported";
    } catch (const rt::StreamError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("token 5, column 7"), std::string::npos) << what;
      EXPECT_NE(what.find("check_input"), std::string::npos) << what;
    }
    dev->synchronize();
  }
  x[static_cast<size_t>(5 * c.hidden + 7)] = 0.5f;
  layer.forward(x.data(), 16, y.data(), {.schedule = Schedule::kDual, .check_input = true});
  EXPECT_NO_THROW(dev->default_stream().synchronize());
  for (float v : y) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace moe
