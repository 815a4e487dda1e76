// AVX-512 (F/BW/VL/DQ + FMA) linear kernel for int4 group-quantised weights (compressed-tensors
// pack-quantized, dtype.h), exact fp32: 16 fp32 lanes, weights decoded in registers from the packed words,
// never unpacked into memory. Compiled with its own target flags (src/kernels/CMakeLists.txt) and only called
// after a run-time CPU check (linear.cpp). The walk over rows, blocks and tokens is int4_avx512.h's; this file
// is its exact product.
//
// x is transposed once per call (xt, a stack buffer): xt[b][i][l] = x[128b + 8l + i], zero past K, so that
// step i of block b (field i of every word) meets its columns lane by lane. Decoding, 2 instructions per 16
// weights: the shift, and one vpermps of the 16 values -8..7 indexed by the low 4 bits of each lane
// (field - 8, exact); then one fp32 FMA per 16 weights and token. With one nonzero x the product is the
// weight exactly: value * scale has at most 12 significant bits.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/int4_avx512.h"
#include "kernels/linear_isa.h"

namespace moe::detail {

namespace {

// The exact product: fp32 x, 8 steps of 16 columns per block.
struct ExactDot {
  using XElem = float;
  using XVec = __m512;
  static constexpr int kSteps = 8;
  static constexpr bool kLongRowRuns = true;  // int4_avx512.h, linear_int4_avx512_with
  static constexpr int64_t kXElems = 32 * 1024;  // 128 KiB of stack
  __m512 values = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);  // field f -> f - 8

  static int64_t row_stride(int64_t blocks) { return blocks * kInt4BlockCols; }
  XVec load_x(const float* p) const { return _mm512_loadu_ps(p); }
  __m512 decode(__m512i words, int i) const {  // vpermps reads the low 4 bits of each lane of the shifted word
    return _mm512_permutexvar_ps(i == 0 ? words : _mm512_srli_epi32(words, static_cast<unsigned>(4 * i)), values);
  }
  __m512 madd(__m512 part, __m512 x, __m512 v, bool first) const {
    return first ? _mm512_mul_ps(x, v) : _mm512_fmadd_ps(x, v, part);
  }

  // T tokens of x into xt, each token's blocks * 128 floats ldxt apart.
  static void convert_x(const float* x, int64_t T, int64_t ldx, int64_t K, int64_t blocks, float* xt,
                        int64_t ldxt) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(8));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < blocks; ++b) {
        const float* src = x + t * ldx + b * kInt4BlockCols;
        const int64_t left = std::min<int64_t>(16, (K - b * kInt4BlockCols) / 8);  // words, K % 8 == 0
        const __mmask16 m = static_cast<__mmask16>((1u << left) - 1u);
        for (int i = 0; i < kSteps; ++i)
          _mm512_storeu_ps(xt + t * ldxt + b * kInt4BlockCols + i * 16,
                           _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, src + i, 4));
      }
  }
};

}  // namespace

void linear_int4_avx512(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                        float* y, int64_t ldy) {
  if (!linear_int4_avx512_with(ExactDot{}, x, M, ldx, w, n0, n1, y, ldy))
    linear_scalar(x, M, ldx, w, n0, n1, y, ldy);
}

}  // namespace moe::detail
