// The layer's bitwise contract and its accuracy at real sizes, on the default kernels of the CPU at hand:
// f32, bf16 and fp8 weights at hidden >= 512 (several 128x128 fp8 blocks, and partial ones in both
// dimensions), for a family with a gated shared expert (qwen3_next), a noaux_tc family with expert groups
// (deepseek_v3) and one without a shared expert (qwen3_moe).
//
//   - Every schedule (auto through a tuning table that picks a different schedule per token count) on 1, 2
//     and 4 workers, eager and replayed as a graph, gives the bits of serial on 1 worker, for 1, 3 and 17
//     tokens.
//   - Serial agrees with the fp64 reference within the tolerance of the other layer tests and of
//     `moe-overlap check` (1e-5 of the output scale, grown with sqrt(H / 256) for the longer reductions;
//     1e-2 where the kernels round x to bf16), near-tie tokens skipped and bounded.
//   - The same input gives the same bits again: in the same process (fresh layers, fresh workspaces), and in
//     another process (the binary runs itself as a child that writes its output bytes to a file).
//
// MOE_TEST_SCALE=small (the sanitizer runs): 1 and 5 tokens, 1 and 2 workers.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "check/reference.h"
#include "check/tiny_configs.h"
#include "kernels/linear.h"
#include "layer/moe_layer.h"
#include "layer_test_inputs.h"

extern char** environ;

namespace fs = std::filesystem;

namespace moe {
namespace {

bool small_scale() {
  const char* s = std::getenv("MOE_TEST_SCALE");
  return s != nullptr && std::string(s) == "small";
}

constexpr int64_t kMaxTokens = 17;

// Ascending; the fp64 reference (the slow part under a sanitizer) is computed for the largest.
std::vector<int64_t> token_counts() {
  if (small_scale()) return {1, 5};
  return {1, 3, kMaxTokens};
}

std::vector<int> worker_counts() {
  if (small_scale()) return {1, 2};
  return {1, 2, 4};
}

constexpr Schedule kEverySchedule[] = {Schedule::kSerial, Schedule::kDual, Schedule::kPhased, Schedule::kFused,
                                       Schedule::kAuto};

// auto: phased at 1 token, fused at 2..7, dual from 8 (so 1, 3 and 17 tokens each run another schedule).
TuningTable tuning_table() { return {{{1, Schedule::kPhased}, {2, Schedule::kFused}, {8, Schedule::kDual}}}; }

LayerOptions layer_options() {
  return {.max_tokens = kMaxTokens, .policy = OverlapPolicy::always(), .tuning = tuning_table()};
}

rt::Device& device(int workers) {
  static std::map<int, std::unique_ptr<rt::Device>> devices;
  auto& d = devices[workers];
  if (!d) d = rt::make_cpu_device({.num_workers = workers});
  return *d;
}

// A tiny config's family rules (k, groups, scoring, gate) at real sizes.
MoeConfig real_size(const std::string& name, int64_t hidden, int64_t intermediate, int64_t shared) {
  for (const TinyConfig& tc : tiny_configs()) {
    if (tc.name != name) continue;
    MoeConfig c = tc.config;
    c.hidden = hidden;
    c.moe_intermediate = intermediate;
    c.shared_intermediate = shared;
    return c;
  }
  throw std::logic_error("no tiny config named " + name);
}

struct Family {
  std::string name;
  MoeConfig config;
};

// fp8 blocks (128 x 128): qwen3_next H = 640 (5 blocks), I = 192 (1.5), Is = 320 (2.5); deepseek_v3
// H = 576 (4.5: a partial block along the hidden dimension too), I = Is = 192; qwen3_moe H = 640, I = 192.
const std::vector<Family>& families() {
  static const std::vector<Family> f = {{"qwen3_next", real_size("qwen3_next", 640, 192, 320)},
                                        {"deepseek_v3", real_size("deepseek_v3", 576, 192, 192)},
                                        {"qwen3_moe", real_size("qwen3_moe", 640, 192, 0)}};
  return f;
}

constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF8E4M3};

MoeConfig with_dtype(MoeConfig c, DType dtype) {
  c.fp8 = dtype == DType::kF8E4M3;
  return c;
}

LayerWeights weights_for(const MoeConfig& c, DType dtype) {
  return make_random_weights(c, {.dtype = dtype, .seed = 5});
}

// The first kMaxTokens tokens of one input: a run of t tokens reads the first t of them.
std::vector<float> input_for(const MoeConfig& c) { return random_input(kMaxTokens * c.hidden, 77); }
std::vector<float> first_tokens(const std::vector<float>& x, const MoeConfig& c, int64_t t) {
  return {x.begin(), x.begin() + t * c.hidden};
}

enum class Mode { kEager, kGraph };

std::vector<float> run(MoeLayer& layer, const std::vector<float>& x, int64_t tokens, Schedule s, Mode mode) {
  std::vector<float> y(static_cast<size_t>(tokens * layer.config().hidden), -7.0f);
  if (mode == Mode::kGraph) {
    const LayerGraph g = layer.capture(x.data(), tokens, y.data(), {.schedule = s});
    layer.replay(g, x.data(), tokens, y.data());
  } else {
    layer.forward(x.data(), tokens, y.data(), {.schedule = s});
  }
  rt::current_stream(layer.device()).synchronize();
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Where two outputs first differ, for the failure message (hidden 0: as an index into the floats).
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b, int64_t hidden) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      char buf[160];
      if (hidden > 0) {
        std::snprintf(buf, sizeof buf, "first difference at token %lld column %lld: %.9g vs %.9g",
                      static_cast<long long>(static_cast<int64_t>(i) / hidden),
                      static_cast<long long>(static_cast<int64_t>(i) % hidden), a[i], b[i]);
      } else {
        std::snprintf(buf, sizeof buf, "first difference at float %zu: %.9g vs %.9g", i, a[i], b[i]);
      }
      return buf;
    }
  return "identical";
}

