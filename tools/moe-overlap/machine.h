// This machine's physical limits, as the benchmarks quote them: DRAM read bandwidth and arithmetic peak,
// measured in the running process (kernels/roofline.h). `bench` measures them in the same run it times;
// `info` reuses the last figures, cached per CPU and thread count in $XDG_CACHE_HOME/moe-overlap/machine.json
// (~/.cache/...), and measures once when there are none.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "kernels/linear.h"
#include "kernels/roofline.h"

namespace moe::tools {

struct MachineFigures {
  std::string cpu;          // model name from /proc/cpuinfo
  int threads = 0;
  double read_gbps = 0;     // sustained read bandwidth over 1 GiB (or a given buffer), `threads` readers
  std::string read_isa;     // the ISA of the read loop that measured it (kernels/roofline.h)
  std::string read_pattern;  // its access pattern, the faster of the two on this CPU (read_pattern_name)
  double fp32_gflops = 0;   // fp32 FMA peak on the widest vectors
  double avx2_fp32_gflops = 0;  // fp32 FMA peak on 256-bit vectors, the AVX2 kernels' (fp32_gflops without AVX-512)
  double bf16_gflops = 0;   // bf16 dot-product peak (0 without avx512_bf16)
  std::string isa;          // the kernels' active instruction set
  std::string isa_build;    // what its build picked by CPU check runs beyond that name (kernels' isa_build)
  bool cached = false;      // read from the cache rather than measured now

  // The peak of the arithmetic the kernels use for expert weights of `weights`: the bf16 dot product on
  // the avx512bf16 path (bf16, fp8 and int4 weights), else fp32 FMA on the kernels' vectors (the AVX2
  // kernels reach half of an AVX-512 CPU's peak). avx2int8 is quoted against the 256-bit fp32 FMA peak
  // too: its int8 products run faster than that, so of_pk can pass 100% there.
  enum class KernelPeak { kBf16Dot, kFma256, kFmaWidest };  // which of the three probes that is
  KernelPeak kernel_peak(DType weights) const {
    const std::optional<Isa> kernels = parse_isa(isa);
    if (kernels && rounds_x_to_bf16(*kernels, weights)) return KernelPeak::kBf16Dot;
    return on_256bit_vectors() && avx2_fp32_gflops > 0 ? KernelPeak::kFma256 : KernelPeak::kFmaWidest;
  }
  double kernel_peak_gflops(DType weights) const {
    switch (kernel_peak(weights)) {
      case KernelPeak::kBf16Dot: return bf16_gflops;
      case KernelPeak::kFma256: return avx2_fp32_gflops;
      case KernelPeak::kFmaWidest: break;
    }
    return fp32_gflops;
  }
  // Whether the kernels run on 256-bit vectors (avx2, and avx2int8 outside its int8 products).
  bool on_256bit_vectors() const {
    const std::optional<Isa> kernels = parse_isa(isa);
    return kernels && exact_isa(*kernels) == Isa::kAvx2;
  }
  nlohmann::json to_json() const;
};

// The CPU's model name from /proc/cpuinfo ("unknown CPU" where it has none).
std::string cpu_model();

// Measures now (takes about a second) and updates the cache. The read bandwidth is measured over
// `probe_buffer` when it is resident and large enough to read from DRAM (measure_dram_read_gbps), so that
// nothing is unmapped just before a benchmark times its calls; else over a fresh 1 GiB mapping. The read
// loop runs on `read_loop` (supported by this CPU; default the widest, read_isa()).
MachineFigures measure_machine(int threads, const void* probe_buffer = nullptr, size_t probe_bytes = 0,
                               Isa read_loop = read_isa());
// Measures again, now, the peak that m.kernel_peak_gflops(weights) quotes (the same probe on the same
// vectors, m.threads threads; about 0.4 s): `bench` repeats it through the run and quotes the best.
double measure_kernel_peak_gflops(const MachineFigures& m, DType weights);
// The cached figures for this CPU and thread count, or measure_machine(); figures a narrower read loop
// measured (or a cache that does not name its loop and pattern) are measured again.
MachineFigures cached_machine(int threads);

}  // namespace moe::tools
