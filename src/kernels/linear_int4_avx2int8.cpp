// AVX2 linear kernel for int4 group-quantised weights against x quantized to int8 (the avx2int8 ISA, opt-in):
// vpmaddubsw multiplies the weights' unsigned 4-bit fields by the int8 x and adds pairs, so 64 weights cost
// about 8 vector operations per token (and 6 per row) where the exact AVX2 kernel (linear_int4_avx2.cpp),
// which is bound by its decoding, needs 32. llama.cpp runs its q4_0 weights against q8_0 activations the same way.
//
// Numerics. Each token's x is quantized once per call in chunks of 32 columns: d = max |x| / 127 and
// q = round-to-nearest-even(x * (127 / max |x|)) in [-127, 127] (q = 0, d = 0 for a chunk of zeros; d = NaN
// for a chunk holding a NaN or an infinity, so that its rows come out NaN). So x is taken as q * d, within
// d / 2 = max |x| / 254 of each element. The rest is exact up to fp32 rounding: per word (8 columns) the
// integer sum of field * q minus 8 * (sum of q) is (field - 8) . q exactly; it is converted to fp32 and
// multiplied by d * s (s the word's bf16 group scale, the product rounded once) into the accumulator.
//
// Layout. A 32-byte load holds the 8 words of a 64-column block; byte j holds columns 2j (low nibble) and
// 2j + 1 (high nibble). So the low nibbles meet q[0, 2, 4, ...] and the high ones q[1, 3, 5, ...]:
// quantize_x stores them in that order (XBlock). vpmaddubsw then vpmaddwd by ones leave in int32 lane l the
// sum over word l. linear_int4_avx2int8_vnni.cpp compiles this file again for CPUs with AVX512-VNNI and
// AVX512-VL (Zen 4 and 5, Intel since Ice Lake): there vpdpbusd adds the four products per int32 lane in one
// instruction, low nibbles then high ones, and two rows share one 512-bit vector (Lanes<2>), each in its own
// half. Both sums are exact integers (no saturation either way) and each row's 8 lanes see the same fp32
// operations in the same order, so the two builds give the same bits.
//
// Determinism contract: y[m, n] is accumulated in one vector whose lane l adds, block by block ascending,
// float((field - 8) . q) * (d * s) by fp32 FMA, then reduced by the fixed 8-lane tree; q and d depend on the
// token's x row alone. Blocking over rows and tokens only changes how many accumulators are live.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/int4_avx2.h"
#include "kernels/linear_isa.h"

#ifndef MOE_INT8_VNNI
#define MOE_INT8_VNNI 0
#define MOE_INT8_KERNEL linear_int4_avx2int8
#endif

namespace moe::detail {

namespace {

constexpr int64_t kBlockCols = kInt4Avx2BlockCols;
constexpr int64_t kChunkCols = 32;  // columns per x scale
constexpr int64_t kXBlocks = 1024;  // quantized x of up to this many blocks of all tokens: 128 KiB of stack

// One token's 64 columns of quantized x, as the kernel reads them.
struct alignas(32) XBlock {
  int8_t even[32];  // q[2j]: meets the low nibbles
  int8_t odd[32];   // q[2j + 1]: meets the high nibbles
  int32_t corr[8];  // 8 * the sum of q over word l's 8 columns (the fields are the value plus 8)
  float d[8];       // the scale of word l's chunk
};

// Quantizes the 32 columns at x into chunk h (0 or 1) of `out`.
void quantize_chunk(const float* x, int h, XBlock& out) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4], amax = _mm256_setzero_ps();
  int nonfinite = 0;
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    const __m256 a = _mm256_and_ps(v[i], magnitude);
    nonfinite |= _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ));  // inf or NaN
    amax = _mm256_max_ps(amax, a);
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  const float top = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  const float d = nonfinite ? NAN : top / 127.0f;
  const __m256 inv = _mm256_set1_ps(!nonfinite && top > 0.0f ? 127.0f / top : 0.0f);
  __m256i q[4];  // q[i] holds word i's 8 columns; round to nearest even (the default rounding mode)
  for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
  // 8 * the sum over each word: two horizontal adds leave word i's halves in lanes i and 4 + i.
  const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(q[0], q[1]), _mm256_hadd_epi32(q[2], q[3]));
  const __m128i sums = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out.corr + 4 * h), _mm_slli_epi32(sums, 3));
  _mm_storeu_ps(out.d + 4 * h, _mm_set1_ps(d));
  // To bytes (|q| <= 127: the saturating packs are exact). The packs leave dword k (k < 4) holding columns
  // 8k .. 8k+3 and dword 4 + k columns 8k+4 .. 8k+7; the dword permutation puts the 32 columns in order, the
  // byte shuffle splits each 16 into its even and odd columns, and the qword permutation gathers the evens
  // (the low 16 bytes) and the odds (the high 16).
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  const __m256i split = _mm256_shuffle_epi8(
      ordered, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5,
                                7, 9, 11, 13, 15));
  const __m256i eo = _mm256_permute4x64_epi64(split, 0xd8);  // qwords 0, 2, 1, 3
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out.even + 16 * h), _mm256_castsi256_si128(eo));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out.odd + 16 * h), _mm256_extracti128_si256(eo, 1));
}

