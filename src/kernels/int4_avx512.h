// The AVX-512 walk over int4 rows shared by the two AVX-512 int4 kernels (internal to moe_kernels; included by
// linear_int4_avx512.cpp and linear_int4_avx512bf16.cpp, which are compiled with different target flags, so
// everything here has internal linkage). What differs between them is the product, a policy `Dot`:
//
//   linear_int4_avx512.cpp      exact: x in fp32, 8 steps per 128-column block, each a shift, a vpermps of the
//                               values -8..7 and an fp32 FMA per 16 weights;
//   linear_int4_avx512bf16.cpp  x rounded to bf16, 4 steps per block, each a shift, a vpermw of the values
//                               -8..7 as bf16 and a vdpbf16ps per 32 weights.
//
// Column order. A 64-byte load holds the 16 words of a 128-column block, word l holding columns 8l .. 8l+7.
// Shifting every lane right by 4i exposes the low field of each lane: step i of a block is that lane's field
// i (fp32 lanes) or field i of each half-word (bf16 lanes, field i and i + 4 of word l in lanes 2l, 2l + 1,
// which vdpbf16ps adds into fp32 lane l). Either way fp32 lane l of a step's product covers word l only, and
// x is put into that order once per call by the policy's convert_x. A group of g >= 32 columns (a power of
// two) covers whole words, so lane l has one scale for all the steps of a block: each lane sums x * value
// over the block's steps (part), and the block's sum times the lane's bf16 group scale goes into the
// accumulator, one FMA per 128 columns; the scale never multiplies the weights one by one.
//
// Determinism contract: y[m, n] is accumulated in one vector whose lane l adds, block by block ascending,
// part * scale (fp32 FMA; lanes past K add +-0 as x is zero there), then reduced by the fixed 16-lane tree of
// avx512_hsum.h. Blocking over rows and tokens changes only how many accumulators are live, so the bits depend
// on (x row, W row) alone.
//
// The Dot policy:
//   using XElem;                           float or bf16 bits: x as convert_x lays it out
//   static constexpr int kSteps;           steps per 128-column block (8 or 4)
//   static constexpr bool kLongRowRuns;    whether rows of kLongRowBytes or more go as runs at any token count
//   static constexpr int64_t kXElems;      elements of the x buffer (on the stack)
//   static int64_t row_stride(int64_t blocks);   elements between converted x rows
//   static void convert_x(const float* x, int64_t T, int64_t ldx, int64_t K, int64_t blocks, XElem* xc,
//                         int64_t ldxc);
//   XVec load_x(const XElem* p) const;     one step's x
//   WVec decode(__m512i words, int i) const;     step i's values
//   __m512 madd(__m512 part, XVec x, WVec v, bool first) const;   part + x . v (first: from zero)
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/avx512_hsum.h"
#include "kernels/int4_rows.h"

namespace moe::detail {
namespace {

constexpr int64_t kInt4BlockCols = 128;  // 16 words
constexpr int64_t kLongRowBytes = 1024;  // a row of 2048 columns and more (see linear_int4_avx512_with)

// The matrix and, for groups under 128 columns, lane l's scale within a block's group scales: as a dword
// index (lane_scale), and as the byte shuffle that spreads a whole block's broadcast scales (spread).
struct Int4Rows : Int4Matrix {
  __m512i lane_scale, spread;
  explicit Int4Rows(const WeightView& w) : Int4Matrix(w, kInt4BlockCols / 8) {
    const int words_per_group = static_cast<int>(std::min<int64_t>(w.group_size, kInt4BlockCols) / 8);
    const int shift = __builtin_ctz(static_cast<unsigned>(words_per_group));
    lane_scale = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                   static_cast<unsigned>(shift));
    // Lane l: its scale's two bytes into the top half, the bottom half zero (index bit 7).
    alignas(64) int8_t bytes[64];
    for (int j = 0; j < 64; ++j) bytes[j] = j % 4 < 2 ? -128 : static_cast<int8_t>(2 * ((j / 4) >> shift) + j % 4 - 2);
    spread = _mm512_load_si512(bytes);
  }
};

// The scale vector of `row`'s block b: lane l = scale of column 128b + 8l; zero past K.
inline __m512 scale_vector(const Int4Rows& w, const uint16_t* row_scales, int64_t b) {
  if (w.group >= kInt4BlockCols) {
    const uint32_t s = static_cast<uint32_t>(row_scales[b * kInt4BlockCols / w.group]) << 16;
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(s)));  // K % 128 == 0 here: no partial block
  }
  const int64_t per_block = kInt4BlockCols / w.group;  // 2 or 4
  const int64_t left = std::min<int64_t>(per_block, w.scales_per_row - b * per_block);
  const __m128i h = _mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << left) - 1u), row_scales + b * per_block);
  const __m512i s = _mm512_castsi128_si512(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
  return _mm512_castsi512_ps(_mm512_permutexvar_epi32(w.lane_scale, s));
}

