// AVX2 + FMA linear kernel for int4 group-quantised weights (compressed-tensors pack-quantized, dtype.h): 8
// fp32 lanes, weights decoded in registers from the packed words. Compiled with its own target flags
// (src/kernels/CMakeLists.txt) and only called after a run-time CPU check (linear.cpp).
//
// The scheme of linear_int4_avx512.cpp on 64-column blocks: a 32-byte load holds the 8 words of a block,
// word l holding columns 8l .. 8l+7; vector i = 0..7 of a block is field i of every word, so lane l is column
// 8l + i, and x is transposed into that order once per call (xt[b][i][l] = x[64b + 8l + i], zero past K).
// Lane l's group scale is the same for the 8 vectors of a block (groups of g >= 32 columns cover whole
// words). Decoding: the loaded words XOR 0x88888888 once per block turn every field f into the 4-bit two's
// complement of f - 8; per vector, a left shift puts field i in the top 4 bits, an arithmetic right shift by
// 28 sign-extends it, vcvtdq2ps converts it exactly (3 instructions per 8 weights, 2 for i = 7; AVX2 has no
// 16-entry vpermps). Each lane sums x * value over the block (part), then part * scale into the accumulator.
//
// Determinism contract: lane l of the accumulator of y[m, n] adds, block by block ascending, part * scale with
// part = x * value over i = 0..7 (fp32 FMA; lanes past K add +-0), then a fixed 8-lane tree; blocking over
// rows and tokens changes only how many accumulators are live.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/dtype.h"
#include "kernels/int4_avx2.h"
#include "kernels/linear_isa.h"

namespace moe::detail {

namespace {

constexpr int64_t kBlockCols = kInt4Avx2BlockCols;
constexpr int64_t kXtFloats = 32 * 1024;
constexpr int kSubTokens = 2;  // 16 registers: 2 tokens per pass
constexpr int64_t kNearXFloats = (64 << 10) / 4;  // one row x 4 tokens past 8 tokens: x within 64 KiB

// y[t * ldy + r * run] for t < T, r < R: rows n + r * run against T tokens of xt (ldxt floats apart);
// kRunRows: the rows are one of each of R runs (rows_pass's callers know which, so the compiler does too).
// Streamed in: with runs, each row's words kInt4RunLeadBytes ahead of its reads and its scales as far ahead
// in their own array; with adjacent rows, the next R rows at the rate these are read.
template <int R, int T, bool kRunRows>
void micro(const float* xt, int64_t ldxt, const Int4Matrix& w, RowRuns at, float* y, int64_t ldy) {
  const __m256i flip = _mm256_set1_epi32(static_cast<int>(0x88888888u));
  const char *words_end = w.words_end(), *scales_end = w.scales_end();
  const uint32_t* rows[R];
  const uint16_t* srows[R];
  const char *ahead[R], *sahead[R];
  const char* next = int4_row_pointers<R>(w, at, rows, srows, ahead, sahead);
  __m256 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  // Block b; whole: all its 64 columns within K (no length check, whole_block_scales).
  const auto block = [&](int64_t b, auto whole) __attribute__((always_inline)) {
    constexpr bool kWhole = decltype(whole)::value;
    const int64_t left = kWhole ? 8 : std::min<int64_t>(8, w.words_per_row - b * 8);
    __m256i wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int* p = reinterpret_cast<const int*>(rows[r] + b * 8);
      const __m256i words =
          left == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskload_epi32(p, word_mask(left));
      wv[r] = _mm256_xor_si256(words, flip);  // every field f becomes the 4-bit two's complement of f - 8
    }
    // A block is half a line per row: one line per row every other block, the rate the rows are read.
    if ((b & 1) == 0) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        // With runs, each row's own stream ahead (and its scales' line once every 64 bytes of them); with
        // adjacent rows, the next R rows.
        const char* p = kRunRows ? ahead[r] + b * 32 : next + (b / 2 * R + r) * 64;
        if (p < words_end) _mm_prefetch(p, _MM_HINT_T0);
      }
    }
    if constexpr (kRunRows) {
      const int64_t s0 = w.scale_offset(b), s1 = w.scale_offset(b + 1);
      if ((s0 >> 6) != (s1 >> 6) || b == 0)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          if (sahead[r] + (s1 & ~int64_t{63}) < scales_end) _mm_prefetch(sahead[r] + (s1 & ~int64_t{63}), _MM_HINT_T0);
    }
    const float* xb = xt + b * kBlockCols;
    // From 3 tokens each token's x of the block from its own pointer, read at fixed offsets: left to itself
    // GCC keeps an offset per token and vector (T x 8 of them) and reloads them from the stack, a scalar load
    // per FMA, and the one-row kernel runs out of load slots. The empty asm hides the pointers' common base.
    // Zen 3, two threads from DRAM, 3 / 4 / 8 tokens 0.86-0.95 / 0.82-0.92 / 0.88-0.98x the time, the same
    // bits (docs/kernel-notes.md, "int4 x through one pointer per token"); the asm at 1-2 tokens measured slower.
    const float* xp[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      xp[t] = xb + t * ldxt;
      if constexpr (T >= 3) asm("" : "+r"(xp[t]));
    }
    __m256 part[R][T];  // this block's sum of x * value per lane, before the lane's group scale
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      __m256 xv[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(xp[t] + i * 8);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        // Field i to the top 4 bits, then an arithmetic shift back: the signed value, exactly.
        const __m256i top = i == 7 ? wv[r] : _mm256_slli_epi32(wv[r], 28 - 4 * i);
        const __m256 v = _mm256_cvtepi32_ps(_mm256_srai_epi32(top, 28));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) part[r][t] = i == 0 ? _mm256_mul_ps(xv[t], v) : _mm256_fmadd_ps(xv[t], v, part[r][t]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 sv = kWhole ? whole_block_scales(w, srows[r], b) : scale_vector(w, srows[r], b);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(part[r][t], sv, acc[r][t]);
    }
  };
  const int64_t whole = w.words_per_row / 8;
  int64_t b = 0;
  for (; b < whole; ++b) block(b, std::true_type{});
  for (; b < w.blocks; ++b) block(b, std::false_type{});  // a partial block (K % 64 == 32)
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r * at.run] = hsum8(acc[r][t]);
}

