// Read-bandwidth and peak-FLOP probes (see roofline.h). The inner loops carry target attributes and are
// entered after a run-time CPU check, like the kernels.
#include "kernels/roofline.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "kernels/cpu_features.h"
#include "runtime/cpu_affinity.h"

namespace moe {

namespace {

constexpr int kPasses = 7;
constexpr size_t kHugePage = size_t{2} << 20;

bool has_avx512() { return cpu_features().avx512f; }
bool has_avx2_fma() { return cpu_features().avx2 && cpu_features().fma; }

// Two access patterns (ReadPattern, roofline.h), each on AVX-512 and AVX2 loads.
//
// kRuns reads four interleaved streams as the AVX-512 kernels' runs of rows do (linear_simd.h, run_kernel;
// the AVX2 ones prefetch into L2, 4 KiB ahead): one 64-byte line of each stream per step, each stream
// prefetched 2 KiB ahead of its reads, XORed into one accumulator per stream. The loop that read 256 bytes
// of each stream per step, 1 KiB ahead, measured 10-30% slower on an AMD EPYC (Zen 5) guest, one thread
// 28-33 GB/s against 36-39 (medians of 7 passes, five interleaved rounds), so that the kernels' reads
// measured above 100% of it.
//
// kSequential reads one stream front to back, two lines per step, with no software prefetch. On an AMD EPYC
// (Zen 4) guest it read 1.4-1.6x faster than kRuns on one thread (29-30 against 19 GB/s, medians of 15
// passes) and 1.1x on two; one line per step or four read 5% slower in some runs, and a software prefetch 1 or 4 KiB ahead
// halved it there.
constexpr int kStreams = 4;
constexpr size_t kStep = 64;     // bytes of one stream per step
constexpr size_t kAhead = 2048;  // prefetch distance, bytes

__attribute__((target("avx512f"))) uint64_t xor_lanes(__m512i v) {
  alignas(64) uint64_t out[8];
  _mm512_store_si512(out, v);
  uint64_t x = 0;
  for (uint64_t w : out) x ^= w;
  return x;
}

__attribute__((target("avx2"))) uint64_t xor_lanes(__m256i v) {
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), v);
  return out[0] ^ out[1] ^ out[2] ^ out[3];
}

__attribute__((target("avx512f"))) uint64_t read_avx512(const char* p, size_t n) {
  const size_t len = n / kStreams / kStep * kStep;
  __m512i a[kStreams];
  for (__m512i& v : a) v = _mm512_setzero_si512();
  for (size_t i = 0; i < len; i += kStep)
    for (int s = 0; s < kStreams; ++s) {
      const char* q = p + s * len + i;
      if (i + kAhead < len) _mm_prefetch(q + kAhead, _MM_HINT_T0);
      a[s] = _mm512_xor_si512(a[s], _mm512_load_si512(q));
    }
  return xor_lanes(_mm512_xor_si512(_mm512_xor_si512(a[0], a[1]), _mm512_xor_si512(a[2], a[3])));
}

__attribute__((target("avx2"))) uint64_t read_avx2(const char* p, size_t n) {
  const size_t len = n / kStreams / kStep * kStep;
  __m256i a[kStreams];
  for (__m256i& v : a) v = _mm256_setzero_si256();
  for (size_t i = 0; i < len; i += kStep)
    for (int s = 0; s < kStreams; ++s) {
      const char* q = p + s * len + i;
      if (i + kAhead < len) _mm_prefetch(q + kAhead, _MM_HINT_T0);
      const __m256i* v = reinterpret_cast<const __m256i*>(q);
      a[s] = _mm256_xor_si256(a[s], _mm256_xor_si256(_mm256_load_si256(v), _mm256_load_si256(v + 1)));
    }
  return xor_lanes(_mm256_xor_si256(_mm256_xor_si256(a[0], a[1]), _mm256_xor_si256(a[2], a[3])));
}

__attribute__((target("avx512f"))) uint64_t read_seq_avx512(const char* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0;
  for (size_t i = 0; i < n; i += 2 * kStep) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + kStep));
  }
  return xor_lanes(_mm512_xor_si512(a0, a1));
}

__attribute__((target("avx2"))) uint64_t read_seq_avx2(const char* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0;
  for (size_t i = 0; i < n; i += kStep) {
    const __m256i* v = reinterpret_cast<const __m256i*>(p + i);
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(v));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(v + 1));
  }
  return xor_lanes(_mm256_xor_si256(a0, a1));
}

// For CPUs without AVX2 only: 64-bit words (SSE2 loads where the compiler vectorises it), which on a modern
// core read slower than memory delivers.
uint64_t read_scalar(const char* p, size_t n) {
  const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i + 4 <= n / 8; i += 4) {
    a0 ^= q[i];
    a1 ^= q[i + 1];
    a2 ^= q[i + 2];
    a3 ^= q[i + 3];
  }
  return a0 ^ a1 ^ a2 ^ a3;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

volatile uint64_t g_sink;

}  // namespace

double timed_parallel(int threads, const std::function<void(int)>& body) {
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      body(t);
    });
  const std::vector<int> cpus = rt::allowed_cpus();
  for (int t = 0; t < threads; ++t) rt::pin_thread(pool[static_cast<size_t>(t)].native_handle(), t, cpus);
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}


std::string_view read_pattern_name(ReadPattern pattern) {
  return pattern == ReadPattern::kSequential ? "sequential" : "runs";
}

std::optional<ReadPattern> parse_read_pattern(std::string_view name) {
  for (ReadPattern p : {ReadPattern::kRuns, ReadPattern::kSequential})
    if (read_pattern_name(p) == name) return p;
  return std::nullopt;
}

