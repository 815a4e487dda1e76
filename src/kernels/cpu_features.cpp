#include "kernels/cpu_features.h"

#include <cpuid.h>

#include <cstdint>

namespace moe {

namespace {

bool bit(unsigned reg, int i) { return (reg >> i) & 1u; }

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  f.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "Auth" "enti" "cAMD"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const int base_family = static_cast<int>((a >> 8) & 0xf), base_model = static_cast<int>((a >> 4) & 0xf);
  f.family = base_family == 0xf ? base_family + static_cast<int>((a >> 20) & 0xff) : base_family;
  const bool extended_model = base_family == 0xf || base_family == 0x6;
  f.model = extended_model ? base_model | static_cast<int>((a >> 16) & 0xf) << 4 : base_model;
  const bool osxsave = bit(c, 27), avx = bit(c, 28);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool ymm_state = avx && (xcr & 0x6) == 0x6;      // SSE and AVX registers saved by the OS
  const bool zmm_state = ymm_state && (xcr & 0xe0) == 0xe0;  // opmask and ZMM registers too
  f.fma = ymm_state && bit(c, 12);
  f.f16c = ymm_state && bit(c, 29);
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = ymm_state && bit(b, 5);
    f.avx512f = zmm_state && bit(b, 16);
    f.avx512dq = zmm_state && bit(b, 17);
    f.avx512bw = zmm_state && bit(b, 30);
    f.avx512vl = zmm_state && bit(b, 31);
    f.avx512vnni = zmm_state && bit(c, 11);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = zmm_state && bit(a, 5);
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures kFeatures = detect();
  return kFeatures;
}

}  // namespace moe