// The tolerance of tests/test_layer.cpp (1e-5 of the output scale at H <= 256) and of `moe-overlap check`,
// which grows it with the reduction length; 1e-2 where the layer's kernels round x to bf16 and 3e-2 where they
// quantize it to int8 (the opt-in avx512bf16 and avx2int8 ones, never the default).
double tolerance(const MoeLayer& layer, const LayerWeights& w) {
  if (quantizes_x_to_int8(layer.options().isa, w.experts[0].gate.dtype)) return 3e-2;
  if (rounds_x_to_bf16(layer.options().isa, w.experts[0].gate.dtype)) return 1e-2;
  return 1e-5 * std::max(1.0, std::sqrt(static_cast<double>(layer.config().hidden) / 256.0));
}

// Compares y (the first `tokens` tokens) with the reference of the same tokens; returns how many tokens were
// skipped for a near tie (margin below 1e-5 but not an exact tie, as in tests/test_layer.cpp).
int64_t expect_close_to_reference(const MoeConfig& c, const std::vector<double>& ref,
                                  const std::vector<ReferenceRoute>& routes, const std::vector<float>& y,
                                  int64_t tokens, double tol, const std::string& what) {
  double scale = 1e-30;
  for (size_t i = 0; i < static_cast<size_t>(tokens * c.hidden); ++i) scale = std::max(scale, std::abs(ref[i]));
  int64_t skipped = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const double m = routes[static_cast<size_t>(t)].margin;
    if (m != 0.0 && m < 1e-5) {
      ++skipped;
      continue;
    }
    double err = 0.0;
    for (int64_t i = 0; i < c.hidden; ++i) {
      const size_t k = static_cast<size_t>(t * c.hidden + i);
      err = std::max(err, std::abs(static_cast<double>(y[k]) - ref[k]));
    }
    EXPECT_LE(err, tol * scale) << what << " token " << t << " (output scale " << scale << ", error "
                                << err / scale << " of it)";
  }
  return skipped;
}

struct Case {
  size_t family;
  DType dtype;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << families()[c.family].name << " " << dtype_name(c.dtype);
}

class LayerConformance : public ::testing::TestWithParam<Case> {
 protected:
  const Family& family() const { return families()[GetParam().family]; }
  DType dtype() const { return GetParam().dtype; }
  MoeConfig config() const { return with_dtype(family().config, dtype()); }
  std::string label() const { return family().name + " " + std::string(dtype_name(dtype())); }
};

