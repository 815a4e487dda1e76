// AVX-512 (F/BW/VL/DQ + FMA) linear kernel for int4 group-quantised weights (compressed-tensors
// pack-quantized, dtype.h): 16 fp32 lanes, weights decoded in registers from the packed words, never
// unpacked into memory. Compiled with its own target flags (src/kernels/CMakeLists.txt) and only called after
// a run-time CPU check (linear.cpp); both AVX-512 ISAs run it (int4 is never rounded to bf16).
//
// Column order. A 64-byte load holds the 16 words of a 128-column block, word l holding columns 8l .. 8l+7.
// Shifting every lane right by 4i exposes field i of each word: lane l holds column 8l + i. So the kernel
// walks a block as 8 vectors i = 0..7 whose lane l is column 8l + i, and x is transposed into that order once
// per call (xt, a stack buffer): xt[b][i][l] = x[128b + 8l + i], zero past K. A group of g >= 32 columns (a
// power of two) covers whole words, so lane l has one scale for all 8 vectors of a block.
//
// Decoding, 2 instructions per 16 weights: the shift, and one vpermps of the 16 values -8..7 indexed by the
// low 4 bits of each lane (field - 8, exact). Each lane sums x * value over the block's 8 vectors (part),
// and the block's sum is multiplied by the lane's bf16 group scale into the accumulator: one FMA per
// 128 columns, the scale never multiplied into the 16 weights one by one.
//
// Determinism contract: y[m, n] is accumulated in one vector whose lane l adds, block by block ascending,
// part * scale with part = x * value over i = 0..7 (fp32 FMA; lanes past K add +-0), then reduced by the
// fixed 16-lane tree of avx512_hsum.h. Blocking over rows and tokens changes only how many accumulators are
// live, so the bits depend on (x row, W row) alone. (With one nonzero x the product is the weight exactly:
// value * scale has at most 12 significant bits.)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/avx512_hsum.h"
#include "kernels/int4_rows.h"
#include "kernels/linear_isa.h"

namespace moe::detail {

namespace {

constexpr int64_t kBlockCols = 128;  // 16 words
constexpr int64_t kXtFloats = 32 * 1024;  // transposed x of up to this many floats: 128 KiB of stack

// The matrix and, for groups under 128 columns, lane l's scale within a block's group scales.
struct Int4Rows : Int4Matrix {
  __m512i lane_scale;
  explicit Int4Rows(const WeightView& w) : Int4Matrix(w, kBlockCols / 8) {
    const int words_per_group = static_cast<int>(std::min<int64_t>(w.group_size, kBlockCols) / 8);
    lane_scale = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                   static_cast<unsigned>(__builtin_ctz(static_cast<unsigned>(words_per_group))));
  }
};

// The scale vector of `row`'s block b: lane l = scale of column 128b + 8l; zero past K.
inline __m512 scale_vector(const Int4Rows& w, const uint16_t* row_scales, int64_t b) {
  if (w.group >= kBlockCols) {
    const uint32_t s = static_cast<uint32_t>(row_scales[b * kBlockCols / w.group]) << 16;
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(s)));  // K % 128 == 0 here: no partial block
  }
  const int64_t per_block = kBlockCols / w.group;  // 2 or 4
  const int64_t left = std::min<int64_t>(per_block, w.scales_per_row - b * per_block);
  const __m128i h = _mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << left) - 1u), row_scales + b * per_block);
  const __m512i s = _mm512_castsi128_si512(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
  return _mm512_castsi512_ps(_mm512_permutexvar_epi32(w.lane_scale, s));
}

