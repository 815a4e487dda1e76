// AVX-512 BF16 path of the linear kernel for bf16 and fp8 weights: vdpbf16ps multiplies bf16 pairs into
// fp32 accumulators at twice the fp32-FMA rate and consumes bf16 weights as stored, with no conversion, so
// compute-bound shapes (prefill, decode with many tokens per matrix, fp8 decoding) run up to ~2x faster.
// f32 weights take the exact fp32 path (linear_avx512.cpp).
//
// Numerics, and why this ISA is opt-in (set_active_isa or MOE_KERNEL_ISA=avx512bf16, never best_isa()):
// x is rounded to bf16 (round to nearest even) once per call, as vLLM, SGLang and llama.cpp do with bf16
// activations; for fp8 weights x is first multiplied by the weight block's scale_inv (fp32) and then
// rounded, so the scale costs nothing per weight. The fp8 codes become bf16 exactly (bf16 holds every e4m3
// value) through two byte-table lookups per 64 weights. vdpbf16ps flushes denormal inputs and results. Relative error of a dot product: about 2^-8 of
// sum |x * w|, against 2^-24 K for the exact path.
// Determinism: lane j of the accumulator of (m, n) sums a fixed pair of columns from every 32-column
// vector in ascending order (bf16: k = 32 i + 2 j, 2 j + 1; fp8: the same after the fixed in-chunk column
// order of Fp8Decoder), zero-filled past K, then the fixed 16-lane tree; x's conversion depends on its row
// and the weight row's scales only. Every blocking below applies that same sequence, so the bits depend on
// (x row, W row) alone.
#include <immintrin.h>

#include <algorithm>

#include "kernels/dtype.h"
#include "kernels/linear_isa.h"

namespace moe::detail {

namespace {

constexpr int kStep = 32;             // k elements per vdpbf16ps
constexpr int64_t kScaleBlock = 128;  // fp8 block-scale granularity (rows and columns)
constexpr int64_t kMaxMacro = 32;     // tokens converted and blocked together
constexpr int64_t kXBufElems = 128 * 1024;  // bf16 x of one macro-block: 256 KiB of stack
constexpr int64_t kPanelCols = 512;   // fp8 columns decoded to bf16 at a time (a multiple of kScaleBlock)
constexpr int kMaxPassTokens = 6;     // 4 rows x 6 tokens: 24 accumulators + 6 x + 1 weight of 32 zmm

__mmask32 mask32(int64_t n) { return n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1u; }
__mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u); }