// A chunk past K (a block of 32 columns only): no x, no contribution.
void zero_chunk(int h, XBlock& out) {
  for (int j = 0; j < 16; ++j) out.even[16 * h + j] = out.odd[16 * h + j] = 0;
  for (int l = 0; l < 4; ++l) out.corr[4 * h + l] = 0, out.d[4 * h + l] = 0.0f;
}

// T tokens of x into xq, `blocks` XBlocks per token (ldxq apart); K % 32 == 0.
void quantize_x(const float* x, int64_t T, int64_t ldx, int64_t K, int64_t blocks, XBlock* xq, int64_t ldxq) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < blocks; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t c = b * kBlockCols + h * kChunkCols;
        if (c < K) quantize_chunk(x + t * ldx + c, h, xq[t * ldxq + b]);
        else zero_chunk(h, xq[t * ldxq + b]);
      }
}

// The vector that holds G rows' 8 lanes: one row on 256 bits; in the VNNI build also two rows on 512, the
// first in the low half. Each row's lanes see the same operations either way, so G does not change a bit.
template <int G>
struct Lanes;

template <>
struct Lanes<1> {
  using I = __m256i;
  using F = __m256;
  static I words(const uint32_t* const* rows, int64_t b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[0] + b * 8));
  }
  static I partial(const uint32_t* const* rows, int64_t b, int64_t left) {
    const int* p = reinterpret_cast<const int*>(rows[0] + b * 8);
    return left == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskload_epi32(p, word_mask(left));
  }
  template <bool kGroup32>
  static F whole_scales(const Int4Matrix& w, const uint16_t* const* srows, int64_t b) {
    return whole_block_scales<kGroup32>(w, srows[0], b);
  }
  static F scales(const Int4Matrix& w, const uint16_t* const* srows, int64_t b) { return scale_vector(w, srows[0], b); }
  static I low4(I words) { return _mm256_and_si256(words, _mm256_set1_epi8(0x0f)); }
  static I high4(I words) { return low4(_mm256_srli_epi16(words, 4)); }
  static I x(const int8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static I x(const int32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  static F x(const float* p) { return _mm256_load_ps(p); }
  // Per int32 lane: the sum over its word of low nibbles * even and high nibbles * odd.
  static I dot(I lo, I hi, I even, I odd) {
#if MOE_INT8_VNNI
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, even), hi, odd);
#else
    // Each 16-bit sum is at most 2 * 2 * 15 * 127: no saturation.
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, even), _mm256_maddubs_epi16(hi, odd)),
                             _mm256_set1_epi16(1));
#endif
  }
  static F madd(I dot, I corr, F d, F sv, F acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot, corr)), _mm256_mul_ps(d, sv), acc);
  }
  static F zero() { return _mm256_setzero_ps(); }
  static void store(F acc, float* y, int64_t) { *y = hsum8(acc); }
};

#if MOE_INT8_VNNI
template <>
struct Lanes<2> {
  using I = __m512i;
  using F = __m512;
  static I join(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }
  static F join(__m256 a, __m256 b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(a)), _mm256_castps_pd(b), 1));
  }
  static I words(const uint32_t* const* rows, int64_t b) {
    return join(Lanes<1>::words(rows, b), Lanes<1>::words(rows + 1, b));
  }
  static I partial(const uint32_t* const* rows, int64_t b, int64_t left) {
    return join(Lanes<1>::partial(rows, b, left), Lanes<1>::partial(rows + 1, b, left));
  }
  template <bool kGroup32>
  static F whole_scales(const Int4Matrix& w, const uint16_t* const* srows, int64_t b) {
    return join(whole_block_scales<kGroup32>(w, srows[0], b), whole_block_scales<kGroup32>(w, srows[1], b));
  }
  static F scales(const Int4Matrix& w, const uint16_t* const* srows, int64_t b) {
    return join(scale_vector(w, srows[0], b), scale_vector(w, srows[1], b));
  }
  // A 32-bit shift moves the same bits into each byte's low nibble as vpsrlw, and needs no AVX512-BW.
  static I low4(I words) { return _mm512_and_si512(words, _mm512_set1_epi8(0x0f)); }
  static I high4(I words) { return low4(_mm512_srli_epi32(words, 4)); }
  static I x(const int8_t* p) { return _mm512_broadcast_i64x4(Lanes<1>::x(p)); }
  static I x(const int32_t* p) { return _mm512_broadcast_i64x4(Lanes<1>::x(p)); }
  static F x(const float* p) { return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_load_ps(p)))); }
  static I dot(I lo, I hi, I even, I odd) {
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, even), hi, odd);
  }
  static F madd(I dot, I corr, F d, F sv, F acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot, corr)), _mm512_mul_ps(d, sv), acc);
  }
  static F zero() { return _mm512_setzero_ps(); }
  static void store(F acc, float* y, int64_t stride) {
    y[0] = hsum8(_mm512_castps512_ps256(acc));
    y[stride] = hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  }
};
#endif

