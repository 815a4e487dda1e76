// Reading one weight row as fp32 vectors, for the SIMD kernels of linear_simd.h (internal to moe_kernels):
// a cursor per dtype (f32, bf16, fp8 with its per-block decoding), templated on the ISA's vector traits V.
// Like linear_simd.h, it is included by each ISA's .cpp after its traits, so every instantiation lives in
// that ISA's translation unit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/linear_isa.h"
#include "kernels/weight.h"

namespace moe::simd {

inline constexpr int64_t kScaleBlock = 128;  // fp8 block-scale granularity (columns and rows)

// Reads one weight row as fp32 vectors: set() picks the row, block(kb) is called before the columns of
// 128-column block kb are read (fp8: its scale), load<P>(k) / load_tail(k, n) read kLanes / n < kLanes
// columns from k (the tail zero-filled). path() says which decoding this block needs (linear_isa.h), and
// load<P> with any P at or above it reads the same values: fp8 has three (see the ISA traits).
template <class V, DType D>
struct RowCursor;

// f(std::integral_constant<int, P>{}) for the decoding P = path, so that a loop inside f is compiled once
// per decoding and the choice is made outside it.
template <class F>
void with_path(int path, F&& f) {
  if (path == kFastPath) f(std::integral_constant<int, kFastPath>{});
  else if (path == kSubnormalPath) f(std::integral_constant<int, kSubnormalPath>{});
  else f(std::integral_constant<int, kExactPath>{});
}

template <class V>
struct RowCursor<V, DType::kF32> {
  const float* p = nullptr;
  void set(const WeightView& w, int64_t r) { p = static_cast<const float*>(w.data) + r * w.cols; }
  void block(int64_t) {}
  static constexpr int path() { return kFastPath; }
  template <int P>
  typename V::Reg load(int64_t k) const { return V::load(p + k); }
  typename V::Reg load_tail(int64_t k, int n) const { return V::load_tail(p + k, n); }
};

template <class V>
struct RowCursor<V, DType::kBF16> {
  const uint16_t* p = nullptr;
  void set(const WeightView& w, int64_t r) { p = static_cast<const uint16_t*>(w.data) + r * w.cols; }
  void block(int64_t) {}
  static constexpr int path() { return kFastPath; }
  template <int P>
  typename V::Reg load(int64_t k) const { return V::load_bf16(p + k); }
  typename V::Reg load_tail(int64_t k, int n) const { return V::load_bf16_tail(p + k, n); }
};

template <class V>
struct RowCursor<V, DType::kF8E4M3> {
  const uint8_t* p = nullptr;
  const float* scales = nullptr;  // this row's 128-row block of scale_inv
  const uint8_t* codes = nullptr;  // this row's Fp8Codes per block (weight.h), or null: scan each block
  typename V::Fp8Scale scale{};
  void set(const WeightView& w, int64_t r) {
    const int64_t col_blocks = (w.cols + kScaleBlock - 1) / kScaleBlock;
    p = static_cast<const uint8_t*>(w.data) + r * w.cols;
    row_end = p + w.cols;
    scales = w.scale_inv + (r / kScaleBlock) * col_blocks;
    codes = w.fp8_codes != nullptr ? w.fp8_codes + r * col_blocks : nullptr;
    whole_blocks = w.cols / kScaleBlock;
  }
  const uint8_t* row_end = nullptr;
  int64_t whole_blocks = 0;  // blocks of a full 128 columns
  // The decoding the block needs, from its codes (the view's table, or V's scan of the bytes) and its
  // scale: kFastPath for normal codes only, |scale| < 2^7 and a whole block; kExactPath for a NaN code or
  // |scale| >= 2^100; kSubnormalPath otherwise (see the ISA traits).
  void block(int64_t kb) {
    // The common case decided from the table alone (normal codes, a whole block, a small scale: the fast
    // decoding), its scale registers made for that path only. The general decision below cost 8-17% of a call at 1-3 tokens (one thread, fp8 2048x7168 in
    // L3, Zen 5, AVX2 kernels at 1 / 2 / 3 tokens 978 / 1217 / 1396 -> 810 / 1041 / 1210 us, AVX-512 548 /
    // 665 / 769 -> 517 / 656 / 727). The scale is loaded only once the table has said yes: loaded first,
    // one build ran a third slower in half of its runs (in L1, 4 fp8 rows x 7168 columns), this order in none.
    if (codes != nullptr && codes[kb] == kFp8Normal && kb < whole_blocks) {
      const float s = scales[kb];
      if (s < 0x1p7f && s > -0x1p7f) {
        scale = V::fp8_scale(s, kFastPath, false);
        return;
      }
    }
    const uint8_t* b = p + kb * kScaleBlock;
    const int n = static_cast<int>(std::min<int64_t>(kScaleBlock, row_end - b));
    const float s = scales[kb];
    const bool big = !(s < 0x1p100f && s > -0x1p100f);
    const bool fast = s < 0x1p7f && s > -0x1p7f && n == kScaleBlock &&
                      (codes != nullptr ? codes[kb] == kFp8Normal : V::only_normal_codes(b));
    int path = kFastPath;
    if (!fast) {
      const bool nan = codes != nullptr ? codes[kb] == kFp8NaN : V::has_nan_code(b, n);
      path = big || nan ? kExactPath : kSubnormalPath;
    }
    scale = V::fp8_scale(s, path, big);
  }
  // block(kb) for a block that the view's table alone decides: normal codes, a whole block, a scale below
  // 2^7, so kFastPath. Returns whether it was such a block, its scale registers then set for that path
  // (else block() must follow). No branch on the block: the caller branches once for all the rows it reads
  // together.
  bool table_block(int64_t kb) {
    const float s = scales[kb];
    scale = V::fp8_scale(s, kFastPath, false);
    if (codes == nullptr) return false;
    return (codes[kb] == kFp8Normal) & (kb < whole_blocks) & (s < 0x1p7f) & (s > -0x1p7f);
  }
  int path() const { return scale.path; }
  template <int P>
  typename V::Reg load(int64_t k) const { return V::template load_fp8<P>(p + k, scale); }
  typename V::Reg load_tail(int64_t k, int n) const { return V::load_fp8_tail(p + k, n, scale); }
};

}  // namespace moe::simd