// The configurations keep what they are meant to cover, whatever the tiny configs become.
TEST(LayerConformanceSetup, FamiliesCoverTheirRoutingAndSharedExpertVariants) {
  const MoeConfig& next = families()[0].config;
  EXPECT_TRUE(next.has_shared_expert() && next.shared_expert_gate);
  const MoeConfig& v3 = families()[1].config;
  EXPECT_EQ(v3.topk_method, TopkMethod::kNoauxTc);
  EXPECT_GT(v3.n_group, 1);
  EXPECT_TRUE(v3.has_shared_expert() && !v3.shared_expert_gate);
  EXPECT_FALSE(families()[2].config.has_shared_expert());
  for (const Family& f : families()) {
    EXPECT_GE(f.config.hidden, 512) << f.name;
    EXPECT_NO_THROW(with_dtype(f.config, DType::kF8E4M3).validate()) << f.name;
  }
  // Partial fp8 blocks: along the intermediate dimension everywhere, along hidden and the shared width once.
  EXPECT_NE(families()[1].config.hidden % 128, 0);
  EXPECT_NE(families()[0].config.shared_intermediate % 128, 0);
  for (const Family& f : families()) EXPECT_NE(f.config.moe_intermediate % 128, 0) << f.name;
}

// The tuning table really spreads auto over several schedules (what the bitwise test relies on).
TEST(LayerConformanceSetup, AutoFollowsTheTuningTable) {
  const std::map<int64_t, Schedule> expected = {
      {1, Schedule::kPhased}, {3, Schedule::kFused}, {kMaxTokens, Schedule::kDual}};
  for (const Family& f : families()) {
    // One local expert is enough to build the layer (the decision depends on the config alone).
    const LayerWeights w = make_random_weights(f.config, {.dtype = DType::kBF16, .seed = 5, .num_local_experts = 1});
    MoeLayer layer(f.config, w, device(2), layer_options());
    for (const auto& [t, s] : expected) {
      // A model without a shared expert always runs serial (schedule.h).
      const Schedule want = f.config.has_shared_expert() ? s : Schedule::kSerial;
      EXPECT_EQ(layer.effective_schedule({.schedule = Schedule::kAuto}, t).schedule, want) << f.name << " tokens " << t;
    }
  }
}

TEST_P(LayerConformance, EveryScheduleWorkerCountAndModeGivesTheBitsOfSerialOnOneWorker) {
  const MoeConfig c = config();
  const LayerWeights w = weights_for(c, dtype());
  std::vector<std::unique_ptr<MoeLayer>> layers;
  for (int workers : worker_counts())
    layers.push_back(std::make_unique<MoeLayer>(c, w, device(workers), layer_options()));
  ASSERT_EQ(layers[0]->device().num_workers(), 1);

  const std::vector<float> all = input_for(c);
  std::vector<ReferenceRoute> routes;
  const std::vector<double> ref = reference_forward(c, w, all.data(), token_counts().back(), &routes);
  const double tol = tolerance(*layers[0], w);

  for (int64_t t : token_counts()) {
    const std::vector<float> x = first_tokens(all, c, t);
    const std::string at = label() + " tokens " + std::to_string(t);
    const std::vector<float> serial = run(*layers[0], x, t, Schedule::kSerial, Mode::kEager);
    const int64_t skipped = expect_close_to_reference(c, ref, routes, serial, t, tol, at + " serial vs reference");
    // As in tests/test_layer.cpp (at most 2 of 33 tokens): near ties are rare, not the norm.
    EXPECT_LE(skipped, t < 8 ? 1 : 2) << at << ": too many near-tie tokens skipped";

    for (auto& layer : layers)
      for (Schedule s : kEverySchedule)
        for (Mode mode : {Mode::kEager, Mode::kGraph}) {
          const std::vector<float> y = run(*layer, x, t, s, mode);
          const Schedule ran = layer->effective_schedule({.schedule = s}, t).schedule;
          EXPECT_TRUE(same_bits(y, serial))
              << at << " " << schedule_name(s) << " (runs " << schedule_name(ran) << ") "
              << (mode == Mode::kGraph ? "replayed" : "eager") << " on " << layer->device().num_workers()
              << " workers differs from serial on 1 worker: " << first_difference(y, serial, c.hidden);
        }
  }
}

std::vector<Case> every_case() {
  std::vector<Case> v;
  for (size_t f = 0; f < families().size(); ++f)
    for (DType d : kDtypes) v.push_back({f, d});
  return v;
}

INSTANTIATE_TEST_SUITE_P(RealSizes, LayerConformance, ::testing::ValuesIn(every_case()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return families()[p.param.family].name + "_" + std::string(dtype_name(p.param.dtype));
                         });

