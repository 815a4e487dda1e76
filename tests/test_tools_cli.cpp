// The moe-overlap command as a user meets it: every subcommand end to end on a small checkpoint written by
// make-checkpoint, and the error contract (one clear line, non-zero exit, no output file) on bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/linear.h"
#include "io/npy.h"

namespace fs = std::filesystem;

namespace moe {
namespace {

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr together
};

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("moe-cli-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    const Result r = run("make-checkpoint --preset qwen3-next-80b-a3b --hidden 64 --intermediate 32 --num-experts 16 "
                         "--shared 48 --top-k 4 --seed 3 --shard-mib 0.05 --out " + model());
    ASSERT_EQ(r.status, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string model() { return (dir_ / "model").string(); }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }

  static Result run(const std::string& args) {
    const std::string cmd = "XDG_CACHE_HOME=" + (dir_ / "cache").string() + " " MOE_OVERLAP_BIN " " + args + " 2>&1";
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
  }

  // An error: non-zero exit, one line naming `what`.
  static void expect_error(const std::string& args, const std::string& what) {
    const Result r = run(args);
    EXPECT_NE(r.status, 0) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(what), std::string::npos) << args << "\n" << r.out;
    EXPECT_LE(std::count(r.out.begin(), r.out.end(), '\n'), 2) << "expected one clear line:\n" << r.out;
  }

  static inline fs::path dir_;
};

TEST_F(Cli, RunWritesTheOutputAndEverySchedulesAgreesBitwise) {
  std::vector<float> serial;
  for (const char* s : {"serial", "dual", "phased"}) {
    for (const char* graph : {"", " --graph"}) {
      const std::string out = path(std::string("y_") + s + (graph[0] ? "_g" : "") + ".npy");
      const Result r = run("run --model " + model() + " --tokens 5 --seed 2 --schedule " + s + graph + " --output " + out);
      ASSERT_EQ(r.status, 0) << r.out;
      const FloatArray y = read_npy(out);
      ASSERT_EQ(y.shape, (std::vector<int64_t>{5, 64}));
      if (serial.empty()) serial = y.values;
      EXPECT_EQ(std::memcmp(serial.data(), y.values.data(), serial.size() * 4), 0) << s << graph;
    }
  }
}

TEST_F(Cli, RunReadsAnInputFile) {
  std::vector<float> x(3 * 64, 0.25f);
  write_npy(path("x.npy"), x.data(), {3, 64});
  const Result r = run("run --model " + model() + " --input " + path("x.npy") + " --output " + path("yx.npy"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_npy(path("yx.npy")).shape, (std::vector<int64_t>{3, 64}));
}

TEST_F(Cli, BadInputsFailWithOneLineAndNoOutput) {
  const std::string out = path("never.npy");
  expect_error("run --model " + path("missing") + " --output " + out, "--model");
  expect_error("run --model " + model() + " --schedule fastest --output " + out, "--schedule");
  expect_error("run --model " + model() + " --bogus-flag", "bogus");
  std::vector<float> x(2 * 64, 1.0f);
  x[64 + 7] = std::numeric_limits<float>::quiet_NaN();
  write_npy(path("nan.npy"), x.data(), {2, 64});
  expect_error("run --model " + model() + " --input " + path("nan.npy") + " --output " + out, "token 1");
  write_npy(path("wide.npy"), x.data(), {1, 128});
  expect_error("run --model " + model() + " --input " + path("wide.npy") + " --output " + out, "wide.npy");
  std::ofstream(path("garbage.npy")) << "not an npy file";
  expect_error("run --model " + model() + " --input " + path("garbage.npy") + " --output " + out, "garbage.npy");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  fs::create_directories(path("broken"));
  std::ofstream(path("broken/config.json")) << R"({"model_type": "qwen3_next", "hidden_size": "wide"})";
  expect_error("run --model " + path("broken"), "hidden_size");
  expect_error("run --model qwen3-next-80b-a3b --experts 9999", "--experts");
  expect_error("run --model " + model() + " --isa sse9", "--isa");
  expect_error("run --model qwen3-next-80b-a3b --reread", "--reread");
}

TEST_F(Cli, CheckPassesOnTheCheckpointAndTinyFamilies) {
  Result r = run("check --model " + model() + " --tokens 1,4 --sanitize --graph");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find(" 0 failed"), std::string::npos) << r.out;
  r = run("check --tiny --tokens 2");
  EXPECT_EQ(r.status, 0) << r.out;
  // The opt-in bf16-dot kernels: still bitwise across schedules, within their rounding of the reference.
  r = run("check --model " + model() + " --tokens 1,4 --isa avx512bf16");
  if (isa_supported(Isa::kAvx512Bf16)) {
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("tolerance 1.0e-02"), std::string::npos) << r.out;
  } else {
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("--isa avx512bf16"), std::string::npos) << r.out;
  }
}