// The same for a whole block b (its 128 columns within K), without the bounds: one broadcast of the
// block's scales (4 for groups of 32, 2 for 64) and one byte shuffle, or one broadcast scale from 128 on.
// One thread, 512x2048 and 2048x512 in L2, 1 token: the general one cost a fifth of the kernel's time.
inline __m512 whole_block_scales(const Int4Rows& w, const uint16_t* row_scales, int64_t b) {
  const uint16_t* s = row_scales + ((b * kInt4BlockCols) >> w.group_shift);
  if (w.group >= kInt4BlockCols) return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(uint32_t{*s} << 16)));
  __m512i v;
  if (w.group == 32) {
    int64_t q;
    std::memcpy(&q, s, 8);
    v = _mm512_set1_epi64(q);
  } else {
    int32_t d;
    std::memcpy(&d, s, 4);
    v = _mm512_set1_epi32(d);
  }
  return _mm512_castsi512_ps(_mm512_shuffle_epi8(v, w.spread));
}

// y[t * ldy + r * run] for t < T, r < R: rows n + r * run against T tokens of xc (ldxc elements apart).
// Streamed in: with runs, each row's words kInt4RunLeadBytes ahead of its reads (on into that run's next row)
// and its scales as far ahead in their own array; with adjacent rows, the next R rows at the rate these are
// read. NB blocks run at once: their block sums are independent chains, each added to the accumulator in
// block order, so the bits do not depend on NB.
template <class Dot, int R, int T, int NB>
void int4_micro(const Dot& dot, const typename Dot::XElem* xc, int64_t ldxc, const Int4Rows& w, RowRuns at,
                float* y, int64_t ldy) {
  constexpr int kSteps = Dot::kSteps;
  constexpr int64_t kStepElems = kInt4BlockCols / kSteps;
  // Spelled out rather than int4_row_pointers() and words_end() (int4_rows.h), as the AVX2 kernels have it:
  // with those GCC 12 compiled this kernel 15% slower at 8 tokens (512 x 2048 from L2 on a Zen 4 core, 130
  // against 112 us), though the arithmetic is the same.
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
  // nb blocks from b on; whole: all of their columns within K.
  const auto blocks = [&](int64_t b, auto nb_c, auto whole_c) {
    constexpr int nb = decltype(nb_c)::value;
    constexpr bool whole = decltype(whole_c)::value;
    __m512i wv[nb][R];
#pragma GCC unroll 8
    for (int j = 0; j < nb; ++j) {
      if constexpr (whole) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) wv[j][r] = _mm512_loadu_si512(rows[r] + (b + j) * 16);
      } else {
        const int64_t left = std::min<int64_t>(16, w.words_per_row - (b + j) * 16);
        const __mmask16 m = static_cast<__mmask16>((1u << left) - 1u);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) wv[j][r] = _mm512_maskz_loadu_epi32(m, rows[r] + (b + j) * 16);
      }
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
    for (int i = 0; i < kSteps; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < nb; ++j) {
        const typename Dot::XElem* xb = xc + (b + j) * kInt4BlockCols + i * kStepElems;
        typename Dot::XVec xv[T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) xv[t] = dot.load_x(xb + t * ldxc);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const auto v = dot.decode(wv[j][r], i);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) part[j][r][t] = dot.madd(part[j][r][t], xv[t], v, i == 0);
        }
      }
