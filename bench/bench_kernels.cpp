// Micro-benchmarks of the linear kernels against this machine's measured roofline.
//
// Decode (M = 1..32 tokens): bytes of weight streamed per second, rotating over enough distinct matrices
// (1.5 GiB in all by default, MOE_BENCH_ROTATE_MIB) that every iteration reads its weights from memory,
// not from the 32 MiB L3. Each benchmark thread rotates over its own matrices. bw_frac = achieved / the
// read bandwidth measured at start-up with the same number of threads.
// Prefill (M = 512, 2048): GFLOP/s on one matrix (in cache, as in a blocked expert GEMM), the threads
// splitting its rows; peak_frac = achieved / the fp32-FMA peak measured at start-up on the kernels' vectors
// (256-bit for avx2; the kernels use fp32 FMA on exactly converted weights), or the bf16-dot peak for the
// avx512bf16 path on bf16, fp8 and int4 weights.
// The second argument is the ISA (1 avx2, 2 avx512, 3 avx512bf16 = vdpbf16ps on x rounded to bf16, 4 avx2int8
// = int4 weights against x quantized to int8); those this CPU lacks are skipped. --benchmark_filter='/2$' (the ISA argument) keeps one. int4 matrices count their
// bf16 group scales as bytes read; their product count per weight is bf16's, so past a few tokens they are
// bound by the arithmetic peak.
// Benchmark thread i runs pinned to the i-th CPU this process may use, as the start-up probes pin their
// thread i: a fraction then compares a kernel with what the same core read, and a one-thread figure does not
// depend on which vCPU the scheduler chose (on a guest whose host shares the cores they can differ by a
// quarter; docs/benchmarking.md, "Machine effects that matter").
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/linear.h"
#include "kernels/roofline.h"
#include "kernels/weight.h"
#include "runtime/cpu_affinity.h"

namespace {

using moe::DType;
using moe::WeightView;

double g_bw_gbps[3] = {0, 0, 0};  // by thread count 1, 2
double g_peak_f32[3] = {0, 0, 0};
double g_peak_f32_256[3] = {0, 0, 0};  // on 256-bit vectors: the AVX2 kernels' peak
double g_peak_bf16[3] = {0, 0, 0};
std::vector<int> g_cpus;  // the process's CPUs, read before any thread is pinned

void pin(const benchmark::State& state) { moe::rt::pin_thread(pthread_self(), state.thread_index(), g_cpus); }

// One huge-page-advised, pre-faulted region of pseudo-random bf16-ish bytes, shared by all benchmarks.
struct Pool {
  char* data = nullptr;
  size_t bytes = 0;
  Pool() {
    const char* env = std::getenv("MOE_BENCH_ROTATE_MIB");
    bytes = (env ? std::strtoull(env, nullptr, 10) : 1536) << 20;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "bench_kernels: cannot map %zu bytes\n", bytes);
      std::exit(1);
    }
    madvise(p, bytes, MADV_HUGEPAGE);
    data = static_cast<char*>(p);
    // Small finite values whatever the dtype: bf16 in +-[2^-8, 2); as fp8, normal codes only, even low
    // bytes of exponent 1..15 and high bytes 0x3b..0x3e / 0xbb..0xbe, as a quantised checkpoint holds them
    // (a subnormal code in about 0.5% of 128-weight blocks, a NaN code in none): no block is sent to the
    // kernels' slower decodings.
    auto* h = reinterpret_cast<uint16_t*>(data);
    uint32_t s = 12345;
    for (size_t i = 0; i < bytes / 2; ++i) {
      s = s * 1664525u + 1013904223u;
      const uint32_t low = (s >> 16) & 0x7e;
      h[i] = static_cast<uint16_t>(0x3b00 + ((s >> 16) & 0x300) + (low & 0x78 ? low : low | 0x40) +
                                   ((s & 0x100) ? 0x8000 : 0));
    }
  }
  static Pool& get() {
    static Pool pool;
    return pool;
  }
};

std::vector<float> g_scales(64 * 64, 1.0f / 256);