// The fixed 16-lane tree of linear_avx512.cpp.
float hsum_tree(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

struct Fp8Decoder;
void store_x(__m512i n0, __m512i n1, const Fp8Decoder* order, uint16_t* out);

// x rows [0, mc) as bf16 at xb (row stride kpad = K rounded up to kpad's step, the padding zero). With fp8
// weights, `scales` is the weight row block's scale_inv row (each 128-column block of x is multiplied by its
// scale before the rounding) and `order` puts each 64-column chunk in the decoder's column order.
void convert_x(const float* x, int64_t mc, int64_t ldx, int64_t K, const float* scales, const Fp8Decoder* order,
               uint16_t* xb, int64_t kpad) {
  for (int64_t t = 0; t < mc; ++t) {
    const float* xr = x + t * ldx;
    uint16_t* out = xb + t * kpad;
    for (int64_t k = 0; k < kpad; k += 2 * kStep) {
      __m512i half[2];
      for (int h = 0; h < 2; ++h) {
        const int64_t kh = k + h * kStep;
        __m512 lo, hi;
        if (kh + kStep <= K) {
          lo = _mm512_loadu_ps(xr + kh);
          hi = _mm512_loadu_ps(xr + kh + 16);
        } else {
          lo = _mm512_maskz_loadu_ps(mask16(K - kh), xr + std::min(kh, K));
          hi = _mm512_maskz_loadu_ps(mask16(K - kh - 16), xr + std::min(kh + 16, K));
        }
        if (scales) {
          const __m512 s = _mm512_set1_ps(scales[kh / kScaleBlock]);
          lo = _mm512_mul_ps(lo, s);
          hi = _mm512_mul_ps(hi, s);
        }
        half[h] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      }
      store_x(half[0], half[1], order, out + k);
    }
  }
}

// fp8 e4m3 -> bf16, exact, 64 codes at a time: the 7 magnitude bits index two 128-entry byte tables (the
// bf16's low and high bytes, vpermi2b), the sign is or-ed into the high byte, and the byte pairs are
// interleaved into words. The interleave works within 128-bit lanes, so of a 64-column chunk the first
// vector holds columns {0-7, 16-23, 32-39, 48-55} and the second {8-15, 24-31, 40-47, 56-63}; x is
// converted into the same order (chunk_order), and every column pair still meets its own x pair.
// 5 operations per 64 weights; NaN codes (S.1111.111) become a bf16 NaN, subnormals are exact.
struct Fp8Decoder {
  static constexpr int kChunk = 64;
  __m512i lo0, lo1, hi0, hi1;  // bytes of bf16(fp8 magnitude m), m in [0, 64) and [64, 128)
  __m512i first, second;       // word indices of chunk_order
  Fp8Decoder() {
    alignas(64) uint8_t lo[128], hi[128];
    for (int m = 0; m < 128; ++m) {
      const uint16_t b = m == 0x7f ? 0x7fc0 : f32_to_bf16(fp8e4m3_to_f32(static_cast<uint8_t>(m)));
      lo[m] = static_cast<uint8_t>(b);
      hi[m] = static_cast<uint8_t>(b >> 8);
    }
    lo0 = _mm512_load_si512(lo), lo1 = _mm512_load_si512(lo + 64);
    hi0 = _mm512_load_si512(hi), hi1 = _mm512_load_si512(hi + 64);
    alignas(64) uint16_t a[32], b[32];
    for (int i = 0; i < 32; ++i) {
      a[i] = static_cast<uint16_t>((i / 8) * 16 + i % 8);
      b[i] = static_cast<uint16_t>(a[i] + 8);
    }
    first = _mm512_load_si512(a), second = _mm512_load_si512(b);
  }
  // 64 codes -> the chunk's two bf16 vectors.
  void decode(__m512i codes, __m512bh* out) const {
    const __m512i l = _mm512_permutex2var_epi8(lo0, codes, lo1);
    __m512i h = _mm512_permutex2var_epi8(hi0, codes, hi1);
    h = _mm512_ternarylogic_epi32(h, codes, _mm512_set1_epi8(static_cast<char>(0x80)), 0xf8);  // h | (c & 0x80)
    out[0] = (__m512bh)_mm512_unpacklo_epi8(l, h);
    out[1] = (__m512bh)_mm512_unpackhi_epi8(l, h);
  }
  // Natural-order bf16 x columns [0, 32) and [32, 64) of a chunk -> the decoder's column order.
  void chunk_order(__m512i n0, __m512i n1, uint16_t* out) const {
    _mm512_storeu_si512(out, _mm512_permutex2var_epi16(n0, first, n1));
    _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi16(n0, second, n1));
  }
};

void store_x(__m512i n0, __m512i n1, const Fp8Decoder* order, uint16_t* out) {
  if (order) return order->chunk_order(n0, n1, out);
  _mm512_storeu_si512(out, n0);
  _mm512_storeu_si512(out + 32, n1);
}

// Row sources for micro(): kVecs bf16 vectors of 32 columns per step of kStepCols columns.
// bf16 weight rows as stored.
struct Bf16Rows {
  static constexpr int kVecs = 1;
  const uint16_t* p;
  int64_t ld;  // elements between rows
  void load(int r, int64_t k, __m512bh* v) const { v[0] = (__m512bh)_mm512_loadu_si512(p + r * ld + k); }
  void load_tail(int r, int64_t k, int64_t n, __m512bh* v) const {
    v[0] = (__m512bh)_mm512_maskz_loadu_epi16(mask32(n), p + r * ld + k);
  }
};

// fp8 weight rows, decoded as they are read (the zero-filled tail decodes to zeros).
struct Fp8Rows {
  static constexpr int kVecs = 2;
  const uint8_t* p;
  int64_t ld;
  const Fp8Decoder* dec;
  void load(int r, int64_t k, __m512bh* v) const { dec->decode(_mm512_loadu_si512(p + r * ld + k), v); }
  void load_tail(int r, int64_t k, int64_t n, __m512bh* v) const {
    const __mmask64 m = n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
    dec->decode(_mm512_maskz_loadu_epi8(m, p + r * ld + k), v);
  }
};

