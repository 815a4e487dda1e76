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
#include <iterator>
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

  // `shell` runs first in the same sh -c (e.g. "ulimit -f 100;"), and the command is exec'd after it.
  static Result run(const std::string& args, const std::string& shell = "") {
    const std::string cmd = shell + " XDG_CACHE_HOME=" + (dir_ / "cache").string() + " exec " MOE_OVERLAP_BIN " " +
                            args + " 2>&1";
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

  // Neither the file nor its temporary (PATH.tmp) exists.
  static void expect_absent(const std::vector<std::string>& paths, const std::string& context) {
    for (const std::string& p : paths) {
      EXPECT_FALSE(fs::exists(p)) << context << ": " << p << " was left";
      EXPECT_FALSE(fs::exists(p + ".tmp")) << context << ": " << p << ".tmp was left";
    }
  }

  // The file names in a directory, sorted.
  static std::vector<std::string> listing(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  static std::string read_file(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

  static inline fs::path dir_;
};

// The small checkpoint of these tests in the fused layout, in 3 shards: the router and shared expert
// (~20 KiB), experts.gate_up_proj (128 KiB) and experts.down_proj (64 KiB).
std::string fused_checkpoint(const std::string& out, int seed) {
  return "make-checkpoint --preset qwen3-next-80b-a3b --hidden 64 --intermediate 32 --num-experts 16 --shared 48 "
         "--top-k 4 --fused --shard-mib 0.05 --seed " + std::to_string(seed) + " --out " + out;
}
// A file size limit of 100 blocks of 512 bytes (dash's unit; bash's 1 KiB is also below the second shard's
// size): the first shard is written whole, the second fails half way. With SIGXFSZ ignored the write fails
// with EFBIG, as on a full disk; by default the signal kills the process in the middle of the write.
const char* const kFailingWrites = "trap '' XFSZ; ulimit -f 100;";
const char* const kKilledWrites = "ulimit -f 100;";

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
  // The int8-activation int4 kernels, on the tiny int4 families: bitwise across schedules, within 3e-2.
  if (isa_supported(Isa::kAvx2Int8)) {
    r = run("check --tiny --tokens 1,4 --isa avx2int8");
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("tolerance 3.0e-02"), std::string::npos) << r.out;
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
                          "best_fraction", "gflops", "peak_fraction", "speedup_vs_serial", "hidden_fraction"})
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
    // No sweep measured, so the run's best read is the start probe's.
    EXPECT_NEAR(b["best_fraction"].get<double>(), b["gbps"].get<double>() / j["best_read_gbps"].get<double>(), 1e-9);
  }
  EXPECT_EQ(j["best_read_gbps"].get<double>(), j["machine"]["read_gbps"].get<double>());
  EXPECT_NE(r.out.find("of_best"), std::string::npos) << r.out;
  // of_pk is taken against the best probe of the kernels' peak in the run (the start's, or one taken after
  // a token count), never a lower one: the exact kernels quote the fp32 FMA peak.
  const double best_peak = j["best_peak_gflops"].get<double>();
  const std::string kernels = j["machine"]["isa"].get<std::string>();
  if (kernels == "avx2" || kernels == "avx512") {
    EXPECT_GE(best_peak, j["machine"][kernels == "avx2" ? "fp32_fma_256bit_gflops" : "fp32_fma_gflops"].get<double>());
    for (const auto& b : j["results"])
      EXPECT_NEAR(b["peak_fraction"].get<double>(), b["gflops"].get<double>() / best_peak, 1e-9);
  }
  EXPECT_NE(r.out.find("of_pk: GFLOP/s over the best probe"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(path("b.svg")));
  EXPECT_NE(r.out.find("host time per call"), std::string::npos) << r.out;
}

