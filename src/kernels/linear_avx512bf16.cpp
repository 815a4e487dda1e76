// AVX-512 BF16 path of the linear kernel for bf16 and fp8 weights: vdpbf16ps multiplies bf16 pairs into
// fp32 accumulators at twice the fp32-FMA rate and consumes bf16 weights as stored, with no conversion, so
// compute-bound shapes (prefill, decode with many tokens per matrix, fp8 decoding) run up to ~2x faster.
// f32 weights take the exact fp32 path (linear_avx512.cpp).
//
// Numerics, and why this ISA is opt-in (LayerOptions::isa or --isa avx512bf16, never best_isa()):
// x is rounded to bf16 (round to nearest even) once per call, as vLLM, SGLang and llama.cpp do with bf16
// activations; for fp8 weights x is first multiplied by the weight block's scale_inv (fp32) and then
// rounded, so the scale costs nothing per weight. The fp8 codes become bf16 exactly (bf16 holds every e4m3
// value). vdpbf16ps flushes denormal inputs and results. Relative error of a dot product: about 2^-8 of
// sum |x * w|, against 2^-24 K for the exact path.
// Determinism: lane j of the accumulator of (m, n) sums the pairs k = 32 i + 2 j, 2 j + 1 in ascending i,
// zero-filled past K, then the fixed 16-lane tree; x's conversion depends on its row and the weight row's
// scales only. Every blocking below applies that same sequence, so the bits depend on (x row, W row) alone.
#include <immintrin.h>

#include <algorithm>

#include "kernels/avx512_hsum.h"
#include "kernels/linear_isa.h"

namespace moe::detail {

namespace {

constexpr int kStep = 32;             // k elements per vdpbf16ps
constexpr int64_t kScaleBlock = 128;  // fp8 block-scale granularity (rows and columns)
constexpr int64_t kMaxMacro = 32;     // tokens converted and blocked together
constexpr int64_t kXBufElems = 128 * 1024;  // bf16 x of one macro-block: 256 KiB of stack
constexpr int64_t kPanelCols = 512;   // fp8 columns decoded to bf16 at a time (a multiple of kScaleBlock)
constexpr int64_t kPrefetchLead = 8192;  // bytes: see Prefetch
constexpr int kMaxPassTokens = 6;     // 4 rows x 6 tokens: 24 accumulators + 6 x + 1 weight of 32 zmm
constexpr int kRunTokens = 8;         // bf16 runs (row_runs) up to 8 tokens, in passes of at most 6
constexpr int64_t kXRowPad = 32;      // bf16 elements between x rows: see convert_x

__mmask32 mask32(int64_t n) { return n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1u; }
__mmask16 mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u); }