// ---- the same bits again ----------------------------------------------------------------------------------

// Set in the child: the file it writes its output bytes to.
constexpr const char* kChildOutputVar = "MOE_CONFORMANCE_CHILD_OUTPUT";

// Every family, each with another weight dtype, at the largest token count: serial on 1 worker, dual on 2 and
// fused on 4, each on a fresh layer. With `again`, the same once more on fresh layers whose workspaces first served
// another input.
std::vector<float> outputs_to_compare(std::vector<float>* again = nullptr) {
  const std::pair<int, Schedule> runs[] = {{1, Schedule::kSerial}, {2, Schedule::kDual}, {4, Schedule::kFused}};
  const DType dtypes[] = {DType::kBF16, DType::kF8E4M3, DType::kF32};  // per family
  const int64_t t = token_counts().back();
  std::vector<float> all;
  for (size_t i = 0; i < families().size(); ++i) {
    const DType d = dtypes[i % std::size(dtypes)];
    const MoeConfig c = with_dtype(families()[i].config, d);
    const LayerWeights w = weights_for(c, d);
    const std::vector<float> x = input_for(c);
    for (auto [workers, s] : runs) {
      MoeLayer layer(c, w, device(workers), layer_options());
      const std::vector<float> y = run(layer, first_tokens(x, c, t), t, s, Mode::kEager);
      all.insert(all.end(), y.begin(), y.end());
    }
    if (again == nullptr) continue;
    for (auto [workers, s] : runs) {
      MoeLayer layer(c, w, device(workers), layer_options());
      run(layer, random_input(t * c.hidden, 78), t, s, Mode::kEager);
      const std::vector<float> y = run(layer, first_tokens(x, c, t), t, s, Mode::kEager);
      again->insert(again->end(), y.begin(), y.end());
    }
  }
  return all;
}

// Runs this test binary again, filtered to `test`, with kChildOutputVar set; returns its exit status.
int run_child(const std::string& test, const std::string& output, const std::string& log) {
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  const std::string filter = "--gtest_filter=" + test;
  std::vector<std::string> env;
  const std::string prefix = std::string(kChildOutputVar) + "=";
  // Not the parent's gtest settings either (an XML output file, sharding): the child runs the one test.
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0 && std::strncmp(*e, "GTEST_", 6) != 0)
      env.emplace_back(*e);
  env.push_back(prefix + output);
  std::vector<char*> envp;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<char*> argv = {const_cast<char*>(exe.c_str()), const_cast<char*>(filter.c_str()), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The same input gives the same bits again: in this process, on fresh layers (workspaces at other addresses,
// holding what another input left), and in another process (other addresses for every buffer, other
// thread timings; the binary runs itself as the child).
TEST(LayerConformanceRepeat, TheSameInputGivesTheSameBitsInThisProcessAndInAnother) {
  if (const char* out = std::getenv(kChildOutputVar)) {  // the child: write and stop
    const std::vector<float> y = outputs_to_compare();
    std::ofstream f(out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(y.data()), static_cast<std::streamsize>(y.size() * sizeof(float)));
    ASSERT_TRUE(f.good()) << "cannot write " << out;
    return;
  }
  std::vector<float> again;
  const std::vector<float> y = outputs_to_compare(&again);
  EXPECT_TRUE(same_bits(again, y)) << "a second run in this process differs: " << first_difference(again, y, 0)
                                   << " of the concatenated outputs";

  struct TempDir {
    fs::path path = fs::temp_directory_path() / ("moe-conformance-" + std::to_string(getpid()));
    TempDir() { fs::create_directories(path); }
    ~TempDir() { fs::remove_all(path); }
  } temp;
  const fs::path& dir = temp.path;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = std::string(info->test_suite_name()) + "." + info->name();
  const std::string output = (dir / "y.bin").string(), log = (dir / "child.log").string();
  const int status = run_child(test, output, log);
  ASSERT_EQ(status, 0) << "the child process failed; its output:\n" << read_file(log);
  const std::string theirs = read_file(output);
  ASSERT_EQ(theirs.size(), y.size() * sizeof(float));
  std::vector<float> other(y.size());
  std::memcpy(other.data(), theirs.data(), theirs.size());
  EXPECT_TRUE(same_bits(other, y)) << "the child process computed other bits: " << first_difference(y, other, 0)
                                   << " of the concatenated outputs";
}

}  // namespace
}  // namespace moe