// A sweep of 128 MiB or more is timed before every call, and each call is compared with its own sweep's
// bandwidth. With one worker every sweep counts (there is no second worker to wait for).
TEST_F(Cli, BenchComparesEachCallWithItsSweep) {
  // The read loop named explicitly: the probe and the sweeps run it, and the report says so.
  const std::string loop = __builtin_cpu_supports("avx2") ? "avx2" : "scalar";
  const Result r = run("bench --model " + model() + " --threads 1 --tokens 1,4 --repeats 3 --warmup 1 --evict-mib 128 "
                       "--settle-ms 300 --schedules serial,dual --read-isa " + loop + " --json " + path("s.json"));
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
  // vs_serial and hidden pair the calls of one repetition (the same input): the medians of serial's call
  // over dual's, and of serial's minus dual's (over the shared expert's own time).
  for (size_t i = 0; i + 1 < j["results"].size(); i += 2) {
    const auto& serial = j["results"][i];
    const auto& dual = j["results"][i + 1];
    ASSERT_EQ(serial["schedule"].get<std::string>(), "serial");
    ASSERT_EQ(dual["schedule"].get<std::string>(), "dual");
    EXPECT_EQ(serial["speedup_vs_serial"].get<double>(), 1.0);
    std::vector<double> ratio, saved;
    for (size_t k = 0; k < 3; ++k) {
      const double a = serial["calls"][k]["us"].get<double>(), b = dual["calls"][k]["us"].get<double>();
      ratio.push_back(a / b);
      saved.push_back(a - b);
    }
    EXPECT_EQ(dual["speedup_vs_serial"].get<double>(), median(ratio)) << dual.dump();
    const double shared = dual["shared_alone_us"].get<double>();
    ASSERT_GT(shared, 0.0) << dual.dump();
    EXPECT_NEAR(dual["hidden_fraction"].get<double>(), median(saved) / shared, 1e-12) << dual.dump();
    EXPECT_EQ(serial["hidden_fraction"].get<double>(), 0.0);
  }
  // of_best: GB/s over the best read of the run, which is at least the start probe and every listed sweep.
  EXPECT_EQ(j["machine"]["read_isa"].get<std::string>(), loop);
  const std::string pattern = j["machine"]["read_pattern"].get<std::string>();
  EXPECT_TRUE(pattern == "runs" || pattern == "sequential") << pattern;
  EXPECT_NE(r.out.find("(" + loop + " read loop, " + pattern + ")"), std::string::npos) << r.out;
  const double best = j["best_read_gbps"].get<double>();
  EXPECT_GE(best, j["machine"]["read_gbps"].get<double>());
  for (const auto& [tokens, v] : sweeps) EXPECT_GE(best, *std::max_element(v.begin(), v.end())) << tokens;
  for (const auto& b : j["results"])
    EXPECT_NEAR(b["best_fraction"].get<double>(), b["gbps"].get<double>() / best, 1e-12) << b.dump();
  expect_error("bench --model " + model() + " --read-isa avx512bf16", "--read-isa: expected scalar, avx2 or avx512");
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
  for (const char* op : {"router", "topk", "dispatch", "experts", "combine",
                         "shared.gate_up", "shared.down", "sum"})
    EXPECT_TRUE(names.count(op)) << op;
  EXPECT_EQ(streams.size(), 2u);
  std::ifstream svg(path("t.svg"));
  const std::string text((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_NE(text.find("shared.gate_up"), std::string::npos);
  EXPECT_NE(text.find("marker-end"), std::string::npos);  // event arrows
}

// bench writes its outputs all or none: a bad flag or input, or an output that cannot be written, leaves
// none of them, and an output that fails at the end removes those written before it.
TEST_F(Cli, BenchErrorsLeaveNoOutput) {
  // A quick bench of `model` with `schedules`, and `extra` flags.
  auto bench = [](const std::string& model, const std::string& schedules, const std::string& extra) {
    return "bench --model " + model + " --tokens 1 --repeats 1 --warmup 0 --settle-ms 0 --evict-mib 0 --threads 1 "
           "--schedules " + schedules + " " + extra;
  };
  const std::string json = path("e.json"), svg = path("e.svg"), tune = path("e-tune.json");
  const std::string outs = "--json " + json + " --svg " + svg + " --tune " + tune;
  const std::vector<std::string> all = {json, svg, tune};
  expect_error(bench(model(), "serial", outs + " --bogus-flag"), "bogus");
  expect_absent(all, "bad flag");
  expect_error(bench(model(), "serial,warp", outs), "warp");
  expect_absent(all, "bad schedule");
  std::ofstream(path("e-bad-tune.json")) << R"({"table": 5})";
  expect_error(bench(model(), "serial", outs + " --tuning " + path("e-bad-tune.json")), "e-bad-tune.json");
  expect_absent(all, "bad tuning file");
  // An unwritable output fails up front, naming it.
  expect_error(bench(model(), "serial", "--json " + json + " --svg " + path("no-such-dir/e.svg")),
               path("no-such-dir/e.svg") + "': cannot write: directory");
  expect_error(bench(model(), "serial", "--json " + json + " --tune " + dir_.string()),
               dir_.string() + "': cannot write: it is a directory");
  expect_error(bench(model(), "serial", "--json " + json + " --tune " + json), "the same path as --json");
  expect_absent(all, "unwritable output");
  // The SVG fails only when written (its temporary's name is taken by a directory), after the JSON was:
  // the JSON goes too, and the file that was there before stays as it was.
  std::ofstream(json) << "previous";
  fs::create_directories(svg + ".tmp");
  expect_error(bench(model(), "serial", outs), "cannot write '" + svg + "'");
  EXPECT_EQ(read_file(json), "previous");
  fs::remove(svg + ".tmp");
  fs::remove(json);
  expect_absent(all, "late failure");
}

TEST_F(Cli, TraceErrorsLeaveNoOutput) {
  auto trace = [](const std::string& model, const std::string& extra) {
    return "trace --model " + model + " --tokens 2 --threads 1 " + extra;
  };
  const std::string json = path("et.json"), svg = path("et.svg");
  const std::string outs = "--out " + json + " --svg " + svg;
  expect_error(trace(model(), outs + " --bogus-flag"), "bogus");
  expect_error(trace(model(), outs + " --schedule fastest"), "--schedule");
  expect_error(trace(model(), outs + " --isa sse9"), "--isa");
  expect_error(trace(path("missing"), outs), "missing");
  expect_error(trace(model(), outs + " --experts 99"), "99");
  expect_absent({json, svg}, "bad input");
  expect_error(trace(model(), "--out " + path("no-such-dir/et.json") + " --svg " + svg), path("no-such-dir/et.json"));
  expect_error(trace(model(), "--out " + json + " --svg " + dir_.string()),
               dir_.string() + "': cannot write: it is a directory");
  expect_absent({json, svg}, "unwritable output");
  fs::create_directories(svg + ".tmp");
  expect_error(trace(model(), outs), "cannot write '" + svg + "'");
  fs::remove(svg + ".tmp");
  expect_absent({json, svg}, "late failure");
}

TEST_F(Cli, MakeCheckpointErrorsLeaveNoDirectory) {
  auto make = [](const std::string& preset, const std::string& out, const std::string& extra) {
    return "make-checkpoint --preset " + preset + " --hidden 64 --intermediate 32 --num-experts 16 --out " + out + " " +
           extra;
  };
  const std::string out = path("bad-ckpt");
  const std::string qwen = "qwen3-next-80b-a3b";
  expect_error(make(qwen, out, "--bogus-flag"), "bogus");
  expect_error(make(qwen, out, "--dtype fp9"), "--dtype");
  expect_error(make("no-such-model", out, ""), "no-such-model");
  expect_error(make(qwen, out, "--top-k 17"), "num_experts_per_tok");
  expect_error(make(qwen, out, "--layers 99"), "layer 99");
  expect_error(make(qwen, out, "--shard-mib -1"), "--shard-mib");
  expect_error(make(qwen, out, "--fused --dtype fp8"), "fused");
  EXPECT_FALSE(fs::exists(out));
  // An output that cannot be a directory, named in the message.
  std::ofstream(path("plain-file")) << "x";
  expect_error(make(qwen, path("plain-file"), ""), path("plain-file"));
  expect_error(make(qwen, path("plain-file/sub"), ""), path("plain-file/sub"));
  EXPECT_EQ(read_file(path("plain-file")), "x");
}

// A write that fails half way (the second of three shards, as on a full disk) leaves nothing behind: a new
// directory is removed again, and a checkpoint that was there still loads, unchanged.
TEST_F(Cli, MakeCheckpointFailingHalfWayLeavesNothingThatLoads) {
  const std::string fresh = path("half-fresh");
  Result r = run(fused_checkpoint(fresh, 5), kFailingWrites);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("File too large"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fresh + "/model-00002-of-00003.safetensors"), std::string::npos) << r.out;
  EXPECT_LE(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_FALSE(fs::exists(fresh)) << (fs::exists(fresh) ? ::testing::PrintToString(listing(fresh)) : "");

  const std::string kept = path("half-kept");
  ASSERT_EQ(run(fused_checkpoint(kept, 5)).status, 0);
  const std::vector<std::string> files = listing(kept);
  r = run("run --model " + kept + " --tokens 2 --output " + path("half-before.npy"));
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(fused_checkpoint(kept, 6), kFailingWrites);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_EQ(listing(kept), files);  // no staged file left
  r = run("run --model " + kept + " --tokens 2 --output " + path("half-after.npy"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_file(path("half-before.npy")), read_file(path("half-after.npy")));
}

// A write killed half way (SIGXFSZ in the second shard) has no chance to clean up: a new directory is left
// without config.json and does not load, a checkpoint that was there still loads unchanged, and the next
// write removes what the killed one left.
TEST_F(Cli, MakeCheckpointKilledHalfWayLeavesNothingThatLoads) {
  const std::string fresh = path("killed-fresh");
  Result r = run(fused_checkpoint(fresh, 5), kKilledWrites);
  EXPECT_NE(r.status, 0) << r.out;
  ASSERT_TRUE(fs::is_directory(fresh));
  EXPECT_FALSE(fs::exists(fresh + "/config.json"));
  expect_error("run --model " + fresh + " --tokens 1", "config.json");
  r = run(fused_checkpoint(fresh, 5));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(listing(fresh), (std::vector<std::string>{"config.json", "model-00001-of-00003.safetensors",
                                                     "model-00002-of-00003.safetensors",
                                                     "model-00003-of-00003.safetensors",
                                                     "model.safetensors.index.json"}));
  r = run("run --model " + fresh + " --tokens 2 --output " + path("killed-before.npy"));
  ASSERT_EQ(r.status, 0) << r.out;

  r = run(fused_checkpoint(fresh, 6), kKilledWrites);
  EXPECT_NE(r.status, 0) << r.out;
  r = run("run --model " + fresh + " --tokens 2 --output " + path("killed-after.npy"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(read_file(path("killed-before.npy")), read_file(path("killed-after.npy")));
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

// A router whose scores all but tie (every weight within 1e-9 of zero) makes every token a near tie, which the
// fp64 comparison skips: check fails past --max-skipped-share instead of passing with nothing compared, and
// passes when the share allowed covers them.
TEST_F(Cli, CheckFailsWhenTooManyTokensAreSkippedAsNearTies) {
  const std::string ties = path("near-ties");
  const Result made = run("make-checkpoint --preset qwen3-next-80b-a3b --hidden 64 --intermediate 32 --num-experts 16 "
                          "--shared 48 --top-k 4 --dtype f32 --seed 3 --out " + ties);
  ASSERT_EQ(made.status, 0) << made.out;
  // The router (mlp.gate.weight, f32) rewritten in place. A safetensors file: the header's size (8 bytes,
  // little endian), the JSON header (dtype, shape, data_offsets from the end of the header), the data.
  int patched = 0;
  for (const auto& e : fs::directory_iterator(ties)) {
    if (e.path().extension() != ".safetensors") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), sizeof n);
    std::string header(n, '\0');
    f.read(header.data(), static_cast<std::streamsize>(n));
    const nlohmann::json tensors = nlohmann::json::parse(header);
    for (const auto& [name, t] : tensors.items()) {
      if (!name.ends_with(".mlp.gate.weight")) continue;
      ASSERT_EQ(t["dtype"], "F32") << name;
      const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
      std::vector<float> w((end - begin) / sizeof(float));
      uint64_t s = 12345;
      for (float& v : w) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v = 1e-9f * (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 0.5f);
      }
      f.seekp(static_cast<std::streamoff>(sizeof n + n + begin));
      f.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * sizeof(float)));
      ASSERT_TRUE(f.good()) << e.path();
      ++patched;
    }
  }
  ASSERT_EQ(patched, 1);

  Result r = run("check --model " + ties + " --tokens 1,4 --threads 2");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("FAIL  fp64 reference: 5 of 5 tokens skipped as near ties (100%), more than "
                       "--max-skipped-share 0.25 allows"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nothing compared (every one of the 4 tokens skipped as a near tie)"), std::string::npos) << r.out;
  r = run("check --model " + ties + " --tokens 1,4 --threads 2 --max-skipped-share 1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("PASS  fp64 reference: 5 of 5 tokens skipped as near ties (100%; --max-skipped-share 1)"),
            std::string::npos) << r.out;
  // The checkpoint's own router routes decisively: nothing skipped, under the default share.
  r = run("check --model " + model() + " --tokens 1,4 --threads 2");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("PASS  fp64 reference: 0 of 5 tokens skipped as near ties"), std::string::npos) << r.out;
  expect_error("check --model " + ties + " --max-skipped-share 1.5", "--max-skipped-share");
}

}  // namespace
}  // namespace moe
