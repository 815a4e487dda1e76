// The pieces of the tools that turn a trace into figures and files: overlap statistics, Chrome trace JSON,
// the SVG timeline, and the all-or-nothing file writer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <map>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "bench_report.h"
#include "output_file.h"
#include "overlap_stats.h"
#include "trace_export.h"

namespace moe::tools {
namespace {

rt::OpRecord op(int stream, const std::string& name, int64_t start_us, int64_t end_us, int worker = 0) {
  rt::OpRecord r;
  r.stream_id = stream;
  r.stream_name = stream == 0 ? "main" : "11";
  r.name = name;
  r.enqueue_ns = 0;
  r.start_ns = start_us * 1000;
  r.end_ns = end_us * 1000;
  r.tiles.push_back({0, worker, r.start_ns, r.end_ns});
  return r;
}

rt::Trace sample_trace() {
  rt::Trace t;
  t.num_workers = 2;
  t.ops = {op(0, "router", 0, 10), op(1, "shared.gate_up", 5, 25, 1), op(0, "experts.gate_up", 12, 40),
           op(1, "shared.down", 30, 50, 1), op(0, "sum", 50, 52)};
  t.edges.push_back({1, 2, 0, 9, 50'000});
  // The first began before the call, the third was still open when the trace was taken (past the last op).
  t.sleeps = {{1, -5'000, 3'000}, {0, 40'000, 45'000}, {1, 50'000, 90'000}};
  return t;
}

TEST(OverlapStats, UnionsAndIntersectionOfTheTwoBranches) {
  const OverlapStats s = overlap_stats(sample_trace());
  EXPECT_DOUBLE_EQ(s.span_us, 52.0);
  EXPECT_DOUBLE_EQ(s.shared_us, 20.0 + 20.0);
  EXPECT_DOUBLE_EQ(s.routed_us, 10.0 + 28.0 + 2.0);
  // shared [5,25] and [30,50] against routed [0,10], [12,40], [50,52]: 5 + 13 + 10.
  EXPECT_DOUBLE_EQ(s.concurrent_us, 28.0);
  EXPECT_DOUBLE_EQ(overlap_stats(rt::Trace{}).span_us, 0.0);
}

TEST(TraceExport, ChromeJsonHasOpsTilesFlowsAndLaneNames) {
  const std::string path = (std::filesystem::temp_directory_path() / "moe-trace-test.json").string();
  write_chrome_trace(sample_trace(), path);
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  int ops = 0, tiles = 0, sleeps = 0, flows = 0, names = 0;
  for (const auto& e : j["traceEvents"]) {
    const std::string ph = e["ph"];
    if (ph == "X" && e["cat"] == "sleep") {
      ++sleeps;
      EXPECT_EQ(e["tid"], 1000 + (e["ts"] == 40.0 ? 0 : 1));  // a worker's lane
      EXPECT_GE(e["ts"].get<double>(), 0.0) << "a sleep begun before the call starts with it";
      EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(), 52.0) << "and ends by the last op's end";
      continue;
    }
    if (ph == "X") (e["cat"] == "op" ? ops : tiles)++;
    if (ph == "s" || ph == "f") ++flows;
    if (ph == "M") ++names;
  }
  EXPECT_EQ(ops, 5);
  EXPECT_EQ(tiles, 5);
  EXPECT_EQ(sleeps, 3);
  EXPECT_EQ(flows, 2);
  EXPECT_EQ(names, 2 + 2 + 2);  // the process's name and order, two streams, two workers
  std::filesystem::remove(path);
}

TEST(TraceExport, SvgTimelineHasALanePerStreamAndWorker) {
  const std::string path = (std::filesystem::temp_directory_path() / "moe-trace-test.svg").string();
  write_timeline_svg(sample_trace(), "a <title> & more", path);
  std::ifstream in(path);
  const std::string svg((std::istreambuf_iterator<char>(in)), {});
  for (const char* s : {"stream 0 (main)", "stream 1 (11)", "worker 0", "worker 1", "a &lt;title&gt; &amp; more",
                        "marker-end", "<title>asleep 3.0 us", "<title>asleep 5.0 us", "<title>asleep 2.0 us"})
    EXPECT_NE(svg.find(s), std::string::npos) << s;
  std::filesystem::remove(path);
}

// Under expert parallelism each rank's trace travels as text to rank 0, which writes one file with a
// process per rank and stacks every rank's lanes in the timeline.
TEST(TraceExport, ATraceSurvivesTextAndMergesAsAProcessPerRank) {
  rt::Trace a = sample_trace();
  a.ops[2].graph_node = 4;
  a.ops[2].seq = 7;
  const rt::Trace b = parse_trace(serialize_trace(a));
  ASSERT_EQ(b.ops.size(), a.ops.size());
  ASSERT_EQ(b.edges.size(), a.edges.size());
  EXPECT_EQ(b.num_workers, a.num_workers);
  for (size_t i = 0; i < a.ops.size(); ++i) {
    EXPECT_EQ(b.ops[i].name, a.ops[i].name);
    EXPECT_EQ(b.ops[i].stream_name, a.ops[i].stream_name);
    EXPECT_EQ(b.ops[i].seq, a.ops[i].seq);
    EXPECT_EQ(b.ops[i].graph_node, a.ops[i].graph_node);
    EXPECT_EQ(b.ops[i].end_ns, a.ops[i].end_ns);
    ASSERT_EQ(b.ops[i].tiles.size(), a.ops[i].tiles.size());
    EXPECT_EQ(b.ops[i].tiles[0].worker, a.ops[i].tiles[0].worker);
  }
  EXPECT_EQ(b.edges[0].to_seq, a.edges[0].to_seq);
  EXPECT_EQ(b.edges[0].time_ns, a.edges[0].time_ns);
  ASSERT_EQ(b.sleeps.size(), a.sleeps.size());
  EXPECT_EQ(b.sleeps[1].worker, a.sleeps[1].worker);
  EXPECT_EQ(b.sleeps[1].end_ns, a.sleeps[1].end_ns);
  EXPECT_THROW(parse_trace("{\"ops\": 3}"), std::invalid_argument);
  EXPECT_THROW(parse_trace("not json"), std::invalid_argument);

  rt::Trace later = a;
  shift_trace(later, 1000);
  EXPECT_EQ(later.ops[1].start_ns, a.ops[1].start_ns + 1000);
  EXPECT_EQ(later.ops[1].tiles[0].end_ns, a.ops[1].tiles[0].end_ns + 1000);
  EXPECT_EQ(later.edges[0].time_ns, a.edges[0].time_ns + 1000);
  EXPECT_EQ(later.sleeps[1].start_ns, a.sleeps[1].start_ns + 1000);

  const std::string path = (std::filesystem::temp_directory_path() / "moe-trace-ranks.json").string();
  write_chrome_trace({{"rank 0", a}, {"rank 1", later}}, path);
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  std::map<int, std::string> processes;
  std::map<int, int> ops_per_pid;
  for (const auto& e : j["traceEvents"]) {
    if (e["name"] == "process_name") processes[e["pid"].get<int>()] = e["args"]["name"];
    if (e.value("cat", "") == "op") ops_per_pid[e["pid"].get<int>()]++;
  }
  EXPECT_EQ(processes, (std::map<int, std::string>{{1, "rank 0"}, {2, "rank 1"}}));
  EXPECT_EQ(ops_per_pid, (std::map<int, int>{{1, 5}, {2, 5}}));
  std::filesystem::remove(path);

  const std::string svg_path = (std::filesystem::temp_directory_path() / "moe-trace-ranks.svg").string();
  write_timeline_svg({{"rank 0", a}, {"rank 1", later}}, "two ranks", svg_path);
  std::ifstream in(svg_path);
  const std::string svg((std::istreambuf_iterator<char>(in)), {});
  for (const char* s : {"rank 0: stream 0 (main)", "rank 1: stream 1 (11)", "rank 1: worker 1"})
    EXPECT_NE(svg.find(s), std::string::npos) << s;
  std::filesystem::remove(svg_path);
}

TEST(OutputFile, AFailedWriteLeavesNothing) {
  const std::string path = "/nonexistent-dir/out.json";
  EXPECT_THROW(write_file_atomically(path, "x"), std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  try {
    write_file_atomically(path, "x");
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// A batch of outputs appears whole at commit(); one that fails on the way removes what it staged, leaving
// the files that were there before as they were.
TEST(OutputFile, ABatchIsAllOrNothing) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("moe-batch-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string a = (dir / "a.json").string(), b = (dir / "b.svg").string(), c = (dir / "c.json").string();
  {
    OutputBatch batch;
    write_file_atomically(a, "A");
    write_file_atomically(b, "B");
    EXPECT_FALSE(std::filesystem::exists(a));  // staged only
    EXPECT_TRUE(std::filesystem::exists(a + ".tmp"));
    batch.commit();
  }
  EXPECT_EQ(contents(a), "A");
  EXPECT_EQ(contents(b), "B");
  EXPECT_FALSE(std::filesystem::exists(a + ".tmp"));
  // The third output fails (its directory is missing): the first two keep their previous contents.
  try {
    OutputBatch batch;
    write_file_atomically(a, "A2");
    write_file_atomically(b, "B2");
    write_file_atomically((dir / "missing" / "c.json").string(), "C2");
    batch.commit();
    ADD_FAILURE() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "missing" / "c.json").string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(contents(a), "A");
  EXPECT_EQ(contents(b), "B");
  EXPECT_FALSE(std::filesystem::exists(a + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(b + ".tmp"));
  // A path that is a directory, or given twice, fails before anything is renamed; outside a batch too.
  std::filesystem::create_directories(dir / "sub");
  EXPECT_THROW(write_file_atomically((dir / "sub").string(), "x"), std::runtime_error);
  {
    OutputBatch batch;
    write_file_atomically(c, "C");
    EXPECT_THROW(write_file_atomically(c, "C again"), std::runtime_error);
  }
  EXPECT_FALSE(std::filesystem::exists(c));
  EXPECT_FALSE(std::filesystem::exists(c + ".tmp"));
  // Without a batch a write is immediate again.
  write_file_atomically(c, "C");
  EXPECT_EQ(contents(c), "C");
  std::filesystem::remove_all(dir);
}

TEST(OutputFile, PathsAreCheckedUpFront) {
  const std::string tmp = std::filesystem::temp_directory_path().string();
  EXPECT_NO_THROW(check_output_paths({{"--json", tmp + "/moe-x.json"}, {"--svg", ""}, {"--tune", "moe-y.json"}}));
  auto message = [](const std::vector<std::pair<std::string, std::string>>& outs) {
    try {
      check_output_paths(outs);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({{"--svg", "/nonexistent-dir/x.svg"}}),
            "--svg '/nonexistent-dir/x.svg': cannot write: directory '/nonexistent-dir' does not exist");
  EXPECT_EQ(message({{"--out", tmp}}), "--out '" + tmp + "': cannot write: it is a directory");
  EXPECT_EQ(message({{"--json", "r.json"}, {"--tune", "r.json"}}), "--tune 'r.json': the same path as --json");
}

// The bench table and JSON carry both fractions of bandwidth, of the moment (of_bw) and of the run's best
// read (of_best), and name the read loop and pattern that measured them.
TEST(BenchReport, TableAndJsonShowBothFractionsAndTheReadLoop) {
  BenchReport r;
  r.model = "layer";
  r.method = "method";
  r.machine.cpu = "cpu";
  r.machine.threads = 2;
  r.machine.read_gbps = 40;
  r.machine.read_isa = "avx2";
  r.machine.read_pattern = "sequential";
  r.machine.isa = "avx2";
  r.sweep_measures = true;
  r.best_read_gbps = 50;
  r.machine.avx2_fp32_gflops = r.machine.fp32_gflops = 150;  // the start probe
  r.best_peak_gflops = 180;                                   // a later probe, the best of the run
  BenchResult b;
  b.schedule = b.effective = "serial";
  b.tokens = 8;
  b.median_us = 1000;
  b.bytes = 36'000'000;  // 36 GB/s
  b.gbps = 36;
  b.read_gbps = 40;
  b.read_calls = 3;
  b.bandwidth_fraction = 0.9;
  b.best_fraction = 0.72;
  r.results.push_back(b);
  const std::string table = bench_table(r);
  const size_t header = table.find("read_now");
  ASSERT_NE(header, std::string::npos) << table;
  EXPECT_LT(table.find("of_bw", header), table.find("of_best", header)) << table;
  // The row: of_bw then of_best, in percent, under their headers.
  auto words = [](const std::string& line) {
    std::istringstream in(line);
    return std::vector<std::string>(std::istream_iterator<std::string>(in), std::istream_iterator<std::string>());
  };
  const size_t head_end = table.find('\n', header);
  const size_t head_begin = table.rfind('\n', header) + 1;
  const std::vector<std::string> head = words(table.substr(head_begin, head_end - head_begin));
  const std::vector<std::string> row = words(table.substr(head_end + 1, table.find('\n', head_end + 1) - head_end - 1));
  ASSERT_EQ(head.size(), row.size()) << table;
  const size_t of_bw = static_cast<size_t>(std::find(head.begin(), head.end(), "of_bw") - head.begin());
  ASSERT_LT(of_bw + 1, head.size()) << table;
  EXPECT_EQ(head[of_bw + 1], "of_best") << table;
  EXPECT_EQ(row[of_bw], "90%") << table;
  EXPECT_EQ(row[of_bw + 1], "72%") << table;
  EXPECT_NE(table.find("read 40.0 GB/s at start (avx2 read loop, sequential), best 50.0 GB/s in the run"), std::string::npos) << table;
  EXPECT_NE(table.find("of_best: GB/s over the best read bandwidth of the run, 50.0 GB/s"), std::string::npos) << table;
  EXPECT_NE(table.find("of_pk: GFLOP/s over the best probe of the kernels' arithmetic peak in the run, 180 GFLOP/s"),
            std::string::npos)
      << table;
  const nlohmann::json j = bench_json(r);
  EXPECT_EQ(j["best_read_gbps"].get<double>(), 50.0);
  EXPECT_EQ(j["best_peak_gflops"].get<double>(), 180.0);
  EXPECT_EQ(j["machine"]["read_isa"].get<std::string>(), "avx2");
  EXPECT_EQ(j["machine"]["read_pattern"].get<std::string>(), "sequential");
  EXPECT_EQ(j["results"][0]["best_fraction"].get<double>(), 0.72);
  EXPECT_EQ(j["results"][0]["bandwidth_fraction"].get<double>(), 0.9);
}

// A kernel build picked by CPU check is named beside the ISA, in the table and the JSON.
TEST(BenchReport, NamesTheKernelsBuild) {
  BenchReport r;
  r.machine.isa = "avx2int8";
  EXPECT_NE(bench_table(r).find("kernels avx2int8\n"), std::string::npos) << bench_table(r);
  r.machine.isa_build = "vpdpbusd, two rows per 512-bit vector";
  EXPECT_NE(bench_table(r).find("kernels avx2int8 (vpdpbusd, two rows per 512-bit vector)\n"), std::string::npos)
      << bench_table(r);
  EXPECT_EQ(r.machine.to_json()["isa_build"].get<std::string>(), "vpdpbusd, two rows per 512-bit vector");
}

// The kernels that run on 256-bit vectors (avx2, and avx2int8 for everything but its int8 products) name
// that peak beside the machine's on an AVX-512 CPU; the AVX-512 ones do not.
TEST(BenchReport, The256BitKernelsNameTheirPeak) {
  for (const char* isa : {"avx2", "avx2int8", "avx512", "avx512bf16"}) {
    BenchReport r;
    r.machine.isa = isa;
    r.machine.fp32_gflops = 440;
    r.machine.avx2_fp32_gflops = 220;
    const bool narrow = std::string(isa).rfind("avx2", 0) == 0;
    EXPECT_EQ(bench_table(r).find("fp32 FMA 440 GFLOP/s (256-bit: 220, the kernels' peak)") != std::string::npos, narrow)
        << isa << ":\n" << bench_table(r);
  }
}

}  // namespace
}  // namespace moe::tools