#pragma GCC unroll 8
    for (int j = 0; j < nb; ++j)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 sv = whole ? whole_block_scales(w, srows[r], b + j) : scale_vector(w, srows[r], b + j);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(part[j][r][t], sv, acc[r][t]);
      }
  };
  const int64_t whole = w.words_per_row / 16;
  int64_t b = 0;
  for (; b + NB <= whole; b += NB) blocks(b, std::integral_constant<int, NB>{}, std::true_type{});
  for (; b < whole; ++b) blocks(b, std::integral_constant<int, 1>{}, std::true_type{});
  for (; b < w.blocks; ++b) blocks(b, std::integral_constant<int, 1>{}, std::false_type{});  // K % 128 != 0
  if (at.run == 1) {
    hsum16_acc<R, T>(acc, y, ldy);
  } else {
    hsum16_acc_strided<R, T>(acc, y, ldy, at.run);
  }
}

// Rows at.n + r * at.run (r < R) against all T tokens, in passes of up to P tokens; two blocks at once for
// one token on up to 4 rows (8 block sums in flight, as 8 rows x 1 block have).
template <class Dot, int R, int P>
void int4_rows_pass(const Dot& dot, const typename Dot::XElem* xc, int64_t T, int64_t ldxc, const Int4Rows& w,
                    RowRuns at, float* y, int64_t ldy) {
  for (int64_t t = 0; t < T; t += P)
    with_token_count<P>(std::min<int64_t>(P, T - t), [&](auto tokens) {
      constexpr int tc = decltype(tokens)::value;
      int4_micro<Dot, R, tc, tc == 1 && R <= 4 ? 2 : 1>(dot, xc + t * ldxc, ldxc, w, at, y + t * ldy, ldy);
    });
}

