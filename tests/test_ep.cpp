// Expert parallelism over MPI, run by ctest under mpirun with 2, 3 and 4 ranks (tests/CMakeLists.txt):
//   - every rank's output equals the one-process output for its tokens, bitwise: families with and without a
//     (gated) shared expert, f32/bf16/fp8, serial/dual/phased/fused, both exchange modes, eager and graph
//     replay, 0/1/2/7/64 tokens per rank, and uneven routing (a rank that receives nothing, every pair to one
//     rank's experts);
//   - the sanitizer and the schedule fuzzer pass with the exchanges in the schedule;
//   - ranks that disagree fail at construction, naming what differs;
//   - `--ep-fault stall`: a rank that stops answering makes the others fail with one line naming it, within
//     the timeout (EpFaults.*, run on its own).
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check/tiny_configs.h"
#include "ep/mpi_communicator.h"
#include "layer/moe_layer.h"
#include "layer_test_inputs.h"
#include "runtime/sanitizer.h"
#include "runtime/schedule_fuzz.h"

namespace moe {
namespace {

ep::Communicator* g_comm = nullptr;
std::string g_fault;  // --ep-fault

constexpr int64_t kMaxTokens = 64;

MoeConfig family(const std::string& name) {
  for (const TinyConfig& t : tiny_configs())
    if (t.name == name) return t.config;
  throw std::logic_error("no tiny config " + name);
}

// Rank r's tokens: rows [r * t, (r + 1) * t) of one seeded input of every rank's rows.
std::vector<float> all_tokens(const MoeConfig& c, int64_t t, uint64_t seed) {
  return random_input(t * g_comm->size() * c.hidden, seed);
}

// The one-process output of every rank's tokens (full weights, one device).
std::vector<float> one_process(const MoeConfig& c, const LayerWeights& full, const std::vector<float>& x, int64_t rows) {
  auto dev = rt::make_cpu_device({.num_workers = 1});
  MoeLayer layer(c, full, *dev, {.max_tokens = std::max<int64_t>(rows, 1), .policy = OverlapPolicy::always()});
  std::vector<float> y(x.size());
  layer.forward(x.data(), rows, y.data(), {.schedule = Schedule::kSerial});
  dev->synchronize();
  return y;
}

LayerWeights share(const MoeConfig& c, DType dtype, uint64_t seed) {
  const int n = g_comm->size(), r = g_comm->rank();
  const int64_t first = ep::first_expert(c.num_experts, n, r);
  return make_random_weights(c, {.dtype = dtype,
                                 .seed = seed,
                                 .num_local_experts = ep::first_expert(c.num_experts, n, r + 1) - first,
                                 .first_expert = first});
}

struct EpCase {
  std::string family;
  DType dtype;
};

// Every (schedule, mode, eager/graph, tokens per rank) against the one-process rows of this rank.
int check_case(const EpCase& k, const std::vector<int64_t>& token_counts, rt::Device& dev) {
  MoeConfig c = family(k.family);
  c.fp8 = k.dtype == DType::kF8E4M3;
  const LayerWeights full = make_random_weights(c, {.dtype = k.dtype, .seed = 3});
  const LayerWeights mine = share(c, k.dtype, 3);
  const int r = g_comm->rank();
  int checked = 0;
  for (ep::ExchangeMode mode : {ep::ExchangeMode::kNormal, ep::ExchangeMode::kLowLatency}) {
    MoeLayer layer(c, mine, dev,
                   {.max_tokens = kMaxTokens, .policy = OverlapPolicy::always(), .comm = g_comm, .ep_mode = mode});
    for (int64_t t : token_counts) {
      const std::vector<float> x = all_tokens(c, t, 100 + static_cast<uint64_t>(t));
      const std::vector<float> want = one_process(c, full, x, t * g_comm->size());
      const std::vector<float> xr(x.begin() + r * t * c.hidden, x.begin() + (r + 1) * t * c.hidden);
      const std::vector<float> wr(want.begin() + r * t * c.hidden, want.begin() + (r + 1) * t * c.hidden);
      for (Schedule s : kRunnableSchedules) {
        if (!c.has_shared_expert() && s != Schedule::kSerial) continue;
        for (bool graph : {false, true}) {
          std::vector<float> y(xr.size(), -7.0f);
          if (graph) {
            LayerGraph g = layer.capture(xr.data(), t, y.data(), {.schedule = s});
            layer.replay(g, xr.data(), t, y.data());
            layer.replay(g, xr.data(), t, y.data());
          } else {
            layer.forward(xr.data(), t, y.data(), {.schedule = s});
          }
          dev.synchronize();
          EXPECT_EQ(std::memcmp(y.data(), wr.data(), y.size() * sizeof(float)), 0)
              << k.family << " " << dtype_name(k.dtype) << " " << ep::exchange_mode_name(mode) << " "
              << schedule_name(s) << (graph ? " graph" : " eager") << " " << t << " tokens per rank, rank " << r;
          ++checked;
        }
      }
    }
  }
  return checked;
}

TEST(Ep, EveryRankEqualsOneProcessBitwise) {
  auto dev = rt::make_cpu_device({.num_workers = 2, .spin_us = 0});
  int checked = 0;
  for (const char* f : {"qwen3_next", "deepseek_v3", "qwen3_moe"})
    for (DType d : {DType::kF32, DType::kBF16, DType::kF8E4M3})
      checked += check_case({f, d}, {0, 1, 2, 7, 64}, *dev);
  EXPECT_GT(checked, 400);
}

// Router rows so that every token picks the same experts: all pairs go to one rank; the others receive
// nothing and still take part in both exchanges.
TEST(Ep, UnevenRoutingEveryPairToOneRank) {
  auto dev = rt::make_cpu_device({.num_workers = 2, .spin_us = 0});
  for (const char* f : {"qwen3_next", "deepseek_v3"}) {
    MoeConfig c = family(f);
    LayerWeights full = make_random_weights(c, {.dtype = DType::kF32, .seed = 4});
    LayerWeights mine = share(c, DType::kF32, 4);
    // The router (replicated, f32): row e is 1 for the last rank's experts, 0 elsewhere; x > 0.
    const int64_t hot = ep::first_expert(c.num_experts, g_comm->size(), g_comm->size() - 1);
    for (LayerWeights* w : {&full, &mine}) {
      auto* router = static_cast<float*>(const_cast<void*>(w->router.data));  // the test owns these bytes
      for (int64_t e = 0; e < c.num_experts; ++e)
        for (int64_t j = 0; j < c.hidden; ++j) router[e * c.hidden + j] = e >= hot ? 1.0f + 0.01f * static_cast<float>(e) : 0.0f;
      if (w->correction_bias != nullptr) std::memset(const_cast<float*>(w->correction_bias), 0, c.num_experts * 4);
    }
    for (ep::ExchangeMode mode : {ep::ExchangeMode::kNormal, ep::ExchangeMode::kLowLatency}) {
      MoeLayer layer(c, mine, *dev, {.max_tokens = kMaxTokens, .policy = OverlapPolicy::always(), .comm = g_comm, .ep_mode = mode});
      const int64_t t = 9;
      std::vector<float> x = all_tokens(c, t, 7);
      for (float& v : x) v = 0.5f + 0.5f * std::abs(v);
      const std::vector<float> want = one_process(c, full, x, t * g_comm->size());
      const int r = g_comm->rank();
      const std::vector<float> xr(x.begin() + r * t * c.hidden, x.begin() + (r + 1) * t * c.hidden);
      for (Schedule s : {Schedule::kSerial, Schedule::kDual, Schedule::kPhased}) {
        std::vector<float> y(xr.size());
        layer.forward(xr.data(), t, y.data(), {.schedule = s});
        dev->synchronize();
        EXPECT_EQ(std::memcmp(y.data(), want.data() + r * t * c.hidden, y.size() * sizeof(float)), 0)
            << f << " " << schedule_name(s) << " " << ep::exchange_mode_name(mode) << " rank " << r;
      }
    }
  }
}

// The exchanges are operations like any other: the sanitizer sees their declared buffers, and the fuzzer's
// orders, delays and poisoned workspaces leave every rank's output unchanged.
TEST(Ep, SanitizerAndFuzzerPassWithTheExchanges) {
  MoeConfig c = family("qwen3_next");
  const LayerWeights mine = share(c, DType::kBF16, 5);
  const int64_t t = 5;
  const std::vector<float> x = all_tokens(c, t, 11);
  const int r = g_comm->rank();
  const std::vector<float> xr(x.begin() + r * t * c.hidden, x.begin() + (r + 1) * t * c.hidden);
  for (Schedule s : {Schedule::kDual, Schedule::kPhased, Schedule::kFused}) {
    const rt::FuzzOutcome out = rt::run_fuzzed(
        [&](rt::Device& dev) {
          MoeLayer layer(c, mine, dev, {.max_tokens = 8, .policy = OverlapPolicy::always(), .comm = g_comm});
          std::vector<float> y(xr.size());
          for (int call = 0; call < 2; ++call) layer.forward(xr.data(), t, y.data(), {.schedule = s});
          dev.synchronize();
          return rt::bytes_of(y);
        },
        {.num_delay_runs = 1, .max_delay_us = 20});
    EXPECT_TRUE(out.ok()) << schedule_name(s) << " rank " << r << ": " << out.summary();
  }
}

TEST(Ep, RanksThatDisagreeFailAtConstructionNamingWhat) {
  auto dev = rt::make_cpu_device({.num_workers = 1});
  MoeConfig c = family("qwen3_next");
  const LayerWeights mine = share(c, DType::kBF16, 6);
  // Rank 0 asks for another exchange mode than the others.
  const ep::ExchangeMode mode = g_comm->rank() == 0 ? ep::ExchangeMode::kNormal : ep::ExchangeMode::kLowLatency;
  try {
    MoeLayer layer(c, mine, *dev, {.max_tokens = 8, .comm = g_comm, .ep_mode = mode});
    ADD_FAILURE() << "no error on rank " << g_comm->rank();
  } catch (const ep::ExchangeError& e) {
    EXPECT_NE(std::string(e.what()).find("disagree on exchange mode (rank 0: normal, rank 1: low-latency"),
              std::string::npos)
        << e.what();
  }
  // A rank whose weights hold another range than its share.
  const LayerWeights all = make_random_weights(c, {.dtype = DType::kBF16, .seed = 6});
  EXPECT_THROW(MoeLayer(c, all, *dev, {.max_tokens = 8, .comm = g_comm}), ConfigError);
}

// ---- failures (run on their own: `--ep-fault stall`) ---------------------------------------------------

// Rank 1 stops answering inside its first dispatch: its worker sleeps in the poll, then the process leaves
// ("stall"), or it is killed there ("kill": mpirun then ends the job, naming the rank).
class FaultOnRankOne : public rt::Interposer {
 public:
  void before_launch(const rt::Stream&, rt::Op& op) override {
    if (op.name != "ep.dispatch") return;
    op.poll = []() -> bool {
      if (g_fault == "kill") raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::seconds(4));
      _exit(0);  // its peers have failed and checked their message by now
    };
  }
};

// Run by tests/ep_fault.sh, which checks what the job printed: each surviving rank prints one verdict line.
TEST(EpFaults, ADeadOrStalledRankFailsTheOthersNamingItWithinTheTimeout) {
  if (g_fault.empty()) GTEST_SKIP() << "run with --ep-fault stall|kill (tests/ep_fault.sh)";
  auto dev = rt::make_cpu_device({.num_workers = 2, .spin_us = 0});
  if (g_comm->rank() == 1) dev->add_interposer(std::make_shared<FaultOnRankOne>());
  MoeConfig c = family("qwen3_next");
  const LayerWeights mine = share(c, DType::kBF16, 8);
  MoeLayer layer(c, mine, *dev, {.max_tokens = 8, .policy = OverlapPolicy::always(), .comm = g_comm});
  const std::vector<float> x = random_input(4 * c.hidden, 9);
  std::vector<float> y(x.size());
  const auto t0 = std::chrono::steady_clock::now();
  layer.forward(x.data(), 4, y.data(), {.schedule = Schedule::kDual});
  std::string msg;
  try {
    dev->default_stream().synchronize();
  } catch (const rt::StreamError& e) {
    msg = e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("op 'ep."), std::string::npos) << msg;
  EXPECT_LT(s, 10.0);
  std::printf("ep-fault verdict: rank %d %s after %.1f s: %s\n", g_comm->rank(),
              ::testing::Test::HasFailure() ? "FAIL" : "PASS", s, msg.c_str());
  std::fflush(stdout);
  // The exchange with rank 1 never completes: leave without MPI_Finalize, with the test's verdict.
  _exit(::testing::Test::HasFailure() ? 1 : 0);
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::chrono::milliseconds timeout(20000);
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--ep-fault" && i + 1 < argc) {
      moe::g_fault = argv[i + 1];
      timeout = std::chrono::milliseconds(1500);
    }
  auto comm = moe::ep::MpiCommunicator::init(&argc, &argv, timeout);
  moe::g_comm = comm.get();
  // Only rank 0 prints the test listing; every rank still reports its failures.
  if (comm->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  return rc;
}
