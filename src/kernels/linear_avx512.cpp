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
  static __mmask16 tail_mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }

  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_tail(const float* p, int n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static void prefetch_l2(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1); }
  // The fixed 16-lane tree (avx512_hsum.h) of acc[r][t] into y[t * ldy + r], and of M tokens'
  // accumulators parked as [t][r][lanes]: up to 16 reduced together, each sum bitwise hsum16's (one
  // thread, bf16 2048x512 at 8 tokens: 94 -> 86 us).
  template <int R, int T>
  static void hsum_acc(const Reg (&acc)[R][T], float* y, int64_t ldy) { detail::hsum16_acc<R, T>(acc, y, ldy); }
  template <int R>
  static void hsum_mem(const float* acc_mem, int64_t M, float* y, int64_t ldy) {
    detail::hsum16_mem<R>(acc_mem, M, y, ldy);
  }

  // bf16 -> fp32 is exact: the 16 bits become the top half.
  static Reg bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static Reg load_bf16(const uint16_t* p) { return bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Reg load_bf16_tail(const uint16_t* p, int n) { return bf16(_mm256_maskz_loadu_epi16(tail_mask(n), p)); }

  // fp8 e4m3 -> fp32 through fp16: the 7 magnitude bits placed at fp16 bits 7..13 (sign at 15) make an
  // fp16 equal to fp8 * 2^-8 exactly, subnormals included, and vcvtph2ps widens it exactly; one multiply
  // by scale * 2^8 then gives fp8 * scale rounded once, as weight_at() does. (Placing the bits straight
  // into an fp32 would make fp8 subnormals fp32 subnormals, and denormal operands make vmulps ~2x slower
  // here.) Two rare cases take an exact slower path, decided once per row and 128-column block: NaN codes
  // (S.1111.111) in the block, and scales so large that scale * 2^8 could overflow.
  struct Fp8Scale {
    Reg s;
    bool slow;
    bool big;
  };
  static Fp8Scale fp8_scale(float s, const uint8_t* block, int n) {
    const __m512i low7 = _mm512_set1_epi8(0x7f);
    __mmask64 nan = 0;
    for (int i = 0; i < n; i += 64) {
      const __mmask64 m = n - i >= 64 ? ~__mmask64{0} : (__mmask64{1} << (n - i)) - 1;
      nan |= _mm512_cmpeq_epi8_mask(_mm512_and_si512(_mm512_maskz_loadu_epi8(m, block + i), low7), low7);
    }
    const bool big = !(s < 0x1p100f && s > -0x1p100f);
    return {_mm512_set1_ps(big ? s : s * 0x1p8f), big || nan != 0, big};
  }
  // fp8 * 2^-8 as fp32: sign-extended words << 7 put the sign on bit 15 and a copy on bit 14, cleared.
  static Reg fp8_scaled_down(__m128i bytes) {
    const __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
    return _mm512_cvtph_ps(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0xbf80))));
  }
  static Reg fp8_fast(__m128i bytes, const Fp8Scale& s) { return _mm512_mul_ps(fp8_scaled_down(bytes), s.s); }
  static Reg fp8_exact(__m128i bytes, const Fp8Scale& s) {
    Reg f = fp8_scaled_down(bytes);
    f = s.big ? _mm512_mul_ps(_mm512_mul_ps(f, _mm512_set1_ps(0x1p8f)), s.s) : _mm512_mul_ps(f, s.s);
    const __m128i low7 = _mm_set1_epi8(0x7f);
    const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(bytes, low7), low7);
    return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN()));
  }
  static Reg load_fp8_fast(const uint8_t* p, const Fp8Scale& s) {
    return fp8_fast(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), s);
  }
  static Reg load_fp8_exact(const uint8_t* p, const Fp8Scale& s) {
    return fp8_exact(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), s);
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
