// The fixed 16-lane reduction tree of the AVX-512 paths (internal to moe_kernels): halves, then quarters,
// then pairs. Both AVX-512 paths end every dot product with it, so their reductions cannot drift apart.
// Include only from files compiled with AVX-512 flags; `static` keeps one copy per such file, so copies
// built with different target flags are never merged by the linker.
#pragma once

#include <immintrin.h>

namespace moe::detail {

static inline float hsum16(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

}  // namespace moe::detail
