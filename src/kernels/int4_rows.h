// The packed rows of an int4 matrix as the int4 kernels walk them (internal to moe_kernels; included by
// linear_int4_avx512.cpp and linear_int4_avx2.cpp). Those files are compiled with different target flags, so
// everything here has internal linkage: no copy built for one ISA is linked into the other.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/weight.h"

namespace moe::detail {
namespace {

// An int4 WeightView's arrays, walked in blocks of block_words words (block_words * 8 columns) per row.
struct Int4Matrix {
  const uint32_t* words = nullptr;
  const uint16_t* scales = nullptr;
  int64_t rows = 0, words_per_row = 0, scales_per_row = 0, blocks = 0, group = 0, block_words = 0;
  int group_shift = 0;  // log2(group): group is a power of two

  // Byte offset in a row's scales of the scale of block b's first column.
  int64_t scale_offset(int64_t b) const { return ((b * block_words * 8) >> group_shift) * 2; }
  // Where the arrays end: no prefetch goes past them.
  const char* words_end() const { return reinterpret_cast<const char*>(words + rows * words_per_row); }
  const char* scales_end() const { return reinterpret_cast<const char*>(scales + rows * scales_per_row); }

  Int4Matrix(const WeightView& w, int64_t block_words_)
      : words(static_cast<const uint32_t*>(w.data)),
        scales(w.group_scale),
        rows(w.rows),
        words_per_row(w.cols / 8),
        scales_per_row(w.cols / w.group_size),
        blocks((w.cols / 8 + block_words_ - 1) / block_words_),
        group(w.group_size),
        block_words(block_words_),
        group_shift(__builtin_ctzll(static_cast<unsigned long long>(w.group_size))) {}
};

// R rows n + r * run, r < R. run == 1: R adjacent rows. run > 1: one row of each of R runs of `run`
// consecutive rows, which a caller walks with n, n + 1, ..., so that each run is read as one long stream,
// as the float kernels' run_kernel (linear_simd.h) reads them.
struct RowRuns {
  int64_t n = 0, run = 1;
};

// Rows [n, n1) as R runs of (n1 - n) / R consecutive rows: pass(at) for at = {n + i, run}, i < run, each
// call taking one row of every run, so that each run is read front to back as one stream. Returns the
// first row left over (fewer than R of them).
template <int R, class Pass>
[[gnu::always_inline]] inline int64_t walk_runs(int64_t n, int64_t n1, Pass&& pass) {
  const int64_t run = (n1 - n) / R;
  for (int64_t i = 0; i < run; ++i) pass(RowRuns{n + i, run});
  return n + R * run;
}

// With runs, each row's words are streamed this far ahead of its reads (on into the run's next row), and its
// scales as far ahead in their own array. The kernels keep their row and prefetch pointers in local arrays:
// the same pointers in a struct (or a streaming helper object) measured 5-15% slower.
inline constexpr int64_t kInt4RunLeadBytes = 2048;

// Fills a micro-kernel's local arrays for rows `at`: each row's words and scales, and where each is streamed
// from kInt4RunLeadBytes ahead (with runs). Returns where the next R rows start (adjacent rows stream those).
template <int R>
[[gnu::always_inline]] inline const char* int4_row_pointers(const Int4Matrix& w, RowRuns at, const uint32_t* (&rows)[R],
                                                            const uint16_t* (&srows)[R], const char* (&ahead)[R],
                                                            const char* (&sahead)[R]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    rows[r] = w.words + (at.n + r * at.run) * w.words_per_row;
    srows[r] = w.scales + (at.n + r * at.run) * w.scales_per_row;
    ahead[r] = reinterpret_cast<const char*>(rows[r]) + kInt4RunLeadBytes;
    sahead[r] = reinterpret_cast<const char*>(srows[r]) + w.scale_offset(kInt4RunLeadBytes / 4 / w.block_words);
  }
  return reinterpret_cast<const char*>(rows[0] + R * w.words_per_row);
}

// Calls f(std::integral_constant<int, tc>) for the runtime tc in [1, P].
template <int P, class F>
inline __attribute__((always_inline)) void with_token_count(int64_t tc, F&& f) {
  if constexpr (P > 1) {
    if (tc < P) return with_token_count<P - 1>(tc, f);
  }
  f(std::integral_constant<int, P>{});
}

}  // namespace
}  // namespace moe::detail
