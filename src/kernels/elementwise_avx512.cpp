// AVX-512 elementwise kernels, 16 lanes at a time: scale_add (y = r + a * x, product then sum, as the scalar
// path rounds them), weighted_rows_sum (the combine: scale_add over k gathered rows, y written once) and
// SiLU-and-multiply, h = silu(g) * u with silu(z) = z / (1 + exp(-z)).
// exp is Cephes' expf scheme: n = round(x log2 e), r = x - n ln 2 in two parts (Cody-Waite), a degree-6
// polynomial on |r| <= ln2 / 2 (relative error below 2^-22), then 2^n applied by vscalefps, which also
// gives inf and 0 past the float range and keeps NaN. The division and the product are IEEE operations in
// the scalar path's order, so the result differs from it only through exp's last bits (tested against
// the scalar path and the fp64 formula). Compiled with its own target flags; called after a CPU check.
#include <immintrin.h>

#include "kernels/linear_isa.h"

namespace moe::detail {

namespace {

__m512 exp16(__m512 x) {
  // exp saturates past this range (0 below, inf above); clamping first keeps r finite for infinities and
  // huge inputs. The operand order makes both min and max pass a NaN through.
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);  // p * 2^n: inf past the float range, denormal or 0 below it
}

__m512 silu_mul16(__m512 g, __m512 u) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

}  // namespace

void scale_add_avx512(float* y, const float* r, const float* x, float a, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(r + i), _mm512_mul_ps(av, _mm512_loadu_ps(x + i))));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + i), _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m, x + i)));
    _mm512_mask_storeu_ps(y + i, m, v);
  }
}

// All k slots per 16 lanes in one register: y is written once instead of read and written per slot, and
// the slots' rows stream side by side. 0 + p == p, so starting from a zero register gives scale_add's bits.
void weighted_rows_sum_avx512(float* y, const float* x, int64_t ldx, const int32_t* rows, const float* a, int64_t k,
                              int64_t n) {
  const auto sum16 = [&](int64_t i, __mmask16 m) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; ++j)
      if (rows[j] >= 0)
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(a[j]), _mm512_maskz_loadu_ps(m, x + rows[j] * ldx + i)));
    return acc;
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, sum16(i, 0xffff));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, m, sum16(i, m));
  }
}

void silu_mul_avx512(const float* g, const float* u, float* h, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(h + i, silu_mul16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(h + i, m, silu_mul16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

}  // namespace moe::detail
