// Roofline probes measured in the running process: sustained DRAM read bandwidth and the arithmetic peak,
// so that benchmarks can state achieved figures as fractions of what this machine can do right now.
//
// Both spawn `threads` std::threads (each reading its own slice, or running its own FMA chains), take the
// median of several passes, and must not run concurrently with other heavy work. They allocate and may
// take a few hundred milliseconds; call them outside timed regions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "kernels/linear.h"

namespace moe {

// The ISA of the read loop the probes use by default: the widest loads this CPU has (best_isa()). A narrower
// loop can read slower than memory delivers (the scalar one, 8- or at best 16-byte loads, read 30-55% slower
// than the AVX2 and AVX-512 ones on an AVX-512 CPU), which understates the bandwidth and overstates every
// fraction of it.
inline Isa read_isa() { return best_isa(); }

// The read loop's two access patterns. kRuns: four interleaved streams, one line of each per step, each
// prefetched 2 KiB ahead (the kernels' runs of rows read so). kSequential: one stream front to back, no
// software prefetch. Which one reads faster depends on the CPU (roofline.cpp has the figures), so the probes
// time both and report the faster: a pattern this CPU reads slowly would understate the bandwidth and
// overstate every fraction of it.
enum class ReadPattern : uint8_t { kRuns, kSequential };
std::string_view read_pattern_name(ReadPattern pattern);  // "runs", "sequential"
std::optional<ReadPattern> parse_read_pattern(std::string_view name);

// The probes read with read_once() on `isa` (default read_isa()), both patterns in every pass; with an ISA
// this CPU lacks they return 0. They return the faster pattern's median GB/s (faster by the median of the
// passes' paired ratios) and, if `fastest` is given, store that pattern there.
//
// GB/s (1e9 bytes/s) reading `bytes` (default 1 GiB, far above any last-level cache and the region where
// repeated reads still run from cache) from an anonymous mapping advised for transparent
// huge pages and pre-faulted outside the timed region. Returns 0 if the buffer cannot be mapped.
double measure_read_bandwidth_gbps(int threads, size_t bytes = size_t{1} << 30, Isa isa = read_isa(),
                                   ReadPattern* fastest = nullptr);
// The same over an existing buffer (64-byte aligned, resident, not the shared zero page; each thread reads
// its own 2 MiB-aligned slice); 0 if it is smaller than 2 MiB per thread. Nothing is mapped or unmapped:
// on a VM that hands freed memory back to the host, a large unmap just before timing slows what follows.
double measure_read_bandwidth_gbps(int threads, const void* buffer, size_t bytes, Isa isa = read_isa(),
                                   ReadPattern* fastest = nullptr);
// A buffer at least this large is read from DRAM (working sets of 64 MiB were seen to stay in cache), so a
// read of it measures the read bandwidth; under it, the fresh 1 GiB probe is the one that measures.
inline constexpr size_t kDramReadBytes = size_t{128} << 20;
// The read bandwidth over `buffer` when it is at least kDramReadBytes (nothing mapped or unmapped), else
// (a smaller buffer, or none) over a fresh 1 GiB.
double measure_dram_read_gbps(int threads, const void* buffer, size_t bytes, Isa isa = read_isa(),
                              ReadPattern* fastest = nullptr);

// The probe's read loop over [p, p + n), p 64-byte aligned and n a multiple of 1 KiB: every byte is loaded
// once, and the result is the XOR of all the 64-bit words, so no read can be dropped. Timed over a buffer far
// larger than the caches, it measures the read bandwidth of the moment. `isa` must be supported
// (isa_supported): kAvx512 and kAvx512Bf16 run 512-bit loads, kAvx2 and kAvx2Int8 256-bit ones, kScalar 64-bit words (one
// pattern only); the result is the same on every ISA and pattern.
uint64_t read_once(Isa isa, const void* p, size_t n, ReadPattern pattern = ReadPattern::kRuns);
inline uint64_t read_once(const void* p, size_t n) { return read_once(read_isa(), p, n); }

// Seconds from releasing `threads` threads together until the last one returns from body(thread_index).
// Thread start-up is outside the timed region; the threads are pinned like the CPU device's workers, so the
// figures are those the workers can reach. Every probe here is timed with it.
double timed_parallel(int threads, const std::function<void(int)>& body);

enum class PeakKind {
  kF32Fma,   // fp32 fused multiply-add, 2 flops per lane
  kBf16Dot,  // vdpbf16ps: bf16 pairs into fp32, 4 flops per fp32 lane (0 where the CPU lacks avx512_bf16)
};

// GFLOP/s with independent accumulator chains per thread. kF32Fma runs on the vectors of `isa` (512-bit for
// both AVX-512 ISAs, 256-bit for avx2: on an AVX-512 CPU the AVX2 kernels' peak is half the machine's);
// 0 for scalar or an ISA this CPU lacks. kBf16Dot needs avx512_bf16 whatever `isa` says.
double measure_peak_gflops(int threads, PeakKind kind, Isa isa = best_isa());

}  // namespace moe