// x rows [0, mc) as bf16 at xb, row stride ldxb, kpad columns each (K rounded up to kStep, the padding
// zero). Where kpad bf16 are a multiple of 4 KiB the stride is kpad + kXRowPad: with rows of 4 KiB
// (K = 2048) every x row and every weight row would map a column to the same L1 set, and 4 x rows + 2
// weight rows + the lines streamed in exceed its 12 ways (bf16 512x2048 at 4 tokens, one thread from
// DRAM: 67-68 -> 62 us with the pad; fp8 2048x7168, 14 KiB rows, measured 4% slower with it). With fp8
// weights, `scales` is the weight row block's scale_inv row: each 128-column block of x is multiplied by
// its scale before the rounding.
void convert_x(const float* x, int64_t mc, int64_t ldx, int64_t K, const float* scales, uint16_t* xb,
               int64_t kpad, int64_t ldxb) {
  for (int64_t t = 0; t < mc; ++t) {
    const float* xr = x + t * ldx;
    uint16_t* out = xb + t * ldxb;
    for (int64_t k = 0; k < kpad; k += kStep) {
      __m512 lo, hi;
      if (k + kStep <= K) {
        lo = _mm512_loadu_ps(xr + k);
        hi = _mm512_loadu_ps(xr + k + 16);
      } else {
        lo = _mm512_maskz_loadu_ps(mask16(K - k), xr + k);
        hi = _mm512_maskz_loadu_ps(mask16(K - k - 16), xr + std::min(k + 16, K));
      }
      if (scales) {
        const __m512 s = _mm512_set1_ps(scales[k / kScaleBlock]);
        lo = _mm512_mul_ps(lo, s);
        hi = _mm512_mul_ps(hi, s);
      }
      _mm512_storeu_si512(out + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

// fp8 e4m3 -> bf16, exact, 32 codes at a time: the 7 magnitude bits go to bf16 bits 4..10 and the exponent
// is rebiased by 120. Codes with a zero exponent (zero and subnormals, m * 2^-9) and the NaN codes
// (S.1111.111) are the exceptions; a 32-entry word table indexed by the low 5 bits of the code (00mmm for
// the former, 11111 for the latter) replaces them. 8 operations per 32 weights.
// (A byte-table decoder with vpermi2b, 5 operations per 64 weights, measured slower here: it is bound by
// the shuffle pipes, 0.70-0.76 of the bandwidth at one token against 0.89-0.91 for this one.)
struct Fp8Decoder {
  __m512i table;
  Fp8Decoder() {
    alignas(64) uint16_t t[32] = {};
    for (int m = 1; m < 8; ++m) {  // m * 2^-9 = (v / 8) * 2^(-6 - e) with v = m << e in [8, 16)
      int e = 0, v = m;
      while (v < 8) v <<= 1, ++e;
      t[m] = static_cast<uint16_t>(((127 - 6 - e) << 7) | ((v & 7) << 4));
    }
    t[31] = 0x7fc0;  // NaN
    table = _mm512_load_si512(t);
  }
  __m512bh operator()(__m256i bytes) const {
    const __m512i w = _mm512_cvtepi8_epi16(bytes);  // sign-extended: the sign also on bit 15
    const __m512i mag = _mm512_and_si512(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x07f0));
    // mag - 0x80 is in [0, 0x760] exactly for the normal non-NaN codes (unsigned wrap-around otherwise).
    const __m512i d = _mm512_sub_epi16(mag, _mm512_set1_epi16(0x0080));
    const __mmask32 special = _mm512_cmpgt_epu16_mask(d, _mm512_set1_epi16(0x0760));
    __m512i r = _mm512_add_epi16(d, _mm512_set1_epi16(0x3c80));  // mag + (120 << 7)
    r = _mm512_mask_permutexvar_epi16(r, special, w, table);
    return (__m512bh)_mm512_ternarylogic_epi32(r, w, _mm512_set1_epi16(static_cast<short>(0x8000)), 0xf8);
  }
};

// bf16 weight rows as stored: 32 columns from k (load_tail: n < 32 of them, the rest zero).
struct Bf16Rows {
  const uint16_t* p;
  int64_t ld;  // elements between rows
  __m512bh load(int r, int64_t k) const { return (__m512bh)_mm512_loadu_si512(p + r * ld + k); }
  __m512bh load_tail(int r, int64_t k, int64_t n) const {
    return (__m512bh)_mm512_maskz_loadu_epi16(mask32(n), p + r * ld + k);
  }
};

// fp8 weight rows, decoded as they are read (the zero-filled tail decodes to zeros).
struct Fp8Rows {
  const uint8_t* p;
  int64_t ld;
  const Fp8Decoder* dec;
  __m512bh load(int r, int64_t k) const {
    return (*dec)(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + r * ld + k)));
  }
  __m512bh load_tail(int r, int64_t k, int64_t n) const {
    return (*dec)(_mm256_maskz_loadu_epi8(mask32(n), p + r * ld + k));
  }
};

// A row block ahead streamed in at the rate this one's columns are consumed (the hardware prefetchers
// lose R short row streams at every row block): the block at least kPrefetchLead bytes ahead, so that short
// blocks still give the memory time (one thread, bf16 1 KiB rows x 4, 8 tokens: 81 -> 70 us per matrix
// with the block 8 KiB ahead instead of the next one; the same lead made the exact path's fp32 panels
// 13% slower, so it keeps the next block); the blocks in between were streamed by the row blocks before.
// bf16 rows stream a step's share (R lines) at every step, fp8 rows 128 columns' worth every 128 columns:
// spread out, bf16 512x2048 at one token went from 61-62 to 56-57 us (one thread, from DRAM), while fp8
// at one token measured slower.
struct Prefetch {
  const char* next = nullptr;
  const char* end = nullptr;
  int64_t bytes_per_col = 0;  // R * element size
  // Always inlined into the micro-kernels' k loop: a call there would spill every accumulator around it
  // (a one-field change to this struct once made GCC stop inlining it, 2x slower).
  __attribute__((always_inline)) void columns(int64_t c0, int64_t c1) const {
    if (!next) return;
    const char* to = std::min(next + c1 * bytes_per_col, end);
    for (const char* p = next + c0 * bytes_per_col; p < to; p += 64) _mm_prefetch(p, _MM_HINT_T0);
  }
  // Slice `part` of `parts` of the bytes, streamed over the same `cols` columns: passes over the same rows
  // each stream a share, so the reads run at an even rate under all of the block's work.
  Prefetch share(int64_t part, int64_t parts, int64_t cols) const {
    if (!next || parts <= 1 || cols <= 0) return *this;
    const int64_t slice = (cols * bytes_per_col / 64 + parts - 1) / parts * 64;
    const char* from = next + part * slice;
    if (from >= end) return {};
    return {from, std::min(end, from + slice), (slice + cols - 1) / cols};
  }
};

// acc[r][t] over columns [0, K) of rows S (R of them) against T bf16 x rows (zero past K, up to a whole
// step). The accumulators come from and go back to acc_mem ([T][R][16]) when it is given, else start at
// zero and end as y[t * ldy + r].
template <int R, int T, class S, bool kPerStep, class P = Prefetch>
void micro(const uint16_t* xb, int64_t ldxb, const S& w, int64_t K, const P& pf, float* acc_mem, float* y,
           int64_t ldy, int64_t y_row_step = 1) {
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][t] = acc_mem ? _mm512_load_ps(acc_mem + (t * R + r) * 16) : _mm512_setzero_ps();
  // The T x vectors are loaded first and each row is loaded (decoded) as it is used: R x T accumulators,
  // T x vectors and one weight vector stay within the 32 registers for every shape used here. Always
  // inlined: once this file grew, GCC outlined the step of some shapes and kept their accumulators in
  // memory (fp8 panels at 5 tokens ran 2x slower).
  const auto step = [&](int64_t k, bool tail) __attribute__((always_inline)) {
    __m512bh xv[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) xv[t] = (__m512bh)_mm512_loadu_si512(xb + t * ldxb + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh wv = tail ? w.load_tail(r, k, K - k) : w.load(r, k);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], xv[t], wv);
    }
  };
  int64_t k = 0;
  for (; k + kStep <= K; k += kStep) {
    // One token: two steps' share every other step (54.6-56.6 against 56.3-58.8 us per bf16 512x2048
    // matrix); more: every step (every other one: 4 tokens 61-67 -> 73-77 us).
    if constexpr (kPerStep) {
      constexpr int64_t kCols = T == 1 ? 2 * kStep : kStep;
      if (k % kCols == 0) pf.columns(k, k + kCols);
    }
    else if (k % kScaleBlock == 0) pf.columns(k, k + kScaleBlock);
    step(k, false);
  }
  if (k < K) step(k, true);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (acc_mem) _mm512_store_ps(acc_mem + (t * R + r) * 16, acc[r][t]);
      else y[t * ldy + r * y_row_step] = hsum16(acc[r][t]);
    }
}