// y[t * ldy + r * run] for t < T, r < R: rows n + r * run against T tokens of xq (ldxq blocks apart).
// Streamed in as linear_int4_avx2.cpp's micro: with runs, each row's words kInt4RunLeadBytes ahead of its
// reads and its scales as far ahead in their own array; with adjacent rows, the next R rows at the rate these
// are read. Whole blocks go two at a time (one 64-byte line of each row), with no bounds checks and one
// shuffle per scale vector: at 1 token the kernel is bound by its instructions, and a version that checked
// every block's length and converted its scales one by one took 2.5x the time (41 against 17 us for
// 512 x 2048 from L2 on a Zen 4 core, the best of 7). The two blocks are a loop of two: written out, GCC
// kept more registers live and 2 tokens took 51 us against 30. The VNNI build takes rows in pairs, one pair
// per 512-bit vector, which halves the instructions per weight.
template <int R, int T, bool kGroup32>
void micro(const XBlock* xq, int64_t ldxq, const Int4Matrix& w, RowRuns at, float* y, int64_t ldy) {
  constexpr int G = MOE_INT8_VNNI && R % 2 == 0 ? 2 : 1;  // rows per vector
  constexpr int V = R / G;
  using L = Lanes<G>;
  const char *words_end = w.words_end(), *scales_end = w.scales_end();
  const uint32_t* rows[R];
  const uint16_t* srows[R];
  const char *ahead[R], *sahead[R];
  const char* next = int4_row_pointers<R>(w, at, rows, srows, ahead, sahead);
  typename L::F acc[V][T];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[v][t] = L::zero();
  // Block b of vector v's rows (their words and scale vectors) against the T tokens.
  const auto step = [&](int v, int64_t b, typename L::I words, typename L::F sv) {
    const typename L::I lo = L::low4(words), hi = L::high4(words);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const XBlock& xb = xq[t * ldxq + b];
      acc[v][t] = L::madd(L::dot(lo, hi, L::x(xb.even), L::x(xb.odd)), L::x(xb.corr), L::x(xb.d), sv, acc[v][t]);
    }
  };
  // Before even block b: one line per row (a block is half a line), and with runs the scales' next line
  // once every 64 bytes of them. always_inline: GCC counts a prefetch as free of side effects, deems a
  // lambda that only prefetches pure and deletes its calls (linear_simd.h); without it the object file held
  // 11 prefetch instructions, 6 of them in out-of-line copies.
  const auto prefetch = [&](int64_t b) __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const char* p = at.run > 1 ? ahead[r] + b * 32 : next + (b / 2 * R + r) * 64;
      if (p < words_end) _mm_prefetch(p, _MM_HINT_T0);
    }
    if (at.run > 1) {
      const int64_t s0 = w.scale_offset(b), s2 = w.scale_offset(b + 2);
      if ((s0 >> 6) != (s2 >> 6) || b == 0)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          if (sahead[r] + (s2 & ~int64_t{63}) < scales_end) _mm_prefetch(sahead[r] + (s2 & ~int64_t{63}), _MM_HINT_T0);
    }
  };
  const int64_t whole = w.words_per_row / 8;
  int64_t b = 0;
  for (; b + 2 <= whole; b += 2) {
    prefetch(b);
#pragma GCC unroll 2
    for (int64_t i = b; i < b + 2; ++i)
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v)
        step(v, i, L::words(rows + v * G, i), L::template whole_scales<kGroup32>(w, srows + v * G, i));
  }
  for (; b < w.blocks; ++b) {  // a last whole block, a partial one (K % 64 == 32), or both
    if ((b & 1) == 0) prefetch(b);
    const int64_t left = std::min<int64_t>(8, w.words_per_row - b * 8);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) step(v, b, L::partial(rows + v * G, b, left), L::scales(w, srows + v * G, b));
  }
  for (int t = 0; t < T; ++t)
    for (int v = 0; v < V; ++v) L::store(acc[v][t], y + t * ldy + v * G * at.run, at.run);
}

