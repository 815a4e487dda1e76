// AVX-512 BF16 path of the linear kernel for bf16 weights: vdpbf16ps multiplies bf16 pairs into fp32
// accumulators, twice the fp32-FMA rate, so compute-bound shapes (prefill, decode with many tokens per
// matrix) run up to ~2x faster. f32 and fp8 weights take the exact fp32 path (linear_avx512.cpp).
//
// Numerics differ from the other paths: x is rounded to bf16 (round to nearest even) before the products,
// and vdpbf16ps flushes denormals. The relative error of a dot product is bounded by about 2^-8 of
// sum |x * w| (x's rounding), well inside the 1e-2 the layer tolerates; that is why this ISA is opt-in
// (set_active_isa or MOE_KERNEL_ISA=avx512bf16) and never chosen by best_isa().
// Determinism: lane j of the accumulator of (m, n) sums the pairs k = 32 i + 2 j, 2 j + 1 in ascending i,
// zero-filled past K, then the fixed 16-lane tree: the bits depend on (x row, W row) only, as required.
#include <immintrin.h>

#include <algorithm>

#include "kernels/linear_isa.h"

namespace moe::detail {

namespace {

constexpr int kStep = 32;  // k elements per vdpbf16ps

// The fixed 16-lane tree of linear_avx512.cpp.
void hsum_tree(__m512 v, float* out) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  *out = _mm_cvtss_f32(b);
}

__m512bh x_bf16(const float* p) { return _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p)); }
__m512bh x_bf16_tail(const float* p, int n) {
  const __mmask16 lo = static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1u);
  const __mmask16 hi = static_cast<__mmask16>(n <= 16 ? 0u : (1u << (n - 16)) - 1u);
  return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, p + 16), _mm512_maskz_loadu_ps(lo, p));
}
__m512bh w_bf16(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
__m512bh w_bf16_tail(const uint16_t* p, int n) {
  return (__m512bh)_mm512_maskz_loadu_epi16(static_cast<__mmask32>((uint64_t{1} << n) - 1u), p);
}

// y[t * ldy + r] for rows n .. n+R, tokens 0 .. T; the next row block is streamed into L2 meanwhile.
template <int R, int T>
void micro(const float* x, int64_t ldx, const WeightView& w, int64_t n, float* y, int64_t ldy) {
  const int64_t K = w.cols;
  const uint16_t* base = static_cast<const uint16_t*>(w.data);
  const char* next = reinterpret_cast<const char*>(base + (n + R) * K);
  const char* end = reinterpret_cast<const char*>(base + w.rows * K);
  const uint16_t* rows[R];
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    rows[r] = base + (n + r) * K;
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  int64_t k = 0;
  for (; k + kStep <= K; k += kStep) {
    if (k % 128 == 0)
      for (const char* p = next + k * R * 2; p < std::min(next + (k + 128) * R * 2, end); p += 64)
        _mm_prefetch(p, _MM_HINT_T0);
    __m512bh wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = w_bf16(rows[r] + k);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = x_bf16(x + t * ldx + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv, wv[r]);
    }
  }
  if (k < K) {
    const int rem = static_cast<int>(K - k);
    __m512bh wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = w_bf16_tail(rows[r] + k, rem);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = x_bf16_tail(x + t * ldx + k, rem);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv, wv[r]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) hsum_tree(acc[r][t], &y[t * ldy + r]);
}

template <int R>
void row_block(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n, float* y, int64_t ldy) {
  int64_t t = 0;
  for (; t + 4 <= M; t += 4) micro<R, 4>(x + t * ldx, ldx, w, n, y + t * ldy, ldy);
  switch (M - t) {
    case 3: micro<R, 3>(x + t * ldx, ldx, w, n, y + t * ldy, ldy); break;
    case 2: micro<R, 2>(x + t * ldx, ldx, w, n, y + t * ldy, ldy); break;
    case 1: micro<R, 1>(x + t * ldx, ldx, w, n, y + t * ldy, ldy); break;
    default: break;
  }
}

}  // namespace

void linear_avx512bf16(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                       float* y, int64_t ldy) {
  if (w.dtype != DType::kBF16) return linear_avx512(x, M, ldx, w, n0, n1, y, ldy);
  // Token macro-blocks whose x rows stay in about half of a 1 MiB L2 (see linear_simd.h).
  const int64_t macro = std::clamp<int64_t>((512 << 10) / (std::max<int64_t>(w.cols, 1) * 4), 4, 32) & ~3;
  for (int64_t m0 = 0; m0 < M; m0 += macro) {
    const int64_t mc = std::min(macro, M - m0);
    const float* xm = x + m0 * ldx;
    float* ym = y + m0 * ldy;
    int64_t n = n0;
    if (mc == 1)
      for (; n + 8 <= n1; n += 8) micro<8, 1>(xm, ldx, w, n, ym + (n - n0), ldy);
    for (; n + 4 <= n1; n += 4) row_block<4>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
    for (; n < n1; ++n) row_block<1>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
  }
}

}  // namespace moe::detail