// All mc tokens against R rows, in passes of up to kMaxT tokens (later passes re-read the rows from
// L1/L2); each pass streams its share of the next row block. Callers instantiate only the shapes they
// run: the inliner's choices for the others follow the file's size (fp8 panels at 5-6 tokens moved by
// up to 10% when never-run shapes were added).
template <int R, int kMaxT, bool kPerStep, class S>
void passes(const uint16_t* xb, int64_t ldxb, int64_t mc, const S& w, int64_t K, const Prefetch& pf,
            float* acc_mem, float* y, int64_t ldy) {
  static_assert(kMaxT >= 1 && kMaxT <= 8 && R * kMaxT + kMaxT + 1 <= 32, "accumulators, x and w in 32 zmm");
  const int64_t num_passes = (mc + kMaxT - 1) / kMaxT;
  for (int64_t t = 0; t < mc; t += kMaxT) {
    const Prefetch p = pf.share(t / kMaxT, num_passes, K);
    const uint16_t* xt = xb + t * ldxb;
    float* at = acc_mem ? acc_mem + t * R * 16 : nullptr;
    float* yt = y + t * ldy;
    switch (std::min<int64_t>(mc - t, kMaxT)) {
      case 8: if constexpr (kMaxT >= 8) micro<R, 8, S, kPerStep>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 7: if constexpr (kMaxT >= 7) micro<R, 7, S, kPerStep>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 6: if constexpr (kMaxT >= 6) micro<R, 6, S, kPerStep>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 5: if constexpr (kMaxT >= 5) micro<R, 5, S, kPerStep>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 4: if constexpr (kMaxT >= 4) micro<R, 4, S, kPerStep>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 3: if constexpr (kMaxT >= 3) micro<R, 3, S, kPerStep>(xt, ldxb, w, K, p, at, yt, ldy); break;
      case 2: if constexpr (kMaxT >= 2) micro<R, 2, S, kPerStep>(xt, ldxb, w, K, p, at, yt, ldy); break;
      default: micro<R, 1, S, kPerStep>(xt, ldxb, w, K, p, at, yt, ldy); break;
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
      for (int64_t k = c0; k < c1; k += kStep)
        _mm512_store_si512(panel + r * kPanelCols + (k - c0),
                           (__m512i)(k + kStep <= c1 ? w.load(r, k) : w.load_tail(r, k, c1 - k)));
    const int64_t cols = (c1 - c0 + kStep - 1) / kStep * kStep;  // the panel's tail lanes are zero
    passes<R, kMaxPassTokens, false>(xb + c0, ldxb, mc, Bf16Rows{panel, kPanelCols}, cols, Prefetch{}, acc_mem,
                                     nullptr, 0);
  }
  for (int64_t t = 0; t < mc; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r] = hsum16(_mm512_load_ps(acc_mem + (t * R + r) * 16));
}

// The prefetch of R runs of rows (row_runs): each run's stream kRunLeadBytes ahead of its reads.
template <int R>
struct RunPrefetch {
  const char* ahead[R];  // run r's read position plus the lead, at column 0
  const char* end;
  int64_t es;  // bytes per element
  __attribute__((always_inline)) void columns(int64_t c0, int64_t c1) const {
    for (int64_t c = c0 * es; c < c1 * es; c += 64)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        if (ahead[r] + c < end) _mm_prefetch(ahead[r] + c, _MM_HINT_T0);
  }
};
constexpr int64_t kRunLeadBytes = 2048;

// Rows [n, n1) as 4 runs of consecutive rows against up to kMaxT tokens (passes of up to 6, the later ones
// re-reading the 4 rows from L1), as the exact path's run_kernel does: each run is read front to back as
// one long stream, prefetched kRunLeadBytes ahead, on into its next row, where adjacent rows end their
// streams every few rows and the hardware prefetchers start over. rows_at(row, ld) gives the rows S from
// `row` on, ld elements apart. Returns the first row left over (fewer than 4).
template <class S, int kMaxT, bool kPerStep, class RowsAt>
int64_t row_runs(const uint16_t* xb, int64_t ldxb, int64_t mc, const WeightView& w, int64_t n, int64_t n1, float* y,
                 int64_t ldy, const RowsAt& rows_at) {
  constexpr int R = 4;
  const int64_t K = w.cols, run = (n1 - n) / R, es = static_cast<int64_t>(dtype_size(w.dtype));
  const char* base = static_cast<const char*>(w.data);
  const char* end = base + w.rows * K * es;
  for (int64_t i = 0; i < run; ++i) {
    const S rows = rows_at(n + i, run * K);
    RunPrefetch<R> pf{{}, end, es};
    for (int r = 0; r < R; ++r) pf.ahead[r] = base + (n + i + r * run) * K * es + kRunLeadBytes;
    for (int64_t t = 0; t < mc;) {
      const int64_t T = mc - t > 6 ? 4 : mc - t;
      const uint16_t* xt = xb + t * ldxb;
      float* yt = y + n + i + t * ldy;
      switch (T) {
        case 1: micro<R, 1, S, kPerStep>(xt, ldxb, rows, K, pf, nullptr, yt, ldy, run); break;
        case 2: micro<R, 2, S, kPerStep>(xt, ldxb, rows, K, pf, nullptr, yt, ldy, run); break;
        case 3: if constexpr (kMaxT >= 3) micro<R, 3, S, kPerStep>(xt, ldxb, rows, K, pf, nullptr, yt, ldy, run); break;
        case 4: if constexpr (kMaxT >= 4) micro<R, 4, S, kPerStep>(xt, ldxb, rows, K, pf, nullptr, yt, ldy, run); break;
        case 5: if constexpr (kMaxT >= 5) micro<R, 5, S, kPerStep>(xt, ldxb, rows, K, pf, nullptr, yt, ldy, run); break;
        default: if constexpr (kMaxT >= 6) micro<R, 6, S, kPerStep>(xt, ldxb, rows, K, pf, nullptr, yt, ldy, run); break;
      }
      t += T;
    }
  }
  return n + R * run;
}

// The stream for rows [n, n + R) of w: the row block at least `lead` bytes ahead.
Prefetch ahead_of(const WeightView& w, int64_t n, int R, int64_t es, int64_t lead) {
  const int64_t block = std::max<int64_t>(R * w.cols * es, 1);
  const char* base = static_cast<const char*>(w.data);
  const int64_t ahead = std::max<int64_t>(1, (lead + block - 1) / block);
  return {base + (n + ahead * R) * w.cols * es, base + w.rows * w.cols * es, R * es};
}

// bf16 rows [n, n + R) against tokens [0, mc) of xb in passes of up to kMaxT, the row block kPrefetchLead
// bytes ahead streamed in a step's share at a time.
template <int R, int kMaxT>
void bf16_block(const uint16_t* xb, int64_t ldxb, int64_t mc, const WeightView& w, int64_t n, float* y, int64_t ldy) {
  const Bf16Rows rows{static_cast<const uint16_t*>(w.data) + n * w.cols, w.cols};
  passes<R, kMaxT, true>(xb, ldxb, mc, rows, w.cols, ahead_of(w, n, R, 2, kPrefetchLead), nullptr, y, ldy);
}

// fp8 rows [n, n + R): up to 4 tokens (a single pass) decoded as read, more decoded once into panels.
template <int R, int kMaxT>
void fp8_block(const uint16_t* xb, int64_t ldxb, int64_t mc, const WeightView& w, int64_t n, const Fp8Decoder& dec,
               float* y, int64_t ldy) {
  const Fp8Rows rows{static_cast<const uint8_t*>(w.data) + n * w.cols, w.cols, &dec};
  const Prefetch pf = ahead_of(w, n, R, 1, kPrefetchLead);
  constexpr int kReadT = std::min(kMaxT, 4);
  if (mc <= kReadT) return passes<R, kReadT, false>(xb, ldxb, mc, rows, w.cols, pf, nullptr, y, ldy);
  if constexpr (kMaxT > 4) fp8_panels<R>(xb, ldxb, mc, rows, w.cols, pf, y, ldy);
}

}  // namespace