constexpr int64_t kInt4Group = 32;  // Kimi-K2-Thinking's group size

// Bytes of one [rows x cols] matrix in the pool; int4: its packed words, then its bf16 group scales.
int64_t matrix_bytes(DType dt, int64_t rows, int64_t cols) {
  if (dt == DType::kInt4) return rows * cols / 2 + rows * (cols / kInt4Group) * 2;
  return rows * cols * static_cast<int64_t>(moe::dtype_size(dt));
}

// The fp8 code classes of every [rows x cols] pool matrix, one matrix's after another, made once per shape
// (before the timed loops) as the loader makes them once per checkpoint (WeightView::fp8_codes).
const uint8_t* pool_fp8_codes(int64_t rows, int64_t cols) {
  static std::mutex mu;  // the benchmark threads share the tables
  static std::map<std::pair<int64_t, int64_t>, std::vector<uint8_t>> by_shape;
  const std::lock_guard<std::mutex> lock(mu);
  std::vector<uint8_t>& codes = by_shape[{rows, cols}];
  if (codes.empty()) {
    const int64_t stride = (matrix_bytes(DType::kF8E4M3, rows, cols) + 63) / 64 * 64;
    const int64_t count = static_cast<int64_t>(Pool::get().bytes) / stride;
    WeightView m;
    m.dtype = DType::kF8E4M3;
    m.rows = rows;
    m.cols = cols;
    const int64_t per = moe::fp8_block_codes_size(m);
    codes.resize(static_cast<size_t>(per * count));
    for (int64_t j = 0; j < count; ++j) {
      m.data = Pool::get().data + j * stride;
      moe::fp8_block_codes(m, codes.data() + j * per);
    }
  }
  return codes.data();
}

// The i-th of the distinct [rows x cols] matrices that fit in the pool. int4 matrices read the pool's
// bytes as packed words (every field is a valid value) and as scales (bf16 in +-[2^-8, 2)); fp8 ones
// carry their classes from fp8_codes (pool_fp8_codes of the shape).
WeightView matrix(DType dt, int64_t rows, int64_t cols, int64_t i, int64_t* count, const uint8_t* fp8_codes = nullptr) {
  Pool& pool = Pool::get();
  const int64_t bytes = (matrix_bytes(dt, rows, cols) + 63) / 64 * 64;
  *count = static_cast<int64_t>(pool.bytes) / bytes;
  WeightView w;
  w.dtype = dt;
  w.rows = rows;
  w.cols = cols;
  w.data = pool.data + (i % *count) * bytes;
  if (dt == DType::kF8E4M3) {
    w.scale_inv = g_scales.data();
    if (fp8_codes != nullptr) w.fp8_codes = fp8_codes + (i % *count) * moe::fp8_block_codes_size(w);
  }
  if (dt == DType::kInt4) {
    w.group_size = kInt4Group;
    w.group_scale = reinterpret_cast<const uint16_t*>(static_cast<const char*>(w.data) + rows * cols / 2);
  }
  return w;
}

// A pool (MOE_BENCH_ROTATE_MIB) smaller than one matrix skips the benchmark, naming the size it needs.
bool pool_holds_one(benchmark::State& state, DType dt, int64_t rows, int64_t cols) {
  const int64_t bytes = (matrix_bytes(dt, rows, cols) + 63) / 64 * 64;  // as matrix() lays them out
  if (static_cast<size_t>(bytes) <= Pool::get().bytes) return true;
  const std::string need = std::to_string((bytes + (1 << 20) - 1) >> 20);
  state.SkipWithError(("MOE_BENCH_ROTATE_MIB holds no matrix of this shape: it needs " + need + " MiB").c_str());
  return false;
}

// x [M, cols] and y [M, rows], 64-byte aligned like the layer's workspace: a heap vector is only 16-byte
// aligned, and every 64-byte load of x then straddles two lines, which no layer call does.
struct Activations {
  std::vector<float> store;
  float *x, *y;
  Activations(int64_t M, int64_t rows, int64_t cols) : store(static_cast<size_t>(M * (cols + rows) + 32)) {
    auto* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(store.data()) + 63) & ~uintptr_t{63});
    x = base;
    y = base + (M * cols + 15) / 16 * 16;
    for (int64_t i = 0; i < M * cols; ++i) x[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
  }
};