uint64_t read_once(Isa isa, const void* p, size_t n, ReadPattern pattern) {
  const char* q = static_cast<const char*>(p);
  const bool seq = pattern == ReadPattern::kSequential;
  switch (isa) {
    case Isa::kAvx512:
    case Isa::kAvx512Bf16: return seq ? read_seq_avx512(q, n) : read_avx512(q, n);
    case Isa::kAvx2:
    case Isa::kAvx2Int8: return seq ? read_seq_avx2(q, n) : read_avx2(q, n);
    case Isa::kScalar: break;
  }
  return read_scalar(q, n);
}

double measure_read_bandwidth_gbps(int threads, const void* buffer, size_t bytes, Isa isa, ReadPattern* fastest) {
  threads = std::max(threads, 1);
  if (!isa_supported(isa)) return 0.0;
  const size_t slice = bytes / kHugePage / static_cast<size_t>(threads) * kHugePage;
  if (slice == 0) return 0.0;
  // Both patterns in every pass, the order alternating, so that a change of the machine's mode hits both.
  constexpr ReadPattern kPatterns[] = {ReadPattern::kRuns, ReadPattern::kSequential};
  std::vector<double> seconds[2];
  for (int pass = 0; pass < kPasses; ++pass)
    for (int i = 0; i < 2; ++i) {
      const int k = (pass + i) % 2;
      seconds[k].push_back(timed_parallel(threads, [&](int t) {
        const char* p = static_cast<const char*>(buffer) + static_cast<size_t>(t) * slice;
        g_sink = read_once(isa, p, slice, kPatterns[k]);
      }));
    }
  // The faster pattern by the median of the passes' paired ratios, not of each pattern's times alone: the
  // two of a pass see the same mode of the memory, and a mode that changes during the passes moves the
  // medians of the times apart (a test once saw them pick the pattern that read 0.78 of the other).
  std::vector<double> runs_over_sequential;
  for (int pass = 0; pass < kPasses; ++pass) runs_over_sequential.push_back(seconds[0][pass] / seconds[1][pass]);
  const int best = median(runs_over_sequential) > 1.0 ? 1 : 0;
  if (fastest) *fastest = kPatterns[best];
  return static_cast<double>(slice) * threads / median(seconds[best]) / 1e9;
}

double measure_dram_read_gbps(int threads, const void* buffer, size_t bytes, Isa isa, ReadPattern* fastest) {
  return buffer != nullptr && bytes >= kDramReadBytes
             ? measure_read_bandwidth_gbps(threads, buffer, bytes, isa, fastest)
             : measure_read_bandwidth_gbps(threads, size_t{1} << 30, isa, fastest);
}

double measure_read_bandwidth_gbps(int threads, size_t bytes, Isa isa, ReadPattern* fastest) {
  threads = std::max(threads, 1);
  if (!isa_supported(isa)) return 0.0;
  bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 0.0;
  madvise(mem, bytes, MADV_HUGEPAGE);
  char* buf = static_cast<char*>(mem);
  // Each thread owns a 2 MiB-aligned slice; pre-fault (and fill, so no page is the shared zero page).
  const size_t slice = bytes / kHugePage / static_cast<size_t>(threads) * kHugePage;
  timed_parallel(threads, [&](int t) {
    char* p = buf + static_cast<size_t>(t) * slice;
    for (size_t i = 0; i < slice; i += 4096) p[i] = static_cast<char>(i >> 12);
  });
  const double gbps = measure_read_bandwidth_gbps(threads, buf, bytes, isa, fastest);
  munmap(mem, bytes);
  return gbps;
}

namespace {

constexpr int64_t kPeakIters = 20'000'000;

// 12 independent chains cover a 4-cycle latency on 2-3 pipes.
__attribute__((target("avx512f,fma"))) float fma_avx512(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];  // (not _mm512_reduce_add_ps: it trips -Wuninitialized in GCC 12 headers)
  _mm512_store_ps(out, s);
  return out[0];
}

__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0];
}

__attribute__((target("avx512f,avx512bf16"))) float dot_bf16(int64_t iters) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a83);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];  // (not _mm512_reduce_add_ps: it trips -Wuninitialized in GCC 12 headers)
  _mm512_store_ps(out, s);
  return out[0];
}

}  // namespace

double measure_peak_gflops(int threads, PeakKind kind, Isa isa) {
  threads = std::max(threads, 1);
  double flops_per_iter = 0;  // per thread, 12 chains
  float (*fn)(int64_t) = nullptr;
  const bool wide = isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16;
  if (kind == PeakKind::kBf16Dot) {
    if (!has_avx512() || !cpu_features().avx512bf16) return 0.0;
    fn = dot_bf16, flops_per_iter = 12.0 * 16 * 4;
  } else if (wide && has_avx512()) {
    fn = fma_avx512, flops_per_iter = 12.0 * 16 * 2;
  } else if ((wide || exact_isa(isa) == Isa::kAvx2) && has_avx2_fma()) {
    fn = fma_avx2, flops_per_iter = 12.0 * 8 * 2;
  } else {
    return 0.0;
  }
  // Size the passes to ~50 ms from a short calibration run.
  const int64_t probe = kPeakIters / 100;
  const double t_probe = timed_parallel(1, [&](int) { g_sink = static_cast<uint64_t>(fn(probe)); });
  const int64_t iters = std::max<int64_t>(probe, static_cast<int64_t>(probe * 0.05 / std::max(t_probe, 1e-6)));
  std::vector<double> seconds;
  for (int pass = 0; pass < kPasses; ++pass)
    seconds.push_back(timed_parallel(threads, [&](int) { g_sink = static_cast<uint64_t>(fn(iters)); }));
  return flops_per_iter * static_cast<double>(iters) * threads / median(seconds) / 1e9;
}

}  // namespace moe
