// The fixed 16-lane reduction tree of the AVX-512 paths (internal to moe_kernels): halves, then quarters,
// then pairs. Both AVX-512 paths end every dot product with it, so their reductions cannot drift apart;
// the avx512 path runs it on several accumulators at once (hsum16_acc, hsum16_mem), with the same bits.
// Include only from files compiled with AVX-512 flags; `static` keeps one copy per such file, so copies
// built with different target flags are never merged by the linker.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace moe::detail {

static inline float hsum16(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

// hsum16 of N <= 16 vectors at once, every sum bitwise equal to hsum16(v[i]): each level adds the same
// lane pairs in the same operand order (lane j, then lane j + 8 / 4 / 2 / 1), with the partial sums of
// two vectors packed into one register, so 16 sums cost 31 shuffles and 15 adds instead of 64 and 64.
// v[i]'s sum ends in lane 4 * (i % 4) + i / 4 of the result. An odd vector out at a level is paired with
// itself (the duplicate lanes are never read).
template <int N>
static inline __m512 hsum16_tree(const __m512* v) {
  static_assert(N >= 1 && N <= 16);
  constexpr int N1 = (N + 1) / 2, N2 = (N1 + 1) / 2, N3 = (N2 + 1) / 2;
  __m512 a[N1], b[N2], c[N3];
  // Halves: lanes 0-7 of a[p] are v[2p]'s j + (j + 8), lanes 8-15 v[2p + 1]'s.
#pragma GCC unroll 8
  for (int p = 0; p < N1; ++p) {
    const __m512 u = v[2 * p], w = 2 * p + 1 < N ? v[2 * p + 1] : u;
    a[p] = _mm512_add_ps(_mm512_shuffle_f32x4(u, w, 0x44), _mm512_shuffle_f32x4(u, w, 0xEE));
  }
  // Quarters: 128-bit lane i of b[q] holds vector 4q + i's j + (j + 4).
#pragma GCC unroll 8
  for (int q = 0; q < N2; ++q) {
    const __m512 u = a[2 * q], w = 2 * q + 1 < N1 ? a[2 * q + 1] : u;
    b[q] = _mm512_add_ps(_mm512_shuffle_f32x4(u, w, 0x88), _mm512_shuffle_f32x4(u, w, 0xDD));
  }
  // Pairs: in 128-bit lane i of c[s], lanes 0-1 are vector 8s + i's j + (j + 2), lanes 2-3 vector 8s + 4 + i's.
#pragma GCC unroll 8
  for (int s = 0; s < N3; ++s) {
    const __m512 u = b[2 * s], w = 2 * s + 1 < N2 ? b[2 * s + 1] : u;
    c[s] = _mm512_add_ps(_mm512_shuffle_ps(u, w, 0x44), _mm512_shuffle_ps(u, w, 0xEE));
  }
  // Last pair: lane m of 128-bit lane i is vector 4m + i's sum.
  const __m512 u = c[0], w = N3 > 1 ? c[1] : u;
  return _mm512_add_ps(_mm512_shuffle_ps(u, w, 0x88), _mm512_shuffle_ps(u, w, 0xDD));
}

// The permutation that moves the sums of v[g * R .. g * R + R) of hsum16_tree's result to lanes 0 .. R.
template <int R>
struct alignas(64) HsumGather {
  int32_t idx[16][16];
  constexpr HsumGather() : idx{} {
    for (int g = 0; g * R < 16; ++g)
      for (int r = 0; r < 16; ++r) {
        const int i = std::min(g * R + r, 15);
        idx[g][r] = 4 * (i % 4) + i / 4;
      }
  }
};

// y[g * ldy + r] = hsum16(v[g * R + r]) for r < R, g < G (R rows of G tokens' accumulators), bitwise.
template <int R, int G>
static inline void hsum16_rows(const __m512* v, float* y, int64_t ldy) {
  static_assert(R >= 1 && G >= 1 && R * G <= 16);
  if constexpr (R * G == 1) {
    y[0] = hsum16(v[0]);
  } else {
    static constexpr HsumGather<R> kGather{};
    const __m512 s = hsum16_tree<R * G>(v);
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g) {
      const __m512i idx = _mm512_load_si512(kGather.idx[g]);
      _mm512_mask_storeu_ps(y + g * ldy, static_cast<__mmask16>((1u << R) - 1u), _mm512_permutexvar_ps(idx, s));
    }
  }
}