// The ISA of the benchmark's second argument; every one this CPU has is registered (decode_args). Returns
// nullopt (the benchmark skipped) where the CPU lacks it or where it runs another ISA's kernel.
std::optional<moe::Isa> select_isa(benchmark::State& state, int64_t arg, DType dt) {
  const moe::Isa isa = static_cast<moe::Isa>(arg);
  state.SetLabel(std::string(moe::isa_name(isa)));
  if (!moe::isa_supported(isa)) {
    state.SkipWithError("ISA not supported");
    return std::nullopt;
  }
  if (isa == moe::Isa::kAvx2Int8 && dt != DType::kInt4) {
    state.SkipWithError("avx2int8 runs the avx2 kernels on these weights");
    return std::nullopt;
  }
  return isa;
}

void decode(benchmark::State& state, DType dt, int64_t rows, int64_t cols) {
  pin(state);
  const int64_t M = state.range(0);
  const std::optional<moe::Isa> chosen = select_isa(state, state.range(1), dt);
  if (!chosen) return;
  const moe::Isa isa = *chosen;
  Activations a(M, rows, cols);
  float *x = a.x, *y = a.y;
  if (!pool_holds_one(state, dt, rows, cols)) return;
  int64_t count = 0;
  matrix(dt, rows, cols, 0, &count);
  const uint8_t* codes = dt == DType::kF8E4M3 ? pool_fp8_codes(rows, cols) : nullptr;
  int64_t i = state.thread_index();
  int64_t bytes = 0;
  for (auto _ : state) {
    const WeightView w = matrix(dt, rows, cols, i, &count, codes);
    moe::linear(isa, x, M, cols, w, 0, rows, y, rows);
    benchmark::DoNotOptimize(y);
    bytes += w.bytes();
    i += state.threads();
  }
  state.SetBytesProcessed(bytes);
  state.counters["bw_frac"] =
      benchmark::Counter(static_cast<double>(bytes) / (g_bw_gbps[state.threads()] * 1e9), benchmark::Counter::kIsRate);
}

void prefill(benchmark::State& state, DType dt, int64_t rows, int64_t cols) {
  pin(state);
  const int64_t M = state.range(0);
  const std::optional<moe::Isa> chosen = select_isa(state, state.range(1), dt);
  if (!chosen) return;
  const moe::Isa isa = *chosen;
  Activations a(M, rows, cols);
  float *x = a.x, *y = a.y;
  if (!pool_holds_one(state, dt, rows, cols)) return;
  int64_t count = 0;
  const WeightView w =
      matrix(dt, rows, cols, 0, &count, dt == DType::kF8E4M3 ? pool_fp8_codes(rows, cols) : nullptr);
  const int64_t n0 = rows * state.thread_index() / state.threads();
  const int64_t n1 = rows * (state.thread_index() + 1) / state.threads();
  double flops = 0;
  for (auto _ : state) {
    moe::linear(isa, x, M, cols, w, n0, n1, y, rows);
    benchmark::DoNotOptimize(y);
    flops += 2.0 * static_cast<double>(M * (n1 - n0) * cols);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  // The peak of the instruction the kernel runs: vdpbf16ps for bf16/fp8 weights on avx512bf16, else fp32 FMA.
  const double peak = (moe::rounds_x_to_bf16(isa, dt)               ? g_peak_bf16
                       : moe::exact_isa(isa) == moe::Isa::kAvx2 ? g_peak_f32_256
                                                    : g_peak_f32)[state.threads()];
  state.counters["peak_frac"] = benchmark::Counter(flops / (peak * 1e9), benchmark::Counter::kIsRate);
}

// With --benchmark_repetitions: the least disturbed repetition (this machine is shared and noisy).
double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

void decode_args(benchmark::internal::Benchmark* b) {
  for (int64_t isa : {1, 2, 3, 4})
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 32}) b->Args({m, isa});
  b->Threads(1)->Threads(2)->UseRealTime()->MinTime(0.3)->ComputeStatistics("min", min_of);
}
void prefill_args(benchmark::internal::Benchmark* b) {
  for (int64_t isa : {1, 2, 3, 4})
    for (int64_t m : {512, 2048}) b->Args({m, isa});
  b->Threads(1)->Threads(2)->UseRealTime()->MinTime(0.5)->ComputeStatistics("min", min_of);
}