// Rows at.n + r * at.run (r < R) against all T tokens, in passes of up to P (2 or 4) tokens.
template <int R, int P, bool kGroup32>
void rows_pass(const XBlock* xq, int64_t T, int64_t ldxq, const Int4Matrix& w, RowRuns at, float* y, int64_t ldy) {
  for (int64_t t = 0; t < T; t += P) {
    const XBlock* xt = xq + t * ldxq;
    float* yt = y + t * ldy;
    switch (std::min<int64_t>(P, T - t)) {
      case 1: micro<R, 1, kGroup32>(xt, ldxq, w, at, yt, ldy); break;
      case 2: micro<R, 2, kGroup32>(xt, ldxq, w, at, yt, ldy); break;
      case 3:
        if constexpr (P > 2) micro<R, 3, kGroup32>(xt, ldxq, w, at, yt, ldy);
        break;
      default:
        if constexpr (P > 2) micro<R, 4, kGroup32>(xt, ldxq, w, at, yt, ldy);
        break;
    }
  }
}

// Whether 3-8 tokens on rows of 2048 columns or more go as 2 runs in passes of 4 tokens (8 accumulators)
// rather than 4 runs in passes of 2, which decode every row once per 2 tokens: Zen 3, two threads from DRAM,
// 512 x 2048 at 3 / 4 / 6 / 8 tokens 0.81 / 0.89 / 0.95 / 0.90x the time, Kimi-K2's 2048 x 7168 0.80 /
// 0.86 / 0.91 / 0.89x; one thread in L2 0.85-0.91x (docs/kernel-notes.md, "avx2int8: the group size known
// at compile time"). At 2 tokens 2 runs measured 0.93-1.06x, and on shorter rows (2048 x 512) 1.01-1.13x:
// both keep their blocking. The VNNI build (two rows per 512-bit vector, Zen 4 and 5) keeps 4 runs until
// measured there.
inline constexpr bool kTwoRunsFromThreeTokens = !MOE_INT8_VNNI;

// Rows [n0, n1) against the T tokens of xq. kGroup32: w.group is 32 (checked by the caller).
template <bool kGroup32>
void rows_of(const XBlock* xq, int64_t T, int64_t ldxq, const Int4Matrix& w, int64_t n0, int64_t n1, float* y,
             int64_t ldy) {
  // 1-2 tokens, and up to 8 on rows of 2048 columns or more: runs of consecutive rows, one row of each at a
  // time, each run read as one long stream; else 2 adjacent rows in passes of 4. Rows left over go one at
  // a time. From DRAM, one thread, 3 / 8 tokens, adjacent rows -> 4 runs in passes of 2: 512 x 2048 74 /
  // 193-240 -> 55 / 132-136 us, Kimi-K2's 2048 x 7168 900 / 2200 -> 790 / 1790; but 2048 x 512 (256-byte
  // rows) 52 / 130 -> 55-62 / 138-157, as the passes of 2 decode each row twice as often (a Zen 4 core,
  // two interleaved rounds of medians of 3).
  int64_t n = n0;
  const bool long_rows = w.words_per_row * 8 >= 2048;
  if (T <= 2 || (T <= 8 && long_rows && !kTwoRunsFromThreeTokens))
    n = walk_runs<4>(n, n1, [&](RowRuns at) { rows_pass<4, 2, kGroup32>(xq, T, ldxq, w, at, y + (at.n - n0), ldy); });
  else if (T <= 8 && long_rows)
    n = walk_runs<2>(n, n1, [&](RowRuns at) { rows_pass<2, 4, kGroup32>(xq, T, ldxq, w, at, y + (at.n - n0), ldy); });
  for (; n + 2 <= n1; n += 2) rows_pass<2, 4, kGroup32>(xq, T, ldxq, w, {n, 1}, y + (n - n0), ldy);
  for (; n < n1; ++n) rows_pass<1, 4, kGroup32>(xq, T, ldxq, w, {n, 1}, y + (n - n0), ldy);
}

}  // namespace

void MOE_INT8_KERNEL(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                     int64_t ldy) {
  const Int4Matrix rows(w, kBlockCols / 8);
  const int64_t K = w.cols, ldxq = rows.blocks;
  if (ldxq > kXBlocks) return linear_scalar(x, M, ldx, w, n0, n1, y, ldy);  // K > 65536: no model here
  XBlock xq[kXBlocks];
  const int64_t macro = std::max<int64_t>(1, kXBlocks / ldxq);
  for (int64_t m0 = 0; m0 < M; m0 += macro) {
    const int64_t T = std::min(macro, M - m0);
    quantize_x(x + m0 * ldx, T, ldx, K, rows.blocks, xq, ldxq);
    if (rows.group == 32) rows_of<true>(xq, T, ldxq, rows, n0, n1, y + m0 * ldy, ldy);
    else rows_of<false>(xq, T, ldxq, rows, n0, n1, y + m0 * ldy, ldy);
  }
}

}  // namespace moe::detail
