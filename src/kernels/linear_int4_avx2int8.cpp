// AVX2 linear kernel for int4 group-quantised weights against x quantized to int8 (the avx2int8 ISA, opt-in):
// vpmaddubsw multiplies the weights' unsigned 4-bit fields by the int8 x and adds pairs, so 64 weights cost
// about 11 instructions per token where the exact AVX2 kernel (linear_int4_avx2.cpp), which is bound by its
// decoding, needs 32. llama.cpp runs its q4_0 weights against q8_0 activations the same way.
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
// sum over word l.
//
// Determinism contract: y[m, n] is accumulated in one vector whose lane l adds, block by block ascending,
// float((field - 8) . q) * (d * s) by fp32 FMA, then reduced by the fixed 8-lane tree; q and d depend on the
// token's x row alone. Blocking over rows and tokens only changes how many accumulators are live.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/int4_avx2.h"
#include "kernels/linear_isa.h"

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

// Quantizes 32 columns (n of them real, the rest zero) into chunk h (0 or 1) of `out`.
void quantize_chunk(const float* x, int64_t n, int h, XBlock& out) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t k = 0; k < n; ++k) {
    finite = finite && std::isfinite(x[k]);
    amax = std::max(amax, std::fabs(x[k]));
  }
  const float d = !finite ? NAN : amax / 127.0f;
  const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t q[kChunkCols] = {};
  for (int64_t k = 0; k < n; ++k) q[k] = static_cast<int32_t>(std::nearbyint(x[k] * inv));  // |q| <= 127
  for (int j = 0; j < 16; ++j) {
    out.even[16 * h + j] = static_cast<int8_t>(q[2 * j]);
    out.odd[16 * h + j] = static_cast<int8_t>(q[2 * j + 1]);
  }
  for (int l = 0; l < 4; ++l) {
    int32_t sum = 0;
    for (int i = 0; i < 8; ++i) sum += q[8 * l + i];
    out.corr[4 * h + l] = 8 * sum;
    out.d[4 * h + l] = d;
  }
}

// T tokens of x into xq, `blocks` XBlocks per token (ldxq apart); K % 32 == 0.
void quantize_x(const float* x, int64_t T, int64_t ldx, int64_t K, int64_t blocks, XBlock* xq, int64_t ldxq) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < blocks; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t c = b * kBlockCols + h * kChunkCols;
        quantize_chunk(x + t * ldx + c, std::clamp<int64_t>(K - c, 0, kChunkCols), h, xq[t * ldxq + b]);
      }
}

// y[t * ldy + r * run] for t < T, r < R: rows n + r * run against T tokens of xq (ldxq blocks apart).
// Streamed in as linear_int4_avx2.cpp's micro: with runs, each row's words kInt4RunLeadBytes ahead of its
// reads and its scales as far ahead in their own array; with adjacent rows, the next R rows at the rate these
// are read.
template <int R, int T>
void micro(const XBlock* xq, int64_t ldxq, const Int4Matrix& w, RowRuns at, float* y, int64_t ldy) {
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
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
  __m256 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < w.blocks; ++b) {
    const int64_t left = std::min<int64_t>(8, w.words_per_row - b * 8);
    if ((b & 1) == 0) {  // a block is half a line per row: one line per row every other block
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const char* p = at.run > 1 ? ahead[r] + b * 32 : next + (b / 2 * R + r) * 64;
        if (p < words_end) _mm_prefetch(p, _MM_HINT_T0);
      }
    }
    if (at.run > 1) {
      const int64_t s0 = w.scale_offset(b), s1 = w.scale_offset(b + 1);
      if ((s0 >> 6) != (s1 >> 6) || b == 0)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          if (sahead[r] + (s1 & ~int64_t{63}) < scales_end) _mm_prefetch(sahead[r] + (s1 & ~int64_t{63}), _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int* p = reinterpret_cast<const int*>(rows[r] + b * 8);
      const __m256i words =
          left == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskload_epi32(p, word_mask(left));
      const __m256i lo = _mm256_and_si256(words, low4), hi = _mm256_and_si256(_mm256_srli_epi16(words, 4), low4);
      const __m256 sv = scale_vector(w, srows[r], b);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const XBlock& xb = xq[t * ldxq + b];
        // Each 16-bit sum is at most 2 * 2 * 15 * 127: no saturation.
        const __m256i pairs =
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(xb.even))),
                             _mm256_maddubs_epi16(hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(xb.odd))));
        const __m256i dot = _mm256_sub_epi32(_mm256_madd_epi16(pairs, ones),
                                             _mm256_load_si256(reinterpret_cast<const __m256i*>(xb.corr)));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(_mm256_load_ps(xb.d), sv), acc[r][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r * at.run] = hsum8(acc[r][t]);
}

// Rows at.n + r * at.run (r < R) against all T tokens, in passes of up to P (2 or 4) tokens.
template <int R, int P>
void rows_pass(const XBlock* xq, int64_t T, int64_t ldxq, const Int4Matrix& w, RowRuns at, float* y, int64_t ldy) {
  for (int64_t t = 0; t < T; t += P) {
    const XBlock* xt = xq + t * ldxq;
    float* yt = y + t * ldy;
    switch (std::min<int64_t>(P, T - t)) {
      case 1: micro<R, 1>(xt, ldxq, w, at, yt, ldy); break;
      case 2: micro<R, 2>(xt, ldxq, w, at, yt, ldy); break;
      case 3:
        if constexpr (P > 2) micro<R, 3>(xt, ldxq, w, at, yt, ldy);
        break;
      default:
        if constexpr (P > 2) micro<R, 4>(xt, ldxq, w, at, yt, ldy);
        break;
    }
  }
}

}  // namespace

void linear_int4_avx2int8(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                          float* y, int64_t ldy) {
  const Int4Matrix rows(w, kBlockCols / 8);
  const int64_t K = w.cols, ldxq = rows.blocks;
  if (ldxq > kXBlocks) return linear_scalar(x, M, ldx, w, n0, n1, y, ldy);  // K > 65536: no model here
  XBlock xq[kXBlocks];
  const int64_t macro = std::max<int64_t>(1, kXBlocks / ldxq);
  for (int64_t m0 = 0; m0 < M; m0 += macro) {
    const int64_t T = std::min(macro, M - m0);
    quantize_x(x + m0 * ldx, T, ldx, K, rows.blocks, xq, ldxq);
    float* ym = y + m0 * ldy;
    // 1-2 tokens: 4 runs of consecutive rows, one row of each at a time, each run read as one long stream;
    // more: 2 adjacent rows in passes of 4 tokens. Rows left over go one at a time.
    int64_t n = n0;
    if (T <= 2) {
      constexpr int kRuns = 4;
      const int64_t run = (n1 - n) / kRuns;
      for (int64_t i = 0; i < run; ++i, ++n) rows_pass<kRuns, 2>(xq, T, ldxq, rows, {n, run}, ym + (n - n0), ldy);
      n += (kRuns - 1) * run;
    }
    for (; n + 2 <= n1; n += 2) rows_pass<2, 4>(xq, T, ldxq, rows, {n, 1}, ym + (n - n0), ldy);
    for (; n < n1; ++n) rows_pass<1, 4>(xq, T, ldxq, rows, {n, 1}, ym + (n - n0), ldy);
  }
}

}  // namespace moe::detail
