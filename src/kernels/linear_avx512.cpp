// AVX-512 (F/BW/VL/DQ + FMA) path of the linear kernel: 16 fp32 lanes. Compiled with its own target flags
// (src/kernels/CMakeLists.txt) and only called after a run-time CPU check (linear.cpp).
#include <immintrin.h>

#include <limits>

#include "kernels/avx512_hsum.h"
#include "kernels/linear_isa.h"

namespace moe {
namespace {

struct Avx512 {
  using Reg = __m512;
  static constexpr int kLanes = 16;
  // Register blocking: tokens per micro-block, and whether 6-row x 4-token blocks fit (32 registers).
  static constexpr int kTokens = 4;
  static constexpr bool kWideBlocks = true;
  // Panel path (more than 4 tokens): rows sharing one converted panel, and tokens per micro-block there.
  static constexpr int kPanelRows = 8;
  static constexpr int kPanelTokens = 3;
  // How far ahead of its reads each run of rows is prefetched (run_kernel in linear_simd.h).
  static constexpr int64_t kRunLeadBytes = 2048;
  // fp8 panels are decoded in a pass of their own (row_block_panel in linear_panels.h): decoded by their
  // first micro-block they measured 5-8% slower on one thread and the same on two (Zen 5, fp8 2048x7168
  // in L3 at 10-32 tokens).
  static constexpr bool kFp8FillPanels = false;
  // Not the AVX2 path's table-decided blocks (dot_rows, micro_panel): unmeasured on an AVX-512 machine.
  static constexpr bool kFp8TableBlocks = false;
  // The panels' prefetch checked at every k step (the AVX2 path's per-8 issue is unmeasured here).
  static constexpr int kPanelPrefetchSteps = 1;
  static __mmask16 tail_mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }

  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_tail(const float* p, int n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  // always_inline, like every function or lambda that only prefetches (linear_simd.h, dot_rows): GCC counts
  // a prefetch as free of side effects, deems such a function pure and deletes its calls before inlining.
  __attribute__((always_inline)) static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  // The fixed 16-lane tree (avx512_hsum.h) of acc[r][t] into y[t * ldy + r], and of M tokens'
  // accumulators parked as [t][r][lanes]: up to 16 reduced together, each sum bitwise hsum16's (one
  // thread, bf16 2048x512 at 8 tokens: 94 -> 86 us); hsum_acc_strided for the rows of runs.
  template <int R, int T>
  static void hsum_acc(const Reg (&acc)[R][T], float* y, int64_t ldy) { detail::hsum16_acc<R, T>(acc, y, ldy); }
  template <int R, int T>
  static void hsum_acc_strided(const Reg (&acc)[R][T], float* y, int64_t ldy, int64_t stride) {
    detail::hsum16_acc_strided<R, T>(acc, y, ldy, stride);
  }
  template <int R>
  static void hsum_mem(const float* acc_mem, int64_t M, float* y, int64_t ldy) {
    detail::hsum16_mem<R>(acc_mem, M, y, ldy);
  }

  // bf16 -> fp32 is exact: the 16 bits become the top half.
  static Reg bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static Reg load_bf16(const uint16_t* p) { return bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Reg load_bf16_tail(const uint16_t* p, int n) { return bf16(_mm256_maskz_loadu_epi16(tail_mask(n), p)); }

  // fp8 e4m3 -> fp32, three exact decodings, one chosen per row and 128-column block (RowCursor::block):
  // - kFastPath: the sign-extended byte shifted left by 20 and masked puts the sign at bit 31 and the 4
  //   exponent and 3 mantissa bits at bits 23..26 and 20..22: an fp32 equal to fp8 * 2^-120 exactly for
  //   every normal code. One multiply by scale * 2^120 then gives fp8 * scale rounded once, as weight_at()
  //   does. Four instructions for 16 weights.
  // - kSubnormalPath, for blocks holding a zero or subnormal code (the fast path would make subnormals fp32
  //   subnormals, and a vector holding one makes vmulps up to 2x slower here; a DeepSeek-like checkpoint has
  //   either in under 1% of its blocks), a scale of 2^7 or more (scale * 2^120 could overflow) or fewer than
  //   128 columns: the 7 magnitude bits at fp16 bits 7..13 (sign at 15) make an fp16 equal to fp8 * 2^-8
  //   exactly, subnormals included; vcvtph2ps widens it exactly and one multiply by scale * 2^8 follows.
  //   Five instructions, vcvtph2ps at one per cycle.
  // - kExactPath, for NaN codes (S.1111.111) in the block or a scale of 2^100 or more: the fp16 route with
  //   the NaN codes masked in and, for large scales, the 2^8 multiplied back before the scale.
  // fp8 2048x7168, every block on the fp16 route -> the fast path: in L3, one thread, 1 / 2 / 3 / 4 tokens
  // 639-652 / 715-748 / 760-777 / 836-840 -> 563-569 / 585-592 / 659-711 / 783-846 us (the per-block check
  // costs 80-90 us of the one-token time, which a view's fp8_codes save: docs/kernel-notes.md, "fp8 blocks
  // classified once"); from DRAM, two threads, 2 / 3 tokens at 0.76-0.84 / 0.75-0.80 of
  // the read bandwidth -> 0.92-0.98 / 0.86-0.92. Where the rows are decoded once per panel (from 9 tokens
  // on; from 5 on rows of at most 1 KiB) the FMAs bound the time, and the gain is small.
  struct Fp8Scale {
    Reg s;       // kFastPath: scale * 2^120
    Reg s_fp16;  // the other two: scale * 2^8, or scale when big
    int path;
    bool big;
  };
  // The registers of a block's scale for its decoding `path` (RowCursor::block in row_cursor.h).
  static Fp8Scale fp8_scale(float s, int path, bool big) {
    return {_mm512_set1_ps(path == simd::kFastPath ? s * 0x1p120f : 0.0f), _mm512_set1_ps(big ? s : s * 0x1p8f),
            path, big};
  }
  // The two scans of a block's codes, for views without WeightView::fp8_codes.
  static bool only_normal_codes(const uint8_t* block) {  // 128 codes
    // 2 * code + 2 (mod 256) is at most 16 exactly for the magnitudes 0x7f (NaN), 0 and 1..7 (subnormal).
    const __m512i two = _mm512_set1_epi8(2), b0 = _mm512_loadu_si512(block), b1 = _mm512_loadu_si512(block + 64);
    const __m512i t = _mm512_min_epu8(_mm512_add_epi8(_mm512_add_epi8(b0, b0), two),
                                      _mm512_add_epi8(_mm512_add_epi8(b1, b1), two));
    return _mm512_cmple_epu8_mask(t, _mm512_set1_epi8(16)) == 0;
  }
  static bool has_nan_code(const uint8_t* block, int n) {
    const __m512i low7 = _mm512_set1_epi8(0x7f);
    __mmask64 nan = 0;
    for (int i = 0; i < n; i += 64) {
      const __mmask64 m = n - i >= 64 ? ~__mmask64{0} : (__mmask64{1} << (n - i)) - 1;
      nan |= _mm512_cmpeq_epi8_mask(_mm512_and_si512(_mm512_maskz_loadu_epi8(m, block + i), low7), low7);
    }
    return nan != 0;
  }
  // fp8 * 2^-8 as fp32: sign-extended words << 7 put the sign on bit 15 and a copy on bit 14, cleared.
  static Reg fp8_scaled_down(__m128i bytes) {
    const __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0xbf80))));
  }
  static Reg fp8_exact(__m128i bytes, const Fp8Scale& s) {
    Reg f = fp8_scaled_down(bytes);
    f = s.big ? _mm512_mul_ps(_mm512_mul_ps(f, _mm512_set1_ps(0x1p8f)), s.s_fp16) : _mm512_mul_ps(f, s.s_fp16);
    const __m128i low7 = _mm_set1_epi8(0x7f);
    const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(bytes, low7), low7);
    return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  }
  template <int P>
  static Reg load_fp8(const uint8_t* p, const Fp8Scale& s) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (P == simd::kFastPath) {
      const __m512i d = _mm512_slli_epi32(_mm512_cvtepi8_epi32(bytes), 20);
      const __m512i fp8_scaled = _mm512_and_si512(d, _mm512_set1_epi32(static_cast<int>(0x87f00000u)));
      return _mm512_mul_ps(_mm512_castsi512_ps(fp8_scaled), s.s);
    } else if constexpr (P == simd::kSubnormalPath) {
      return _mm512_mul_ps(fp8_scaled_down(bytes), s.s_fp16);
    } else {
      return fp8_exact(bytes, s);
    }
  }
  static Reg load_fp8_tail(const uint8_t* p, int n, const Fp8Scale& s) {
    return fp8_exact(_mm_maskz_loadu_epi8(tail_mask(n), p), s);
  }
};

}  // namespace
}  // namespace moe

#include "kernels/linear_simd.h"

namespace moe::detail {

void linear_avx512(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
  simd::linear_any<Avx512>(x, M, ldx, w, n0, n1, y, ldy);
}

}  // namespace moe::detail
