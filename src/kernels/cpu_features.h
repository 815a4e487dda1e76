// What this CPU (and the OS, for the register state) supports, read with CPUID/XGETBV. Both GCC and clang
// compile it (clang 14's __builtin_cpu_supports knows neither "f16c" nor "avx512bf16").
#pragma once

namespace moe {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512bf16 = false;
  bool avx512vnni = false;  // vpdpbusd; with avx512vl also on 256-bit vectors
  // Vendor, and the family and model as the vendors number them (base + extended fields): AMD Zen 3 and Zen 4
  // are family 0x19, Zen 5 0x1a. For tuning choices that differ by microarchitecture, never for correctness.
  bool amd = false;
  int family = 0, model = 0;
};

// Detected once; AVX and AVX-512 flags are cleared when the OS does not save their registers.
const CpuFeatures& cpu_features();

}  // namespace moe