// y[t * ldy + r * run] for t < T, r < R: rows n + r * run against T tokens of xt (ldxt floats apart). Streamed
// in: with runs, each row's words kInt4RunLeadBytes ahead of its reads (on into that run's next row) and its
// scales as far ahead in their own array; with adjacent rows, the next R rows at the rate these are read. NB
// blocks run at once: their block sums are independent FMA chains, each added to the accumulator in block
// order, so the bits do not depend on NB.
template <int R, int T, int NB>
void micro(const float* xt, int64_t ldxt, const Int4Rows& w, RowRuns at, float* y, int64_t ldy) {
  // Field f -> f - 8 as fp32: vpermps reads the low 4 bits of each lane of the shifted word.
  const __m512 values = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const char* words_end = reinterpret_cast<const char*>(w.words + w.rows * w.words_per_row);
  const char* scales_end = reinterpret_cast<const char*>(w.scales + w.rows * w.scales_per_row);
  const uint32_t* rows[R];
  const uint16_t* srows[R];
  const char *ahead[R], *sahead[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    rows[r] = w.words + (at.n + r * at.run) * w.words_per_row;
    srows[r] = w.scales + (at.n + r * at.run) * w.scales_per_row;
    ahead[r] = reinterpret_cast<const char*>(rows[r]) + kInt4RunLeadBytes;
    sahead[r] = reinterpret_cast<const char*>(srows[r]) + w.scale_offset(kInt4RunLeadBytes / 4 / w.block_words);
  }
  const char* next = reinterpret_cast<const char*>(rows[0] + R * w.words_per_row);
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  // NB blocks from b on (nb of them are real).
  const auto blocks = [&](int64_t b, auto nb_c) {
    constexpr int nb = decltype(nb_c)::value;
    __m512i wv[nb][R];
#pragma GCC unroll 8
    for (int j = 0; j < nb; ++j) {
      const int64_t left = std::min<int64_t>(16, w.words_per_row - (b + j) * 16);
      const __mmask16 m = static_cast<__mmask16>((1u << left) - 1u);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[j][r] = _mm512_maskz_loadu_epi32(m, rows[r] + (b + j) * 16);
    }
    if (at.run > 1) {
      // One line of words per row per block, and the scales' line once every 64 bytes of them.
#pragma GCC unroll 8
      for (int j = 0; j < nb; ++j)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const char* p = ahead[r] + (b + j) * 64;
          if (p < words_end) _mm_prefetch(p, _MM_HINT_T0);
          const int64_t s0 = w.scale_offset(b + j), s1 = w.scale_offset(b + j + 1);
          if ((s0 >> 6) != (s1 >> 6) || b + j == 0) {
            const char* q = sahead[r] + (s1 & ~int64_t{63});
            if (q < scales_end) _mm_prefetch(q, _MM_HINT_T0);
          }
        }
    } else {
      // Adjacent rows: the next R rows' words, at the rate these are read.
#pragma GCC unroll 8
      for (int j = 0; j < nb; ++j)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const char* p = next + ((b + j) * R + r) * 64;
          if (p < words_end) _mm_prefetch(p, _MM_HINT_T0);
        }
    }
    __m512 part[nb][R][T];  // each block's sum of x * value per lane, before the lane's group scale
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < nb; ++j) {
        const float* xb = xt + (b + j) * kBlockCols;
        __m512 xv[T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(xb + t * ldxt + i * 16);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512i q = i == 0 ? wv[j][r] : _mm512_srli_epi32(wv[j][r], static_cast<unsigned>(4 * i));
          const __m512 v = _mm512_permutexvar_ps(q, values);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t)
            part[j][r][t] = i == 0 ? _mm512_mul_ps(xv[t], v) : _mm512_fmadd_ps(xv[t], v, part[j][r][t]);
        }
      }
#pragma GCC unroll 8
    for (int j = 0; j < nb; ++j)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 sv = scale_vector(w, srows[r], b + j);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(part[j][r][t], sv, acc[r][t]);
      }
  };
  int64_t b = 0;
  for (; b + NB <= w.blocks; b += NB) blocks(b, std::integral_constant<int, NB>{});
  for (; b < w.blocks; ++b) blocks(b, std::integral_constant<int, 1>{});
  if (at.run == 1) {
    hsum16_acc<R, T>(acc, y, ldy);
  } else {
    float sums[T * R];
    hsum16_acc<R, T>(acc, sums, R);
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) y[t * ldy + r * at.run] = sums[t * R + r];
  }
}

