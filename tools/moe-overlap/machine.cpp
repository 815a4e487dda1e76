#include "machine.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/linear.h"
#include "kernels/roofline.h"
#include "output_file.h"

namespace moe::tools {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown CPU";
}

namespace {

std::filesystem::path cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::filesystem::path base = xdg && *xdg ? xdg : home && *home ? std::filesystem::path(home) / ".cache" : "/tmp";
  return base / "moe-overlap" / "machine.json";
}

std::string cache_key(const std::string& cpu, int threads) { return cpu + " / " + std::to_string(threads) + " threads"; }

nlohmann::json read_cache() {
  std::ifstream in(cache_path());
  if (!in) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}

}  // namespace

nlohmann::json MachineFigures::to_json() const {
  return {{"cpu", cpu},
          {"threads", threads},
          {"read_gbps", read_gbps},
          {"read_isa", read_isa},
          {"read_pattern", read_pattern},
          {"fp32_fma_gflops", fp32_gflops},
          {"fp32_fma_256bit_gflops", avx2_fp32_gflops},
          {"bf16_dot_gflops", bf16_gflops},
          {"isa", isa},
          {"isa_build", isa_build},
          {"cached", cached}};
}

MachineFigures measure_machine(int threads, const void* probe_buffer, size_t probe_bytes, Isa read_loop) {
  MachineFigures m;
  m.cpu = cpu_model();
  m.threads = threads;
  ReadPattern pattern = ReadPattern::kRuns;
  m.read_gbps = measure_dram_read_gbps(threads, probe_buffer, probe_bytes, read_loop, &pattern);
  m.read_isa = std::string(isa_name(read_loop));
  m.read_pattern = std::string(read_pattern_name(pattern));
  m.fp32_gflops = measure_peak_gflops(threads, PeakKind::kF32Fma);
  m.avx2_fp32_gflops =
      best_isa() == Isa::kAvx2 ? m.fp32_gflops : measure_peak_gflops(threads, PeakKind::kF32Fma, Isa::kAvx2);
  m.bf16_gflops = measure_peak_gflops(threads, PeakKind::kBf16Dot);
  m.isa = std::string(isa_name(best_isa()));  // the caller names the ISA its kernels run, if another
  if (read_loop != read_isa()) return m;  // the cache keeps the widest loop's figures only
  try {  // the cache is a convenience: failing to write it is not an error
    nlohmann::json cache = read_cache();
    cache[cache_key(m.cpu, threads)] = m.to_json();
    std::filesystem::create_directories(cache_path().parent_path());
    write_file_atomically(cache_path().string(), cache.dump(1));
  } catch (const std::exception&) {
  }
  return m;
}

double measure_kernel_peak_gflops(const MachineFigures& m, DType weights) {
  switch (m.kernel_peak(weights)) {
    case MachineFigures::KernelPeak::kBf16Dot: return measure_peak_gflops(m.threads, PeakKind::kBf16Dot);
    case MachineFigures::KernelPeak::kFma256: return measure_peak_gflops(m.threads, PeakKind::kF32Fma, Isa::kAvx2);
    case MachineFigures::KernelPeak::kFmaWidest: break;
  }
  return measure_peak_gflops(m.threads, PeakKind::kF32Fma);
}

MachineFigures cached_machine(int threads) {
  const std::string cpu = cpu_model();
  const nlohmann::json cache = read_cache();
  const auto it = cache.find(cache_key(cpu, threads));
  const std::string loop(isa_name(read_isa()));
  // A cache without a read pattern was measured with the runs pattern alone, which some CPUs read slowly.
  if (it != cache.end() && it->is_object() && it->value("read_gbps", 0.0) > 0 && it->value("read_isa", "") == loop &&
      parse_read_pattern(it->value("read_pattern", ""))) {
    MachineFigures m;
    m.cpu = cpu;
    m.threads = threads;
    m.read_gbps = it->value("read_gbps", 0.0);
    m.read_isa = loop;
    m.read_pattern = it->value("read_pattern", "");
    m.fp32_gflops = it->value("fp32_fma_gflops", 0.0);
    m.avx2_fp32_gflops = it->value("fp32_fma_256bit_gflops", 0.0);
    m.bf16_gflops = it->value("bf16_dot_gflops", 0.0);
    m.isa = std::string(isa_name(best_isa()));
    m.cached = true;
    return m;
  }
  return measure_machine(threads);
}

}  // namespace moe::tools