// Qwen3-Next expert gate/up [512 x 2048] and down [2048 x 512] in bf16 and int4 (groups of 32);
// DeepSeek-V3 fp8 [2048 x 7168]; Kimi-K2's int4 expert gate/up [2048 x 7168].
BENCHMARK_CAPTURE(decode, bf16_512x2048, DType::kBF16, 512, 2048)->Apply(decode_args);
BENCHMARK_CAPTURE(decode, bf16_2048x512, DType::kBF16, 2048, 512)->Apply(decode_args);
BENCHMARK_CAPTURE(decode, fp8_2048x7168, DType::kF8E4M3, 2048, 7168)->Apply(decode_args);
BENCHMARK_CAPTURE(decode, f32_512x2048, DType::kF32, 512, 2048)->Apply(decode_args);
BENCHMARK_CAPTURE(decode, int4_512x2048, DType::kInt4, 512, 2048)->Apply(decode_args);
BENCHMARK_CAPTURE(decode, int4_2048x512, DType::kInt4, 2048, 512)->Apply(decode_args);
BENCHMARK_CAPTURE(decode, int4_2048x7168, DType::kInt4, 2048, 7168)->Apply(decode_args);
BENCHMARK_CAPTURE(prefill, bf16_512x2048, DType::kBF16, 512, 2048)->Apply(prefill_args);
BENCHMARK_CAPTURE(prefill, bf16_2048x7168, DType::kBF16, 2048, 7168)->Apply(prefill_args);
BENCHMARK_CAPTURE(prefill, fp8_2048x7168, DType::kF8E4M3, 2048, 7168)->Apply(prefill_args);
BENCHMARK_CAPTURE(prefill, int4_2048x7168, DType::kInt4, 2048, 7168)->Apply(prefill_args);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  g_cpus = moe::rt::allowed_cpus();
  Pool& pool = Pool::get();  // map and fill before measuring anything
  for (int t : {1, 2}) {
    // Over the pool when it is far larger than the caches: nothing is unmapped just before the benchmarks,
    // which on a VM that hands freed memory back to the host slows what runs in the next seconds.
    g_bw_gbps[t] = moe::measure_dram_read_gbps(t, pool.data, pool.bytes);
    g_peak_f32[t] = moe::measure_peak_gflops(t, moe::PeakKind::kF32Fma);
    g_peak_f32_256[t] = moe::measure_peak_gflops(t, moe::PeakKind::kF32Fma, moe::Isa::kAvx2);
    const double bf16 = g_peak_bf16[t] = moe::measure_peak_gflops(t, moe::PeakKind::kBf16Dot);
    std::fprintf(stderr,
                 "roofline, %d thread(s): read %.1f GB/s, fp32 FMA %.0f GFLOP/s (256-bit %.0f), bf16 dot %.0f GFLOP/s\n",
                 t, g_bw_gbps[t], g_peak_f32[t], g_peak_f32_256[t], bf16);
    benchmark::AddCustomContext("read_gbps_" + std::to_string(t), std::to_string(g_bw_gbps[t]));
    benchmark::AddCustomContext("fp32_fma_gflops_" + std::to_string(t), std::to_string(g_peak_f32[t]));
    benchmark::AddCustomContext("fp32_fma_256bit_gflops_" + std::to_string(t), std::to_string(g_peak_f32_256[t]));
    benchmark::AddCustomContext("bf16_dot_gflops_" + std::to_string(t), std::to_string(bf16));
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
