// Seeded layer inputs shared by the layer test binaries: xorshift64 values uniform in [lo, hi), so every test
// that names a seed sees the same activations.
#pragma once

#include <cstdint>
#include <vector>

namespace moe {

inline std::vector<float> random_input(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> x(static_cast<size_t>(n));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& v : x) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    v = lo + (hi - lo) * static_cast<float>(s >> 40) / static_cast<float>(1 << 24);
  }
  return x;
}

}  // namespace moe