// The next row block's bytes, streamed in at the rate this one's columns are consumed: the hardware
// prefetchers lose R short row streams at every row block.
struct Prefetch {
  const char* next = nullptr;
  const char* end = nullptr;
  int64_t bytes_per_col = 0;  // R * element size
  void columns(int64_t c0, int64_t c1) const {
    if (!next) return;
    const char* to = std::min(next + c1 * bytes_per_col, end);
    for (const char* p = next + c0 * bytes_per_col; p < to; p += 64) _mm_prefetch(p, _MM_HINT_T0);
  }
};

// acc[r][t] over columns [0, K) of rows S (R of them) against T bf16 x rows (zero past K, up to a whole
// step). The accumulators come from and go back to acc_mem ([T][R][16]) when it is given, else start at
// zero and end as y[t * ldy + r].
template <int R, int T, class S>
void micro(const uint16_t* xb, int64_t ldxb, const S& w, int64_t K, const Prefetch& pf, float* acc_mem, float* y,
           int64_t ldy) {
  constexpr int V = S::kVecs;
  constexpr int64_t kCols = V * kStep;
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][t] = acc_mem ? _mm512_load_ps(acc_mem + (t * R + r) * 16) : _mm512_setzero_ps();
  // The T x vectors are loaded first and each row is loaded (decoded) as it is used: R x T accumulators,
  // T x V x vectors and V weight vectors stay within the 32 registers for every shape used here.
  const auto step = [&](int64_t k, bool tail) {
    __m512bh xv[T][V];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) xv[t][v] = (__m512bh)_mm512_loadu_si512(xb + t * ldxb + k + v * kStep);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512bh wv[V];
      if (tail) w.load_tail(r, k, K - k, wv);
      else w.load(r, k, wv);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v)
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv[t][v], wv[v]);
    }
  };
  int64_t k = 0;
  for (; k + kCols <= K; k += kCols) {
    if (k % kScaleBlock == 0) pf.columns(k, k + kScaleBlock);
    step(k, false);
  }
  if (k < K) step(k, true);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (acc_mem) _mm512_store_ps(acc_mem + (t * R + r) * 16, acc[r][t]);
      else y[t * ldy + r] = hsum_tree(acc[r][t]);
    }
}

// All mc tokens against R rows, in passes of up to kMaxPassTokens tokens (later passes re-read the rows
// from L1/L2); only the first pass prefetches.
template <int R, class S>
void passes(const uint16_t* xb, int64_t ldxb, int64_t mc, const S& w, int64_t K, const Prefetch& pf,
            float* acc_mem, float* y, int64_t ldy) {
  const Prefetch none;
  for (int64_t t = 0; t < mc; t += kMaxPassTokens) {
    const Prefetch& p = t == 0 ? pf : none;
    const uint16_t* xt = xb + t * ldxb;
    float* at = acc_mem ? acc_mem + t * R * 16 : nullptr;
    float* yt = y + t * ldy;
    switch (std::min<int64_t>(mc - t, kMaxPassTokens)) {
      case 6: micro<R, 6>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 5: micro<R, 5>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 4: micro<R, 4>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 3: micro<R, 3>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 2: micro<R, 2>(xt, ldxb, w, K, p, at, yt, ldy); break;
      default: micro<R, 1>(xt, ldxb, w, K, p, at, yt, ldy); break;
    }
  }
}