// linear() on an int4 matrix with the product of `Dot`, y pointing at column n0. Returns false (nothing
// written) when a converted x row does not fit the policy's buffer (K > 32768: no model here), for the
// caller to take the scalar path.
template <class Dot>
bool linear_int4_avx512_with(const Dot& dot, const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0,
                             int64_t n1, float* y, int64_t ldy) {
  const Int4Rows rows(w);
  const int64_t K = w.cols, ldxc = Dot::row_stride(rows.blocks);
  if (ldxc > Dot::kXElems) return false;
  alignas(64) typename Dot::XElem xc[Dot::kXElems];
  const int64_t macro = std::max<int64_t>(1, Dot::kXElems / ldxc);
  for (int64_t m0 = 0; m0 < M; m0 += macro) {
    const int64_t T = std::min(macro, M - m0);
    Dot::convert_x(x + m0 * ldx, T, ldx, K, rows.blocks, xc, ldxc);
    float* ym = y + m0 * ldy;
    // 1-2 tokens: 4 runs of consecutive rows, one row of each at a time, each run read as one long stream
    // (the float kernels' run_kernel); 4 rows x 1 token x 2 blocks or 4 x 2 x 1 keep 8 block sums in flight.
    // One thread, from DRAM, exact product, against 6 and 4 adjacent rows: 512x2048 at 1 / 2 tokens 44-50 /
    // 50-63 -> 29-32 / 40-44 us, 2048x7168 765-900 / 860-1135 -> 410-427 / 547-565 us (Zen 5). From 3
    // tokens 4 adjacent rows in passes of 4 tokens (re-decoding the rows from L1 for each pass: 1 row x 8
    // tokens, one decoding for all, measured slower, its x loads feeding one product each; on the bf16-dot
    // product too, from L2 on a Zen 4 guest, within the noise). 4 rows rather than 2 once the block scales
    // had become cheap: one thread, in L3, Zen 5, 2048x512 at 3 / 8 / 16 / 32 tokens, exact 52 / 122 / 248
    // / 624 -> 42 / 106 / 209 / 418 us, bf16-dot 35 / 78 / 157 / 318 -> 30 / 70 / 136 / 274; bf16-dot
    // 512x2048 29 / 72 / 182 / 363 -> 25 / 59 / 122 / 249. Rows left over go two or one at a time.
    // The exact product (kLongRowRuns) keeps the runs at every token count on rows of 2048 columns and more,
    // in passes of up to 4 tokens: 4 rows x 2 tokens per pass had outrun 2 adjacent rows x 4 although each
    // pass decodes the rows again (one thread, weights in L3, Zen 5, medians of 5 interleaved rounds:
    // 2048x7168 at 3 / 4 / 8 / 16 tokens 1158 / 1359 / 2583 / 4719 -> 824 / 909 / 1861 / 3697 us, 512x2048
    // 81 / 78 / 174 / 373 -> 63 / 69 / 141 / 276; from DRAM, two threads, 2048x7168 at 4 / 8 tokens 740 / 1408
    // -> 584 / 1134), and 4 runs x 4 tokens, which decode half as often, outran that once the block's scales
    // had stopped costing a fifth of the time (2048x7168 in L3, one thread, 3 / 4 / 8 / 16 / 32 tokens 683 /
    // 774 / 1550 / 3173 / 6337 -> 550 / 691 / 1393 / 2865 / 5718 us; 3 tokens went as 2 + 1 before). Rows
    // of 512 columns measured slower as runs (2048x512 at 4 / 8 tokens 74 / 136 -> 86 / 168 us), and so did
    // the bf16 product's, which decodes 32 weights per step.
    // One token on rows under kLongRowBytes goes as 8 runs: a row of 512 columns is 4 blocks, and the
    // per-row work (pointers, the lane sums' reduction) took a fifth of the time with 4 runs. One thread,
    // in L3, Zen 5, 2048x512 at one token: exact 28-30 -> 23-25 us, bf16-dot 21-26 -> 19; from DRAM, exact,
    // one / two threads 29-30 / 15-19 -> 28 / 14-16. 8 runs x 2 tokens spill (2048x512, 41-48 -> 50-54 us).
    int64_t n = n0;
    // kRuns runs in passes of up to P tokens (P = 1 for 8 runs: no 8-row variant of 2-4 tokens is built).
    const auto as_runs = [&](auto runs_c, auto pass_c) {
      constexpr int kRuns = decltype(runs_c)::value, P = decltype(pass_c)::value;
      const int64_t run = (n1 - n) / kRuns;
      for (int64_t i = 0; i < run; ++i, ++n)
        int4_rows_pass<Dot, kRuns, P>(dot, xc, T, ldxc, rows, {n, run}, ym + (n - n0), ldy);
      n += (kRuns - 1) * run;
    };
    const bool long_rows = rows.words_per_row * 4 >= kLongRowBytes;
    if (T == 1 && !long_rows) {
      as_runs(std::integral_constant<int, 8>{}, std::integral_constant<int, 1>{});
    } else if (T <= 2 || (Dot::kLongRowRuns && long_rows)) {
      as_runs(std::integral_constant<int, 4>{}, std::integral_constant<int, 4>{});
    }
    for (; n + 4 <= n1; n += 4) int4_rows_pass<Dot, 4, 4>(dot, xc, T, ldxc, rows, {n, 1}, ym + (n - n0), ldy);
    for (; n + 2 <= n1; n += 2) int4_rows_pass<Dot, 2, 4>(dot, xc, T, ldxc, rows, {n, 1}, ym + (n - n0), ldy);
    for (; n < n1; ++n) int4_rows_pass<Dot, 1, 4>(dot, xc, T, ldxc, rows, {n, 1}, ym + (n - n0), ldy);
  }
  return true;
}

}  // namespace
}  // namespace moe::detail
