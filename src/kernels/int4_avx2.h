// What the two AVX2 int4 kernels share (internal to moe_kernels; included by linear_int4_avx2.cpp and
// linear_int4_avx2int8.cpp, both compiled with the AVX2 flags; internal linkage all the same): 64-column
// blocks of 8 words, the scale vector of a block, the masked load of a partial block and the 8-lane tree.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"
#include "kernels/int4_rows.h"

namespace moe::detail {
namespace {

constexpr int64_t kInt4Avx2BlockCols = 64;  // 8 words: one 32-byte load

inline float scale_at(const uint16_t* row_scales, int64_t i, int64_t n) { return i < n ? bf16_to_f32(row_scales[i]) : 0.0f; }

// Lane l = the scale of column 64b + 8l; zero past K.
inline __m256 scale_vector(const Int4Matrix& w, const uint16_t* row_scales, int64_t b) {
  if (w.group == 32) {
    const __m128 lo = _mm_set1_ps(scale_at(row_scales, 2 * b, w.scales_per_row));
    const __m128 hi = _mm_set1_ps(scale_at(row_scales, 2 * b + 1, w.scales_per_row));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
  }
  return _mm256_set1_ps(bf16_to_f32(row_scales[b * kInt4Avx2BlockCols / w.group]));  // K % 64 == 0: no partial block
}

// The same for a whole block (all 64 columns within K), without the bounds checks: a bf16 is the top half of
// its fp32. Groups of 32: one 32-bit load holds both scales; one byte shuffle puts the first in the top
// halves of lanes 0-3, the second in 4-7. kGroup32: the caller has checked that w.group is 32, so that no
// test of it is left in its loop (where GCC placed the common case out of line, two taken jumps per block).
template <bool kGroup32 = false>
inline __m256 whole_block_scales(const Int4Matrix& w, const uint16_t* row_scales, int64_t b) {
  if (kGroup32 || w.group == 32) {
    const __m256i spread = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 0, 1, -1, -1, 0, 1, -1, -1, 0, 1,  //
                                            -1, -1, 2, 3, -1, -1, 2, 3, -1, -1, 2, 3, -1, -1, 2, 3);
    uint32_t two;
    std::memcpy(&two, row_scales + 2 * b, 4);
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(two)), spread));
  }
  return _mm256_castsi256_ps(
      _mm256_set1_epi32(static_cast<int>(uint32_t{row_scales[(b * kInt4Avx2BlockCols) >> w.group_shift]} << 16)));
}

// The fixed 8-lane tree: halves, then pairs of pairs, then the last pair.
inline float hsum8(__m256 v) {
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

// The lanes of the first `left` (< 8) words of a partial block, for _mm256_maskload_epi32.
inline __m256i word_mask(int64_t left) {
  alignas(32) static constexpr int32_t kOnes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kOnes + 8 - left));
}

}  // namespace
}  // namespace moe::detail