// fp8 rows against several tokens: each kPanelCols-column panel of the R rows is decoded to bf16 once
// (L1) and every pass reads it there; the accumulators wait in acc_mem between panels, stored and
// reloaded unchanged, so the per-lane sequence is that of one long micro().
template <int R>
void fp8_panels(const uint16_t* xb, int64_t ldxb, int64_t mc, const Fp8Rows& w, int64_t K, const Prefetch& pf,
                float* y, int64_t ldy) {
  alignas(64) uint16_t panel[R * kPanelCols];
  alignas(64) float acc_mem[kMaxMacro * R * 16];
  std::fill(acc_mem, acc_mem + mc * R * 16, 0.0f);
  for (int64_t c0 = 0; c0 < K; c0 += kPanelCols) {
    const int64_t c1 = std::min(K, c0 + kPanelCols);
    pf.columns(c0, c1);
    for (int r = 0; r < R; ++r)
      for (int64_t k = c0; k < c1; k += Fp8Decoder::kChunk) {
        __m512bh v[2];
        if (k + Fp8Decoder::kChunk <= c1) w.load(r, k, v);
        else w.load_tail(r, k, c1 - k, v);
        _mm512_store_si512(panel + r * kPanelCols + (k - c0), (__m512i)v[0]);
        _mm512_store_si512(panel + r * kPanelCols + (k - c0) + kStep, (__m512i)v[1]);
      }
    // Whole chunks (the tail decoded to zeros), read as plain bf16 rows in the chunk order x also has.
    const int64_t cols = (c1 - c0 + Fp8Decoder::kChunk - 1) / Fp8Decoder::kChunk * Fp8Decoder::kChunk;
    passes<R>(xb + c0, ldxb, mc, Bf16Rows{panel, kPanelCols}, cols, Prefetch{}, acc_mem, nullptr, 0);
  }
  for (int64_t t = 0; t < mc; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r] = hsum_tree(_mm512_load_ps(acc_mem + (t * R + r) * 16));
}

// One row block: rows [n, n + R) of w, tokens [0, mc) of xb.
template <int R>
void row_block(const uint16_t* xb, int64_t ldxb, int64_t mc, const WeightView& w, int64_t n, const Fp8Decoder& dec,
               float* y, int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t es = w.dtype == DType::kF8E4M3 ? 1 : 2;
  const char* base = static_cast<const char*>(w.data);
  const Prefetch pf{base + (n + R) * K * es, base + w.rows * K * es, R * es};
  if (w.dtype == DType::kBF16)
    return passes<R>(xb, ldxb, mc, Bf16Rows{static_cast<const uint16_t*>(w.data) + n * K, K}, K, pf, nullptr, y, ldy);
  const Fp8Rows rows{static_cast<const uint8_t*>(w.data) + n * K, K, &dec};
  // Up to 4 tokens (one pass; the registers hold 4 x 2 x vectors): decoded as read.
  if (mc <= 4) return passes<R>(xb, ldxb, mc, rows, K, pf, nullptr, y, ldy);
  fp8_panels<R>(xb, ldxb, mc, rows, K, pf, y, ldy);
}

}  // namespace

void linear_avx512bf16(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                       float* y, int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t kpad = (K + Fp8Decoder::kChunk - 1) / Fp8Decoder::kChunk * Fp8Decoder::kChunk;
  if (w.dtype == DType::kF32 || kpad > kXBufElems) return linear_avx512(x, M, ldx, w, n0, n1, y, ldy);
  static const Fp8Decoder dec;
  alignas(64) uint16_t xb[kXBufElems];
  const bool fp8 = w.dtype == DType::kF8E4M3;
  const int64_t macro = std::min(kMaxMacro, kXBufElems / std::max<int64_t>(kpad, 1));
  for (int64_t m0 = 0; m0 < M; m0 += macro) {
    const int64_t mc = std::min(macro, M - m0);
    // fp8: x carries the scales, so it is converted per 128-row block of the weights.
    for (int64_t s0 = n0; s0 < n1;) {
      const int64_t s1 = fp8 ? std::min(n1, (s0 / kScaleBlock + 1) * kScaleBlock) : n1;
      const float* scales = fp8 ? w.scale_inv + (s0 / kScaleBlock) * ((K + kScaleBlock - 1) / kScaleBlock) : nullptr;
      convert_x(x + m0 * ldx, mc, ldx, K, scales, fp8 ? &dec : nullptr, xb, kpad);
      float* ym = y + m0 * ldy - n0;
      int64_t n = s0;
      if (mc <= 2)  // few tokens: more rows in flight to cover the memory and dot-product latency
        for (; n + 8 <= s1; n += 8) row_block<8>(xb, kpad, mc, w, n, dec, ym + n, ldy);
      for (; n + 4 <= s1; n += 4) row_block<4>(xb, kpad, mc, w, n, dec, ym + n, ldy);
      for (; n < s1; ++n) row_block<1>(xb, kpad, mc, w, n, dec, ym + n, ldy);
      s0 = s1;
    }
  }
}

}  // namespace moe::detail
