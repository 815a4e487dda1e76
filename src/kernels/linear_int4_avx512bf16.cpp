// AVX-512 BF16 linear kernel for int4 group-quantised weights (compressed-tensors pack-quantized, dtype.h):
// the avx512bf16 ISA's product on the walk of int4_avx512.h. vdpbf16ps multiplies 32 bf16 pairs into 16 fp32
// lanes, so a step covers 32 weights with one decoding and one product per token where the exact kernel
// (linear_int4_avx512.cpp) needs two of each: at 1-2 tokens that kernel is bound by its instructions, not by
// the memory.
//
// Numerics, as for bf16 and fp8 weights on this ISA (opt-in, linear_avx512bf16.cpp): x is rounded to bf16
// (round to nearest even) once per call; the weights are exact (every value -8..7 is a bf16); each product is
// exact in fp32 and vdpbf16ps adds it with one rounding, flushing denormals; the block sum times the group
// scale is an fp32 FMA. Relative error of a dot product about 2^-8 of sum |x * w|. With one nonzero x that is
// a bf16 the result is the weight exactly.
//
// Layout. The 64 bytes of a 128-column block are 32 half-words; half-word 2l + h of word l holds the fields
// 4h .. 4h + 3 (columns 8l + 4h .. 8l + 4h + 3). Step i (i < 4) shifts every half-word right by 4i and looks
// the low 4 bits up in a 32-entry table of bf16 values (vpermw reads 5 bits: the table repeats), so half-word
// 2l + h holds column 8l + 4h + i; vdpbf16ps adds that pair into fp32 lane l. x is converted once per call:
// xb[b][i][2l + h] = bf16(x[128b + 8l + 4h + i]), zero past K.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/int4_avx512.h"
#include "kernels/linear_isa.h"

namespace moe::detail {

namespace {

struct Bf16Dot {
  using XElem = uint16_t;
  using XVec = __m512bh;
  static constexpr int kSteps = 4;
  static constexpr bool kLongRowRuns = false;  // int4_avx512.h, linear_int4_avx512_with
  static constexpr int64_t kXElems = 64 * 1024;  // 128 KiB of stack
  __m512i values;  // half-word j: bf16 of (j % 16) - 8

  Bf16Dot() {
    alignas(64) uint16_t t[32];
    for (int j = 0; j < 32; ++j) t[j] = bf16_of_small_int((j & 15) - 8);
    values = _mm512_load_si512(t);
  }
  // -8..7 as bf16: sign, exponent, and the bits below the leading one (at most 3 here).
  static uint16_t bf16_of_small_int(int v) {
    if (v == 0) return 0;
    const unsigned mag = static_cast<unsigned>(v < 0 ? -v : v);
    const int e = 31 - __builtin_clz(mag);
    const unsigned mant = (mag - (1u << e)) << (7 - e);
    return static_cast<uint16_t>((v < 0 ? 0x8000u : 0u) | (static_cast<unsigned>(127 + e) << 7) | mant);
  }
  // Rows of 4 KiB (K = 2048) would put a column of every x row and every weight row in the same L1 set, as
  // in linear_avx512bf16.cpp's convert_x: such rows are 64 bytes further apart.
  static int64_t row_stride(int64_t blocks) {
    const int64_t n = blocks * kInt4BlockCols;
    return n % 2048 == 0 ? n + 32 : n;
  }
  XVec load_x(const uint16_t* p) const { return (__m512bh)_mm512_loadu_si512(p); }
  __m512bh decode(__m512i words, int i) const {
    return (__m512bh)_mm512_permutexvar_epi16(i == 0 ? words : _mm512_srli_epi16(words, static_cast<unsigned>(4 * i)),
                                             values);
  }
  __m512 madd(__m512 part, __m512bh x, __m512bh v, bool first) const {
    return _mm512_dpbf16_ps(first ? _mm512_setzero_ps() : part, x, v);
  }

  // T tokens of x, rounded to bf16, into xb in the layout above, each token ldxb elements apart.
  static void convert_x(const float* x, int64_t T, int64_t ldx, int64_t K, int64_t blocks, uint16_t* xb,
                        int64_t ldxb) {
    // Lane p < 16 of the low gather: column 8 (p / 2) + 4 (p % 2); the high gather: 64 columns on.
    const __m512i lo_idx = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60);
    const __m512i hi_idx = _mm512_add_epi32(lo_idx, _mm512_set1_epi32(64));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < blocks; ++b) {
        const float* src = x + t * ldx + b * kInt4BlockCols;
        const int64_t left = std::min<int64_t>(16, (K - b * kInt4BlockCols) / 8);  // words, K % 8 == 0
        // Lane p of the low gather reads word p / 2, of the high one word 8 + p / 2.
        const auto lanes = [](int64_t words) {
          return words >= 8 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (2 * words)) - 1u);
        };
        const __mmask16 mlo = lanes(left), mhi = lanes(std::max<int64_t>(0, left - 8));
        for (int i = 0; i < kSteps; ++i) {
          const __m512 lo = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mlo, lo_idx, src + i, 4);
          const __m512 hi = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mhi, hi_idx, src + i, 4);
          _mm512_storeu_si512(xb + t * ldxb + b * kInt4BlockCols + i * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
      }
  }
};

}  // namespace

void linear_int4_avx512bf16(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                            float* y, int64_t ldy) {
  if (!linear_int4_avx512_with(Bf16Dot{}, x, M, ldx, w, n0, n1, y, ldy))
    linear_scalar(x, M, ldx, w, n0, n1, y, ldy);
}

}  // namespace moe::detail