// One 64-column block of x: the 8 x 8 tile at src (row l: the 8 columns of word l) transposed into dst
// (vector i: column i of every word), the order in which the block's vectors meet it.
inline void transpose8(const float* src, float* dst) {
  __m256 r[8], t[8];
  for (int l = 0; l < 8; ++l) r[l] = _mm256_loadu_ps(src + 8 * l);
  for (int l = 0; l < 8; l += 2) {
    t[l] = _mm256_unpacklo_ps(r[l], r[l + 1]);
    t[l + 1] = _mm256_unpackhi_ps(r[l], r[l + 1]);
  }
  for (int h = 0; h < 8; h += 4) {
    r[h + 0] = _mm256_shuffle_ps(t[h + 0], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 1] = _mm256_shuffle_ps(t[h + 0], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + 8 * i, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + 8 * (i + 4), _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// xt[b][i][l] = x[64b + 8l + i], zero past K. Whole blocks as 8 x 8 tiles: the scalar loop (an index
// computation and a store per element) cost about 3% of a 512x2048 call at 1-16 tokens (Zen 3, one thread,
// call by call); a partial block (K % 64 == 32) element by element.
void transpose_x(const float* x, int64_t T, int64_t ldx, int64_t K, float* xt, int64_t ldxt) {
  const int64_t whole = K / kBlockCols * kBlockCols;
  for (int64_t t = 0; t < T; ++t) {
    float* dst = xt + t * ldxt;
    const float* src = x + t * ldx;
    for (int64_t k = 0; k < whole; k += kBlockCols) transpose8(src + k, dst + k);
    std::memset(dst + whole, 0, static_cast<size_t>(ldxt - whole) * sizeof(float));
    for (int64_t k = whole; k < K; ++k) dst[whole + k % 8 * 8 + (k - whole) / 8] = src[k];
  }
}

// Rows at.n + r * at.run (r < R) against all T tokens, in passes of up to 2 tokens (4 for one row).
template <int R, bool kRunRows>
void rows_pass(const float* xt, int64_t T, int64_t ldxt, const Int4Matrix& w, RowRuns at, float* y, int64_t ldy) {
  constexpr int P = R == 1 ? 4 : kSubTokens;
  for (int64_t t = 0; t < T; t += P)
    with_token_count<P>(std::min<int64_t>(P, T - t), [&](auto tokens) {
      micro<R, decltype(tokens)::value, kRunRows>(xt + t * ldxt, ldxt, w, at, y + t * ldy, ldy);
    });
}

}  // namespace

void linear_int4_avx2(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                      int64_t ldy) {
  const Int4Matrix rows(w, kBlockCols / 8);
  const int64_t K = w.cols, ldxt = rows.blocks * kBlockCols;
  if (ldxt > kXtFloats) return linear_scalar(x, M, ldx, w, n0, n1, y, ldy);
  alignas(32) float xt[kXtFloats];
  const int64_t macro = std::max<int64_t>(1, kXtFloats / ldxt);
  for (int64_t m0 = 0; m0 < M; m0 += macro) {
    const int64_t T = std::min(macro, M - m0);
    transpose_x(x + m0 * ldx, T, ldx, K, xt, ldxt);
    float* ym = y + m0 * ldy;
    // 1 token: 4 runs of consecutive rows, one row of each at a time, each run read as one long stream (4
    // accumulators, 4 block sums, 4 words of 16 registers). 2 tokens: 2 adjacent rows x 2 tokens. From 3:
    // one row x 4 tokens, which decodes each weight once per 4 tokens instead of 2 (3 instructions per 8
    // weights bound this kernel) but reads the tokens' x once per row instead of once per 2 rows, so it
    // stops where that x leaves the caches: past 8 tokens of over 64 KiB. One thread, in L3, on a Zen 5,
    // medians of three interleaved rounds: 512x2048 at 3 / 4 / 8 tokens 122 / 132 / 269 -> 85 / 108 / 240
    // us, 2048x512 at 3 / 8 / 16 125 / 279 / 549 -> 85 / 216 / 460, 2048x7168 at 3 / 8 / 16 1748 / 3722 /
    // 7259 -> 1235 / 3329 / 6556; 512x2048 at 16 and 32 tokens (128 KiB of x) 551 / 1069 -> 671 / 1338.
    int64_t n = n0;
    if (T == 1)
      n = walk_runs<4>(n, n1, [&](RowRuns at) { rows_pass<4, true>(xt, T, ldxt, rows, at, ym + (at.n - n0), ldy); });
    if (T < 3 || (T > 8 && T * ldxt > kNearXFloats))
      for (; n + 2 <= n1; n += 2) rows_pass<2, false>(xt, T, ldxt, rows, {n, 1}, ym + (n - n0), ldy);
    for (; n < n1; ++n) rows_pass<1, false>(xt, T, ldxt, rows, {n, 1}, ym + (n - n0), ldy);
  }
}

}  // namespace moe::detail