void linear_avx512bf16(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                       float* y, int64_t ldy) {
  const int64_t K = w.cols;
  const int64_t kpad = (K + kStep - 1) / kStep * kStep;
  if (w.dtype == DType::kF32 || kpad + kXRowPad > kXBufElems) return linear_avx512(x, M, ldx, w, n0, n1, y, ldy);
  static const Fp8Decoder dec;
  alignas(64) uint16_t xb[kXBufElems];
  const bool fp8 = w.dtype == DType::kF8E4M3;
  const int64_t ldxb = kpad + ((kpad * 2) % 4096 == 0 ? kXRowPad : 0);
  const int64_t macro = std::min(kMaxMacro, kXBufElems / ldxb);
  for (int64_t m0 = 0; m0 < M; m0 += macro) {
    const int64_t mc = std::min(macro, M - m0);
    // fp8: x carries the scales, so it is converted per 128-row block of the weights.
    for (int64_t s0 = n0; s0 < n1;) {
      const int64_t s1 = fp8 ? std::min(n1, (s0 / kScaleBlock + 1) * kScaleBlock) : n1;
      const float* scales = fp8 ? w.scale_inv + (s0 / kScaleBlock) * ((K + kScaleBlock - 1) / kScaleBlock) : nullptr;
      convert_x(x + m0 * ldx, mc, ldx, K, scales, xb, kpad, ldxb);
      float* ym = y + m0 * ldy - n0;
      int64_t n = s0;
      // Up to 8 bf16 tokens or 4 fp8 ones (a single pass, decoded as read): 4 runs of consecutive rows,
      // each read as one stream (row_runs; fp8 runs lie within the 128-row block whose scales x carries),
      // then the rows left over one at a time. Against the adjacent blocks they replaced (2 rows, each pair
      // 8-16 KiB ahead, for bf16; 8 rows at 1-2 tokens and 4 beyond for fp8), Zen 5, from DRAM, us per
      // matrix, two threads: bf16 512x2048 (2048x512) at 1 / 2 tokens 56-58 / 56-57 (52-53 / 47-48) ->
      // 34-35 / 32-34 (36 / 33-37), 0.5-0.6 of the read bandwidth -> 0.8-0.96, and 3-8 tokens 1.1-1.6x
      // faster; fp8 2048x7168 at 1 / 2 / 3 / 4 tokens 301-321 / 346-352 / 397-404 / 445-463 -> 246-269 /
      // 299-322 / 362-378 / 387-422. From 10 bf16 tokens runs measured mixed (2048x512 slower at 16-32);
      // there, and for fp8 from 5 tokens, 4 adjacent rows x up to 6 tokens per pass stay.
      if (fp8) {
        if (mc <= 4) {
          const auto* base = static_cast<const uint8_t*>(w.data);
          n = row_runs<Fp8Rows, 4, false>(xb, ldxb, mc, w, n, s1, ym, ldy, [&](int64_t row, int64_t ld) {
            return Fp8Rows{base + row * w.cols, ld, &dec};
          });
        }
        for (; n + 4 <= s1; n += 4) fp8_block<4, kMaxPassTokens>(xb, ldxb, mc, w, n, dec, ym + n, ldy);
        for (; n < s1; ++n) fp8_block<1, kMaxPassTokens>(xb, ldxb, mc, w, n, dec, ym + n, ldy);
      } else {
        if (mc <= kRunTokens) {
          const auto* base = static_cast<const uint16_t*>(w.data);
          n = row_runs<Bf16Rows, kRunTokens, true>(xb, ldxb, mc, w, n, s1, ym, ldy, [&](int64_t row, int64_t ld) {
            return Bf16Rows{base + row * w.cols, ld};
          });
        }
        for (; n + 4 <= s1; n += 4) bf16_block<4, kMaxPassTokens>(xb, ldxb, mc, w, n, ym + n, ldy);
        for (; n < s1; ++n) bf16_block<1, kRunTokens>(xb, ldxb, mc, w, n, ym + n, ldy);
      }
      s0 = s1;
    }
  }
}

}  // namespace moe::detail