// y[t * ldy + r * stride] = hsum16(acc[r][t]) for r < R, t in [T0, T): whole tokens' R rows, up to 16 sums
// at once. kStrided = false: stride is 1 and each token's R sums go out in one masked store (hsum16_rows).
// kStrided: the rows of runs, `stride` rows apart; the tree's vector goes to a local buffer in one full
// store and the sums are copied out of it. The run kernels used to take the masked store into a local
// array: a load is not forwarded from a masked store, so every call waited for it to reach the cache (int4
// 2048x512 at one token, one thread, in L3 on a Zen 5: about a tenth of the time). Storing each lane with
// vextractps measured the same there, and 10-25% slower where it was inlined into the AVX-512 float
// kernels' 5-6 token runs (bf16 2048x512 from DRAM).
template <int R, int T, bool kStrided, int T0 = 0>
static inline void hsum16_acc_groups(const __m512 (&acc)[R][T], float* y, int64_t ldy, int64_t stride) {
  if constexpr (T0 < T) {
    constexpr int G = std::clamp(16 / R, 1, T - T0);
    __m512 v[G * R];
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) v[g * R + r] = acc[r][T0 + g];
    if constexpr (!kStrided) {
      hsum16_rows<R, G>(v, y + T0 * ldy, ldy);
    } else if constexpr (G * R == 1) {
      y[T0 * ldy] = hsum16(v[0]);
    } else {
      alignas(64) float all[16];
      _mm512_store_ps(all, hsum16_tree<G * R>(v));
#pragma GCC unroll 16
      for (int i = 0; i < G * R; ++i) y[(T0 + i / R) * ldy + (i % R) * stride] = all[4 * (i % 4) + i / 4];
    }
    hsum16_acc_groups<R, T, kStrided, T0 + G>(acc, y, ldy, stride);
  }
}

// y[t * ldy + r] = hsum16(acc[r][t]): R adjacent rows.
template <int R, int T>
static inline void hsum16_acc(const __m512 (&acc)[R][T], float* y, int64_t ldy) {
  hsum16_acc_groups<R, T, false>(acc, y, ldy, 1);
}

// y[t * ldy + r * stride] = hsum16(acc[r][t]): the rows of runs.
template <int R, int T>
static inline void hsum16_acc_strided(const __m512 (&acc)[R][T], float* y, int64_t ldy, int64_t stride) {
  hsum16_acc_groups<R, T, true>(acc, y, ldy, stride);
}

// The same for M tokens' accumulators parked in memory as [t][r][16] (a group's vectors are consecutive).
template <int R>
static inline void hsum16_mem(const float* acc_mem, int64_t M, float* y, int64_t ldy) {
  const auto sums = [&](int64_t t, auto group) {
    constexpr int G = decltype(group)::value;
    __m512 v[G * R];
#pragma GCC unroll 16
    for (int i = 0; i < G * R; ++i) v[i] = _mm512_loadu_ps(acc_mem + (t * R + i) * 16);
    hsum16_rows<R, G>(v, y + t * ldy, ldy);
  };
  constexpr int G = std::max(1, 16 / R);
  int64_t t = 0;
  for (; t + G <= M; t += G) sums(t, std::integral_constant<int, G>{});
  for (; t < M; ++t) sums(t, std::integral_constant<int, 1>{});
}

}  // namespace moe::detail