// Transposes T tokens of x into xt (see the file comment), each token's blocks*128 floats ldxt apart.
void transpose_x(const float* x, int64_t T, int64_t ldx, int64_t K, int64_t blocks, float* xt, int64_t ldxt) {
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(8));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* src = x + t * ldx + b * kBlockCols;
      const int64_t left = std::min<int64_t>(16, (K - b * kBlockCols) / 8);  // words, K % 8 == 0
      const __mmask16 m = static_cast<__mmask16>((1u << left) - 1u);
      for (int i = 0; i < 8; ++i)
        _mm512_storeu_ps(xt + t * ldxt + b * kBlockCols + i * 16,
                         _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, src + i, 4));
    }
}

// Rows at.n + r * at.run (r < R) against all T tokens, in passes of up to P tokens; two blocks at once for
// one token.
template <int R, int P>
void rows_pass(const float* xt, int64_t T, int64_t ldxt, const Int4Rows& w, RowRuns at, float* y,
               int64_t ldy) {
  for (int64_t t = 0; t < T; t += P) {
    const auto pass = [&](auto tokens) {
      constexpr int tc = decltype(tokens)::value;
      micro<R, tc, tc == 1 ? 2 : 1>(xt + t * ldxt, ldxt, w, at, y + t * ldy, ldy);
    };
    const int64_t tc = std::min<int64_t>(P, T - t);
    if constexpr (P == 1) {
      pass(std::integral_constant<int, 1>{});
    } else if constexpr (P == 2) {
      if (tc == 1) pass(std::integral_constant<int, 1>{});
      else pass(std::integral_constant<int, 2>{});
    } else {
      static_assert(P == 4);
      switch (tc) {
        case 1: pass(std::integral_constant<int, 1>{}); break;
        case 2: pass(std::integral_constant<int, 2>{}); break;
        case 3: pass(std::integral_constant<int, 3>{}); break;
        default: pass(std::integral_constant<int, 4>{}); break;
      }
    }
  }
}

}  // namespace

void linear_int4_avx512(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                        float* y, int64_t ldy) {
  const Int4Rows rows(w);
  const int64_t K = w.cols, ldxt = rows.blocks * kBlockCols;
  // Rows longer than the transposed-x buffer (K > 32768, no model here has them) take the scalar path.
  if (ldxt > kXtFloats) return linear_scalar(x, M, ldx, w, n0, n1, y, ldy);
  alignas(64) float xt[kXtFloats];
  const int64_t macro = std::max<int64_t>(1, kXtFloats / ldxt);
  for (int64_t m0 = 0; m0 < M; m0 += macro) {
    const int64_t T = std::min(macro, M - m0);
    transpose_x(x + m0 * ldx, T, ldx, K, rows.blocks, xt, ldxt);
    float* ym = y + m0 * ldy;
    // 1-2 tokens: 4 runs of consecutive rows, one row of each at a time, each run read as one long stream
    // (the float kernels' run_kernel); 4 rows x 1 token x 2 blocks or 4 x 2 x 1 keep 8 block sums in flight.
    // One thread, from DRAM, against 6 and 4 adjacent rows: 512x2048 at 1 / 2 tokens 44-50 / 50-63 ->
    // 29-32 / 40-44 us, 2048x7168 765-900 / 860-1135 -> 410-427 / 547-565 us. From 3 tokens 2 rows in
    // passes of 4 tokens (re-decoding the rows from L1 for each pass: 1 row x 8 tokens, one decoding for
    // all, measured slower, its x loads feeding one FMA each). Rows left over go one at a time.
    int64_t n = n0;
    if (T <= 2) {
      constexpr int kRuns = 4;
      const int64_t run = (n1 - n) / kRuns;
      for (int64_t i = 0; i < run; ++i, ++n) rows_pass<kRuns, 2>(xt, T, ldxt, rows, {n, run}, ym + (n - n0), ldy);
      n += (kRuns - 1) * run;
    }
    for (; n + 2 <= n1; n += 2) rows_pass<2, 4>(xt, T, ldxt, rows, {n, 1}, ym + (n - n0), ldy);
    for (; n < n1; ++n) rows_pass<1, 4>(xt, T, ldxt, rows, {n, 1}, ym + (n - n0), ldy);
  }
}

}  // namespace moe::detail