TEST_F(Cli, BenchWritesTableJsonAndPlot) {
  // --reread: the shards' cached pages are dropped first and read anew.
  const Result r = run("bench --model " + model() + " --reread --tokens 1,4 --repeats 2 --warmup 1 --settle-ms 0 --evict-mib 0 --graph --json " +
                       path("b.json") + " --svg " + path("b.svg"));
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(path("b.json")));
  ASSERT_EQ(j["results"].size(), 2u * 8u);  // 2 token counts x 4 schedules x eager/graph
  for (const char* key : {"schedule", "tokens", "median_us", "p10_us", "p90_us", "bytes", "gbps", "bandwidth_fraction",
                          "gflops", "peak_fraction", "speedup_vs_serial", "hidden_fraction"})
    EXPECT_TRUE(j["results"][0].contains(key)) << key;
  EXPECT_GT(j["machine"]["read_gbps"].get<double>(), 0.0);
  EXPECT_LE(j["huge_page_fraction"].get<double>(), 1.0);  // -1 where smaps is unavailable
  // Shards of 50 KiB cannot be held in 2 MiB pages: bench says how many are 4 KiB and what to do.
  if (j["huge_page_fraction"].get<double>() >= 0) {
    EXPECT_EQ(j["huge_page_fraction"].get<double>(), 0.0);
    EXPECT_NE(r.out.find("holds 100% of this checkpoint's weight pages in 4 KiB pages"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--reread drops the cached pages"), std::string::npos) << r.out;
  }
  EXPECT_GT(j["results"][0]["bytes"].get<int64_t>(), 0);
  // Without a sweep to time (--evict-mib 0), every fraction is taken against the figure from the start.
  EXPECT_FALSE(j["sweep_measures_bandwidth"].get<bool>());
  EXPECT_NE(r.out.find("read_now: the read bandwidth measured at the start"), std::string::npos) << r.out;
  for (const auto& b : j["results"]) {
    EXPECT_EQ(b["read_gbps"].get<double>(), j["machine"]["read_gbps"].get<double>());
    EXPECT_EQ(b["read_calls"].get<int>(), 0);
    EXPECT_NEAR(b["bandwidth_fraction"].get<double>(), b["gbps"].get<double>() / b["read_gbps"].get<double>(), 1e-9);
  }
  EXPECT_TRUE(fs::exists(path("b.svg")));
  EXPECT_NE(r.out.find("host time per call"), std::string::npos) << r.out;
}

// A sweep of 128 MiB or more is timed before every call, and each call is compared with its own sweep's
// bandwidth. With one worker every sweep counts (there is no second worker to wait for).
TEST_F(Cli, BenchComparesEachCallWithItsSweep) {
  const Result r = run("bench --model " + model() + " --threads 1 --tokens 1,4 --repeats 3 --warmup 1 --evict-mib 128 "
                       "--settle-ms 300 --schedules serial,dual --json " + path("s.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("300 ms of untimed calls first"), std::string::npos) << r.out;
  expect_error("bench --model " + model() + " --settle-ms -5", "--settle-ms");
  EXPECT_NE(r.out.find("read_now: the read bandwidth of the cache-evicting sweep"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(path("s.json")));
  EXPECT_TRUE(j["sweep_measures_bandwidth"].get<bool>());
  ASSERT_EQ(j["results"].size(), 4u);
  // Each token count's figures are medians of the calls it lists: three per schedule (an odd count, so each
  // median is one call's), and the sweeps of both schedules' six calls for the read bandwidth.
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::map<int64_t, std::vector<double>> sweeps;
  for (const auto& b : j["results"]) {
    EXPECT_EQ(b["read_calls"].get<int>(), 3 * 2) << b.dump();  // repeats x schedules
    ASSERT_EQ(b["calls"].size(), 3u) << b.dump();
    std::vector<double> us, of_bw;
    for (const auto& c : b["calls"]) {
      const double g = c["sweep_gbps"].get<double>();
      EXPECT_GT(g, 0.0) << b.dump();
      EXPECT_GT(c["bytes"].get<int64_t>(), 0) << b.dump();
      us.push_back(c["us"].get<double>());
      of_bw.push_back(static_cast<double>(c["bytes"].get<int64_t>()) / (us.back() * 1e3) / g);
      sweeps[b["tokens"].get<int64_t>()].push_back(g);
    }
    EXPECT_EQ(b["median_us"].get<double>(), median(us)) << b.dump();
    EXPECT_NEAR(b["bandwidth_fraction"].get<double>(), median(of_bw), 1e-12 * median(of_bw)) << b.dump();
    EXPECT_GE(b["read_spread"].get<double>(), 0.0);
  }
  for (const auto& b : j["results"])
    EXPECT_NEAR(b["read_gbps"].get<double>(), median(sweeps[b["tokens"].get<int64_t>()]), 1e-9) << b.dump();
}

// bench --tune writes the fastest schedule per token count; --schedule auto --tuning FILE runs it.
TEST_F(Cli, BenchTunesAndAutoFollows) {
  Result r = run("bench --model " + model() + " --tokens 1,4 --repeats 2 --warmup 1 --settle-ms 0 --evict-mib 0 --tune " +
                 path("tune.json"));
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(path("tune.json")));
  ASSERT_EQ(j["table"].size(), 2u);
  EXPECT_EQ(j["table"][1]["tokens"].get<int64_t>(), 4);
  r = run("run --model " + model() + " --tokens 4 --schedule auto --tuning " + path("tune.json"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("auto: " + j["table"][1]["schedule"].get<std::string>()), std::string::npos) << r.out;
  std::ofstream(path("bad-tune.json")) << R"({"table": [{"tokens": 1, "schedule": "fastest"}]})";
  expect_error("run --model " + model() + " --tokens 4 --schedule auto --tuning " + path("bad-tune.json"),
               "bad-tune.json: table[0].schedule");
}

TEST_F(Cli, TraceWritesChromeJsonAndTimeline) {
  const Result r = run("trace --model " + model() + " --tokens 3 --schedule phased --out " + path("t.json") +
                       " --svg " + path("t.svg"));
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(path("t.json")));
  std::set<std::string> names;
  std::set<int> streams;
  for (const auto& e : j["traceEvents"])
    if (e.value("cat", "") == "op") {
      names.insert(e["name"].get<std::string>());
      streams.insert(e["tid"].get<int>());
    }
  for (const char* op : {"router", "topk", "dispatch", "experts.gate_up", "experts.down", "combine",
                         "shared.gate_up", "shared.down", "sum"})
    EXPECT_TRUE(names.count(op)) << op;
  EXPECT_EQ(streams.size(), 2u);
  std::ifstream svg(path("t.svg"));
  const std::string text((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(text.find("shared.gate_up"), std::string::npos);
  EXPECT_NE(text.find("marker-end"), std::string::npos);  // event arrows
}

TEST_F(Cli, InfoAndHelpForEverySubcommand) {
  const Result r = run("info --model " + model());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("bandwidth-bound time"), std::string::npos) << r.out;
  for (const char* sub : {"run", "bench", "trace", "check", "info", "make-checkpoint"}) {
    const Result h = run(std::string(sub) + " --help");
    EXPECT_EQ(h.status, 0) << sub;
    EXPECT_NE(h.out.find("--"), std::string::npos) << sub;
  }
}

}  // namespace
}  // namespace moe
