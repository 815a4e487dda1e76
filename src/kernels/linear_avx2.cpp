// AVX2 + FMA path of the linear kernel: 8 fp32 lanes. Compiled with its own target flags
// (src/kernels/CMakeLists.txt) and only called after a run-time CPU check (linear.cpp).
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "kernels/linear_isa.h"

namespace moe {
namespace {

// kIntoL1: whether the weights are prefetched into L1 or L2, and how far ahead the runs of rows go
// (prefetch() and kRunLeadBytes below); linear.cpp picks one per CPU family.
template <bool kIntoL1>
struct Avx2 {
  using Reg = __m256;
  static constexpr int kLanes = 8;
  // Register blocking: tokens per micro-block, and whether 6-row x 4-token blocks fit (16 registers).
  static constexpr int kTokens = 2;
  static constexpr bool kWideBlocks = false;
  // Panels: 4 rows x 3 tokens, 12 accumulators, the 3 tokens' x and one row's vector in the 16 registers.
  // 4 x 2 left 8 FMA chains for two 4-cycle FMA pipes and 6 loads per 8 FMAs; on a Zen 3, two threads,
  // one process alternating the two: bf16 512x2048 and 2048x512 from DRAM at 10-32 tokens 3-15% faster,
  // f32 and fp8 (2048x7168) 4-12%, the Qwen3-Next prefill of 512 / 2048 tokens 1.08x / 1.05x
  // (docs/kernel-notes.md, "AVX2 panels of 4 rows x 3 tokens").
  static constexpr int kPanelRows = 4;
  static constexpr int kPanelTokens = 3;
  // How many k steps of a panel's micro-block share one issue of the next row block's prefetch (and its
  // check): 8 against 1 (with the panel's step count a compile-time constant, no division): Zen 3, one
  // thread in L2, bf16 64x512 at 9 / 10 / 12 / 16 / 32 tokens 0.97 / 0.90 / 0.97 / 0.96 / 1.00x the time,
  // 16x2048 at 12 / 32 0.97 / 0.99x; two threads from DRAM, 2048x512 and 512x2048 at 10-16 tokens
  // 0.95-1.00x (docs/kernel-notes.md, "AVX2 sums four at a time").
  static constexpr int kPanelPrefetchSteps = 8;
  // How far ahead of its reads each run of rows is prefetched (run_kernel in linear_simd.h).
  static constexpr int64_t kRunLeadBytes = kIntoL1 ? 2048 : 4096;
  // fp8 panels are decoded by their first micro-block as it uses them (row_block_panel in linear_panels.h;
  // Zen 5, fp8 2048x7168 in L3 at 5 / 10 / 16 tokens, one thread 3.19 / 4.16 / 5.89 -> 2.38 / 3.54 /
  // 5.32 ms, two 1.56 / 2.11 / 2.99 -> 1.19 / 1.87 / 2.82 ms; docs/kernel-notes.md).
  static constexpr bool kFp8FillPanels = true;
  // fp8 blocks that the view's table alone decides skip the general per-block choice (dot_rows in
  // linear_simd.h, micro_panel in linear_panels.h).
  static constexpr bool kFp8TableBlocks = true;

  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  // Tails go through a zero-padded copy: AVX2 has no masked byte/word loads, and reading past the end of
  // a row could fault at the end of a mapping.
  static Reg load_tail(const float* p, int n) {
    alignas(32) float buf[kLanes] = {};
    std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(float));
    return _mm256_load_ps(buf);
  }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  // always_inline, like every function or lambda that only prefetches (linear_simd.h, dot_rows): GCC counts
  // a prefetch as free of side effects, deems such a function pure and deletes its calls before inlining.
  // Into L2 (T1) with runs 4 KiB ahead: on an AVX2-only Zen 4 guest, bf16 512x2048 from DRAM on two threads
  // at 1 / 2 / 4 / 8 tokens 80 / 89 / 105 / 179 -> 68 / 73 / 89 / 154 us against L1 (T0) 2 KiB ahead
  // (docs/kernel-notes.md, "AVX2 prefetches into L2"). On a Zen 5 L1 and 2 KiB, the AVX-512 kernels'
  // prefetch, is the faster one: the Qwen3-Next layer 1.05-1.17x at 1-128 tokens (docs/kernel-notes.md,
  // "The AVX2 prefetch per CPU family").
  __attribute__((always_inline)) static void prefetch(const void* p) {
    _mm_prefetch(static_cast<const char*>(p), kIntoL1 ? _MM_HINT_T0 : _MM_HINT_T1);
  }
  static float hsum(Reg v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
  }
  // Four accumulators reduced together: lanes [0, 1, 2, 3] of the result are hsum(a), hsum(b), hsum(c),
  // hsum(d), each by hsum's tree (the same additions of the same operands in the same order, so the same
  // bits) on two accumulators per instruction: 14 instructions for the four against 24 and four stores.
  // Zen 3, the 4-row panels' sums (hsum_mem): one thread in L2, bf16 64x512 at 10 / 12 / 16 / 32 tokens
  // 0.98 / 0.98 / 0.98 / 0.97x the time (16x2048 at 12: 0.99x); two threads from DRAM, 2048x512 and
  // 512x2048 at 10 / 16 tokens 0.96-0.98x; 1-2 tokens within the noise (0.96-1.02x).
  static __m128 hsum4(Reg a, Reg b, Reg c, Reg d) {
    // Halves: [lo(a) + hi(a), lo(b) + hi(b)], [lo(c) + hi(c), lo(d) + hi(d)].
    const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    // Pairs 0 + 2 and 1 + 3: [a02, c02, a13, c13 | b02, d02, b13, d13].
    const __m256 p = _mm256_add_ps(_mm256_unpacklo_ps(ab, cd), _mm256_unpackhi_ps(ab, cd));
    // The last pair: a02 + a13 in lane 0, c in 1, b in 4, d in 5.
    const __m256 f = _mm256_add_ps(p, _mm256_shuffle_ps(p, p, _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
  }
  // Sums of R rows for one token to y[r * stride]: four at a time where R allows.
  template <int R, class Get>
  static void hsum_rows(Get&& get, float* y, int64_t stride) {
    int r = 0;
    for (; r + 4 <= R; r += 4) {
      const __m128 s = hsum4(get(r), get(r + 1), get(r + 2), get(r + 3));
      if (stride == 1) {
        _mm_storeu_ps(y + r, s);
      } else {
        alignas(16) float v[4];
        _mm_store_ps(v, s);
        for (int i = 0; i < 4; ++i) y[(r + i) * stride] = v[i];
      }
    }
    for (; r < R; ++r) y[r * stride] = hsum(get(r));
  }
  template <int R, int T>
  static void hsum_acc_strided(const Reg (&acc)[R][T], float* y, int64_t ldy, int64_t stride) {
    for (int t = 0; t < T; ++t) hsum_rows<R>([&](int r) { return acc[r][t]; }, y + t * ldy, stride);
  }
  template <int R, int T>
  static void hsum_acc(const Reg (&acc)[R][T], float* y, int64_t ldy) { hsum_acc_strided<R, T>(acc, y, ldy, 1); }
  template <int R>
  static void hsum_mem(const float* acc_mem, int64_t M, float* y, int64_t ldy) {
    for (int64_t t = 0; t < M; ++t)
      hsum_rows<R>([&](int r) { return load(acc_mem + (t * R + r) * kLanes); }, y + t * ldy, 1);
  }

  static Reg bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static Reg load_bf16(const uint16_t* p) { return bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static Reg load_bf16_tail(const uint16_t* p, int n) {
    alignas(16) uint16_t buf[kLanes] = {};
    std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(uint16_t));
    return bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
  }

  // fp8 e4m3 -> fp32: the AVX-512 path's three exact decodings (linear_avx512.cpp), chosen per row and
  // 128-column block (RowCursor::block). kFastPath (normal codes only, |scale| < 2^7, a whole block): the
  // sign-extended byte << 20, masked, is fp8 * 2^-120 as fp32, and one multiply by scale * 2^120 gives
  // fp8 * scale rounded once; 4 instructions per 8 weights. kSubnormalPath (a zero or subnormal code, a
  // larger scale or a partial block): fp16 bits from the 7 magnitude bits, vcvtph2ps (F16C), one multiply
  // by scale * 2^8; 6 instructions. kExactPath (NaN codes, or a scale of 2^100 or more): the fp16 route with
  // the NaN codes masked in. One thread, fp8 2048x7168 from DRAM on a Zen 4 core, every block on the fp16
  // route -> the fast path: 1 / 2 / 3 / 5 / 8 tokens 1345 / 1540 / 1695 / 3120-3355 / 3780-4240 -> 1004 /
  // 1222 / 1400 / 2830-2950 / 3545 us; 4 tokens, as 3 runs, kept the fp16 route, and as 2 runs take the
  // fast one (kTwoFp8Runs in linear_simd.h).
  // One register per row (at 3-4 tokens the runs' accumulators and their scales fill the 16; two, as on
  // AVX-512, measured the same at 1-3 tokens). Rows decoded together take the slowest of their
  // paths, so a row on the fast path may be decoded on another: its scale * 2^8 is then s * 2^-112, the
  // same bits (|scale| < 2^7 on the fast path, so s is normal and the product is rounded once).
  struct Fp8Scale {
    Reg s;  // kFastPath: scale * 2^120; the other two: scale * 2^8, or scale when big
    int path;
    bool big;
  };
  static Reg fp16_route_scale(const Fp8Scale& s) {
    return s.path == simd::kFastPath ? _mm256_mul_ps(s.s, _mm256_set1_ps(0x1p-112f)) : s.s;
  }
  // The registers of a block's scale for its decoding `path` (RowCursor::block in row_cursor.h).
  static Fp8Scale fp8_scale(float s, int path, bool big) {
    return {_mm256_set1_ps(path == simd::kFastPath ? s * 0x1p120f : big ? s : s * 0x1p8f), path, big};
  }
  // The two scans of a block's codes, for views without WeightView::fp8_codes.
  static bool only_normal_codes(const uint8_t* block) {  // 128 codes
    // 2 * code + 2 (mod 256) is at most 16 exactly for the magnitudes 0x7f (NaN), 0 and 1..7 (subnormal).
    const __m256i two = _mm256_set1_epi8(2), sixteen = _mm256_set1_epi8(16);
    __m256i t = _mm256_set1_epi8(-1);
    for (int i = 0; i < 128; i += 32) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i));
      t = _mm256_min_epu8(t, _mm256_add_epi8(_mm256_add_epi8(b, b), two));
    }
    return _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(t, sixteen), sixteen)) == 0;
  }
  static bool has_nan_code(const uint8_t* block, int n) {
    const __m256i low7 = _mm256_set1_epi8(0x7f);
    int nan = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i));
      nan |= _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_and_si256(b, low7), low7));
    }
    for (; i < n; ++i) nan |= (block[i] & 0x7f) == 0x7f;
    return nan != 0;
  }
  static Reg fp8_scaled_down(__m128i bytes) {  // 8 bytes in the low half
    const __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7);
    return _mm256_cvtph_ps(_mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0xbf80))));
  }
  static Reg fp8_exact(__m128i bytes, const Fp8Scale& s) {
    Reg f = fp8_scaled_down(bytes);
    f = s.big ? _mm256_mul_ps(_mm256_mul_ps(f, _mm256_set1_ps(0x1p8f)), s.s) : _mm256_mul_ps(f, fp16_route_scale(s));
    const __m256i v = _mm256_cvtepi8_epi32(bytes);
    const __m256i nan = _mm256_cmpeq_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7f)), _mm256_set1_epi32(0x7f));
    return _mm256_blendv_ps(f, _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()), _mm256_castsi256_ps(nan));
  }
  template <int P>
  static Reg load_fp8(const uint8_t* p, const Fp8Scale& s) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    if constexpr (P == simd::kFastPath) {
      const __m256i d = _mm256_slli_epi32(_mm256_cvtepi8_epi32(bytes), 20);
      const __m256i fp8_scaled = _mm256_and_si256(d, _mm256_set1_epi32(static_cast<int>(0x87f00000u)));
      return _mm256_mul_ps(_mm256_castsi256_ps(fp8_scaled), s.s);
    } else if constexpr (P == simd::kSubnormalPath) {
      return _mm256_mul_ps(fp8_scaled_down(bytes), fp16_route_scale(s));
    } else {
      return fp8_exact(bytes, s);
    }
  }
  static Reg load_fp8_tail(const uint8_t* p, int n, const Fp8Scale& s) {
    alignas(16) uint8_t buf[16] = {};
    std::memcpy(buf, p, static_cast<size_t>(n));
    return fp8_exact(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)), s);
  }
};

}  // namespace
}  // namespace moe

#include "kernels/linear_simd.h"

namespace moe::detail {

void linear_avx2(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  simd::linear_any<Avx2<false>>(x, M, ldx, w, n0, n1, y, ldy);
}

void linear_avx2_prefetch_l1(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1,
                             float* y, int64_t ldy) {
  simd::linear_any<Avx2<true>>(x, M, ldx, w, n0, n1, y, ldy);
}

}  // namespace moe::detail
