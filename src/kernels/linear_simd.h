// The register-blocked linear kernel shared by the SIMD paths (internal to moe_kernels).
//
// Each ISA's .cpp defines its vector traits V (Reg, kLanes, zero/load/fma, the lane reductions hsum_acc,
// hsum_acc_strided (rows `stride` apart, for runs) and hsum_mem, and the weight-row loaders) and then
// includes this file, so every instantiation lives in one translation unit compiled with that ISA's target
// flags; everything here is a template on V, so nothing is shared across ISAs (no ODR clash).
//
// Numerics, and why the determinism contract holds: y[m, n] is accumulated in one vector register whose
// lane j sums x[m, k] * W[n, k] for k = j (mod kLanes), k ascending, fp32 FMA; the last partial vector is
// read with zero-filled lanes; the lanes are then reduced in a fixed tree (V::hsum_acc; AVX-512 packs
// several accumulators' partial sums into one register, each sum's bits unchanged). Blocking over rows
// and tokens only changes how many such independent accumulators are live, never the sequence applied to
// one of them, so the bits depend on (x row, W row, ISA) alone. fp8 weights become fp32 exactly as
// weight_at() defines them (fp8 value * block scale, rounded once), element by element.
//
// Loop structure (linear_rows): tokens in macro-blocks of up to kMaxMacroTokens (their x rows stay in
// L2). Up to kRunTokens tokens (3 to 8, by ISA and dtype), and 5-6 where kRunSix: 3-4 runs of consecutive
// rows, one row of each at a time, every run read as one long stream (run_kernel, run_rows). More: row
// blocks (3 to 8 rows, by token count, row length and dtype), then one register-blocked pass for 4 tokens
// (micro_kernel), one for fp8 at 5-6 (long_rows), two for 7-8 (wide_rows, or short_rows; fp8 rows longer
// than 1 KiB: one, three_rows), or, for more, fp32 panels of the rows shared by micro-blocks of 3-4 tokens
// (row_block_panel in linear_panels.h; AVX-512 bf16 and f32 rows of at most 1 KiB: passes of wide_rows).
// Each weight row is streamed from memory once per macro-block.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/linear_isa.h"
#include "kernels/linear_panels.h"
#include "kernels/row_cursor.h"
#include "kernels/weight.h"

namespace moe::simd {

// The dot products of R rows (cursors set) with tokens x[0 .. T) into acc (zeroed first), block of 128
// columns by block; before each block's reads, prefetch(kb, kend) streams weights in under the FMAs.
// The prefetch lambdas are always_inline: GCC counts a prefetch as free of side effects, deems a lambda
// that only prefetches pure and deletes its calls before it would inline them (GCC 12 -O3 dropped every
// prefetch of these kernels that way, and the int4 kernels ran up to 3x slower until theirs were inline).
template <class V, DType D, int R, int T, class Prefetch>
inline void dot_rows(const float* x, int64_t ldx, int64_t K, RowCursor<V, D> (&rows)[R], typename V::Reg (&acc)[R][T],
                     Prefetch&& prefetch) {
  using Reg = typename V::Reg;
  constexpr int L = V::kLanes;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = V::zero();
  // One vector of columns from k in decoding P (chosen once per block, outside the loops over k: a per-load
  // branch costs more than the decoding itself).
  const auto step = [&](int64_t k, auto path) __attribute__((always_inline)) {
    Reg wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = rows[r].template load<decltype(path)::value>(k);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const Reg xv = V::load(x + t * ldx + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = V::fma(xv, wv[r], acc[r][t]);
    }
  };
  for (int64_t kb = 0; kb < K; kb += kScaleBlock) {
    // fp8 where V::kFp8TableBlocks: a block that the view's table decides for all R rows (normal codes, a
    // whole block, a small scale: RowCursor::table_block) skips the general choice below: each row's
    // branches, the widest of the paths and the switch to that path's loop. Zen 3 (AVX2), two threads from
    // DRAM, fp8 2048x7168 at 1 / 2 / 3 / 4 tokens 0.87-0.92 / 0.89-0.91 / 0.85-0.87 / 0.89x the time,
    // 7168x2048 at 1 / 4 tokens 0.88 / 0.89x; DeepSeek-V3's layer (64 experts) at 1 / 2 / 4 tokens 0.88-0.90
    // / 0.81-0.85 / 0.88-0.90x (docs/kernel-notes.md, "fp8 blocks by the table alone").
    if constexpr (D == DType::kF8E4M3 && V::kFp8TableBlocks) {
      bool table = true;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) table &= rows[r].table_block(kb / kScaleBlock);
      if (table) {
        prefetch(kb, kb + kScaleBlock);
        for (int64_t k = kb; k < kb + kScaleBlock; k += L) step(k, std::integral_constant<int, kFastPath>{});
        continue;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) rows[r].block(kb / kScaleBlock);
    const int64_t kend = std::min(K, kb + kScaleBlock);
    prefetch(kb, kend);
    int64_t k = kb;
    int path = kFastPath;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) path = std::max(path, rows[r].path());
    with_path(path, [&](auto p) {
      for (; k + L <= kend; k += L) step(k, p);
    });
    if (k < kend) {
      const int rem = static_cast<int>(kend - k);
      Reg wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = rows[r].load_tail(k, rem);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const Reg xv = V::load_tail(x + t * ldx + k, rem);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t] = V::fma(xv, wv[r], acc[r][t]);
      }
    }
  }
}

// y[t * ldy + r] for t < T, r < R: rows n .. n+R of w against tokens x[0 .. T). Streamed in under the
// FMAs: with lead_cols == 0, the R rows starting lead_rows (>= R) further on, at the rate these are
// consumed; with lead_cols > 0, these R rows lead_cols columns ahead of the reads, running on into the
// next R rows' columns past the row end.
template <class V, DType D, int R, int T>
void micro_kernel(const float* x, int64_t ldx, const WeightView& w, int64_t n, float* y, int64_t ldy,
                  int64_t lead_rows = R, int64_t lead_cols = 0) {
  constexpr int64_t es = static_cast<int64_t>(dtype_size(D));
  constexpr int64_t kBlockColBytes = R * es;
  const int64_t K = w.cols;
  const char* here = static_cast<const char*>(w.data) + n * K * es;
  const char* next = here + lead_rows * K * es;
  const char* end = static_cast<const char*>(w.data) + w.rows * K * es;
  RowCursor<V, D> rows[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) rows[r].set(w, n + r);
  typename V::Reg acc[R][T];
  dot_rows<V, D, R, T>(x, ldx, K, rows, acc, [&](int64_t kb, int64_t kend) __attribute__((always_inline)) {
    // The part of the row block lead_rows further on that matches this block's columns (streamed in below
    // at the rate this one is consumed).
    const char* next_from = next + kb * kBlockColBytes;
    const char* next_to = std::min(next + kend * kBlockColBytes, end);
    if (lead_cols > 0) {
      // Column kb + lead_cols and on, one line at a time; past K, the columns of the next R rows.
      int64_t blk = (kb + lead_cols) / K, col = (kb + lead_cols) % K;
      for (int64_t c = kb; c < kend; c += 64 / es) {
        const char* p = here + (blk * R * K + col) * es;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          if (p + r * K * es < end) V::prefetch(p + r * K * es);
        for (col += 64 / es; col >= K; col -= K) ++blk;
      }
    } else {
      // The hardware prefetchers lose the R short row streams at every row block (a bf16 row of 2048 is
      // one 4 KiB page), so stream the next row block in at the rate this one is consumed (T0 measured best,
      // with NTA; NTA would evict what prefill re-reads).
      for (; next_from < next_to; next_from += 64) V::prefetch(next_from);
    }
  });
  V::template hsum_acc<R, T>(acc, y, ldy);
}

// Up to how many tokens the rows go as runs (run_rows): on AVX-512 3, and 4 for fp8; on AVX2 8, and 4 for
// fp8 (whose panels, decoded once for all tokens, win from 5). One thread, from DRAM, medians of interleaved
// runs against the blocks they replaced: AVX-512 at 3 tokens (6 rows, a column lead and an L2 stream) bf16
// 512x2048 126-136 -> 94 us and f32 230-243 -> 188 in a slow memory mode, 68 -> 71 and 143 -> 147 in a
// fast one, 2048x512 87-98 -> 95; fp8 2048x7168 at 3 / 4 tokens (4 rows) 968 / 1155 -> 908 / 1070 us;
// AVX2 (4 rows in passes of 2 tokens, panels from 5) bf16 512x2048 at 3 / 4 / 5 / 8 tokens 114 / 129 /
// 199 / 259 -> 79 / 105 / 146 / 204 us, f32 189 / 198 / 271 / 324 -> 134 / 141 / 214 / 248 us, fp8 at
// 3 / 4 3120 / 3377 -> 1972 / 2117 us. On AVX-512, bf16 and f32 measured 4-10% slower as runs at 4 tokens,
// and mixed at 5-8 in passes.
template <class V, DType D>
inline constexpr int64_t kRunTokens = D == DType::kF8E4M3 ? 4 : V::kTokens < 4 ? 8 : 3;

// Whether 5-6 tokens go as 4 runs in one pass (20-24 accumulators): AVX-512 bf16 and f32. Against 4
// adjacent rows in one pass, the next rows 16 KiB ahead (rows of at most 1 KiB) or each row 2 KiB ahead
// (longer), from DRAM, medians of six rounds alternating the order, 5 / 6 tokens: bf16 2048x512 one
// thread 115 / 131 -> 89 / 99 us, two 59 / 63 -> 46 / 47; 512x2048 112 / 129 -> 95 / 100, two 55 / 59 ->
// 48 / 54; in L3 the same or 5-10% faster; f32 512x2048 within 1%. 7-8 tokens as runs in passes of 4 measured mixed (up to 13% slower
// in L3), and keep their blocks.
template <class V, DType D>
inline constexpr bool kRunSix = V::kWideBlocks && D != DType::kF8E4M3;

// y[t * ldy + r * run] for t < T, r < R: rows n + r * run of w against tokens x[0 .. T), for the R runs
// of `run` consecutive rows that a caller walks with n, n + 1, ... (run_rows). Each run is read front to
// back as one long stream, prefetched V::kRunLeadBytes ahead of its reads, on into its next row: the access
// pattern of the bandwidth probe, which R adjacent rows are not (their streams end every R rows, and the
// hardware prefetchers start over). One thread, weights from DRAM, 1 / 2 tokens, interleaved with the
// adjacent 2-row blocks each 8 KiB ahead that this replaced: bf16 512x2048 108-138 / 113-121 -> 68-77 /
// 72-76 us (avx512), 2048x512 92-97 / 91-94 -> 73-75 / 70-72 us; 0.84-0.88 of the read bandwidth at one
// token, one and two threads, against 0.53-0.74. A lead of 1 KiB measured up to 10% slower, 4 KiB the same
// or slower on AVX-512, which keeps 2 KiB; the AVX2 path prefetches into L2, 4 KiB ahead (linear_avx2.cpp).
template <class V, DType D, int R, int T>
void run_kernel(const float* x, int64_t ldx, const WeightView& w, int64_t n, int64_t run, float* y, int64_t ldy) {
  constexpr int64_t es = static_cast<int64_t>(dtype_size(D));
  const int64_t K = w.cols;
  const char* end = static_cast<const char*>(w.data) + w.rows * K * es;
  const char* ahead[R];  // run r's read position plus the lead, at column 0
  RowCursor<V, D> rows[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    rows[r].set(w, n + r * run);
    ahead[r] = static_cast<const char*>(w.data) + (n + r * run) * K * es + V::kRunLeadBytes;
  }
  typename V::Reg acc[R][T];
  dot_rows<V, D, R, T>(x, ldx, K, rows, acc, [&](int64_t kb, int64_t kend) __attribute__((always_inline)) {
    for (int64_t c = kb * es; c < kend * es; c += 64)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        if (ahead[r] + c < end) V::prefetch(ahead[r] + c);
  });
  V::template hsum_acc_strided<R, T>(acc, y, ldy, run);
}

// fp8 on AVX2 at 4 tokens: 2 runs, whose 8 accumulators leave room for the fast decoding's registers. As
// 3 runs x 4 tokens the fp16 route was kept, the fast decoding having run 1.25x slower there (one thread,
// fp8 2048x7168 from DRAM on a Zen 4 core, 1960 -> 2480 us); every fp8 block the table or the scan finds
// normal now takes the fast decoding. Zen 3, against 3 runs on the fp16 route, weights with a zero or subnormal code in 1% of
// blocks: two threads from DRAM, 2048x7168 0.86-0.87x the time, 7168x2048 0.86-0.91x; one thread in L2,
// 64x7168, 0.98-1.04x (0.84-0.85x without such blocks). 2 runs on the fp16 route measured 0.90-0.99x, 3
// runs decoded fast 0.86-0.97x, and 2 runs at 3 tokens 0.97-1.04x (docs/kernel-notes.md, "fp8 at 4 tokens
// as 2 runs").
template <class V, DType D>
inline constexpr bool kTwoFp8Runs = D == DType::kF8E4M3 && V::kTokens < 4;

// Rows [n, n1) as runs against M <= kRunTokens tokens (or 5-6, kRunSix), y at column n; returns the first
// row left over (fewer than a run's count). 4 runs, or 3 on AVX2 from 3 tokens, so that 3 x 4 accumulators
// fit its 16 registers (2 runs measured 20-40% slower at 1 token, 6 and 8 slower; kTwoFp8Runs); passes of
// at most 4 tokens (5-6 as 3 + 2-3, or one pass where kRunSix), the later ones re-reading the rows from L1.
template <class V, DType D>
int64_t run_rows(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n, int64_t n1, float* y,
                 int64_t ldy) {
  const auto runs = [&](auto rows) {
    constexpr int R = decltype(rows)::value;
    const int64_t run = (n1 - n) / R;
    for (int64_t i = 0; i < run; ++i)
      for (int64_t t = 0; t < M;) {
        const int64_t left = M - t;
        const int64_t T = left == 5 || left == 6 ? (kRunSix<V, D> ? left : 3) : std::min<int64_t>(4, left);
        const float* xt = x + t * ldx;
        float* yt = y + i + t * ldy;
        switch (T) {
          case 1: run_kernel<V, D, R, 1>(xt, ldx, w, n + i, run, yt, ldy); break;
          case 2: run_kernel<V, D, R, 2>(xt, ldx, w, n + i, run, yt, ldy); break;
          case 3: run_kernel<V, D, R, 3>(xt, ldx, w, n + i, run, yt, ldy); break;
          case 5:
            if constexpr (kRunSix<V, D>) run_kernel<V, D, R, 5>(xt, ldx, w, n + i, run, yt, ldy);
            break;
          case 6:
            if constexpr (kRunSix<V, D>) run_kernel<V, D, R, 6>(xt, ldx, w, n + i, run, yt, ldy);
            break;
          default: run_kernel<V, D, R, 4>(xt, ldx, w, n + i, run, yt, ldy); break;
        }
        t += T;
      }
    return n + R * run;
  };
  if (kTwoFp8Runs<V, D> && M == 4) return runs(std::integral_constant<int, 2>{});
  if (V::kTokens < 4 && M >= 3) return runs(std::integral_constant<int, 3>{});
  return runs(std::integral_constant<int, 4>{});
}

inline constexpr int64_t kRowLeadBytes = 1536;  // per row, 4 tokens (see wide_rows)
inline constexpr int64_t kShortRowLeadBytes = 16 << 10;  // 7-8 tokens on short rows (see short_rows)
inline constexpr int64_t kLongRowLeadBytes = 2048;  // per row, fp8 at 5-8 tokens on long rows (long_rows)
// R rows against M = 4 or 7 to kMaxMacroTokens tokens: register-blocked passes of 4 tokens, the later ones
// re-reading the R rows from L1 (or L2), ending in a pass of 3 and one of 2-3 where whole passes of 4
// would leave 1-2 tokens (9 = 4 + 3 + 2, 10 = 4 + 3 + 3): a pass of 1-2 tokens converts 6 rows for 6-12
// FMAs. Below 9 tokens this beats converting the rows into fp32 panels, whose store and reload the few
// tokens do not repay (one thread, bf16 weights from DRAM, 6 rows: 512x2048 at 5-8 tokens 88-106 us
// against 99-113 us; 2048x512 78-101 us against 109-125 us); on rows of at most 1 KiB (a down projection)
// it does at every count (linear_rows), where the 6 rows stay in L1 under the passes.
//
// With 4 tokens (one pass) the rows are streamed in kRowLeadBytes per row ahead of the reads rather than a
// whole row block ahead: the block's prefetched 24 KiB (6 bf16 rows of 2048) pushed the tokens' 32 KiB of x
// out of the 48 KiB L1 at every block (one thread, bf16 from DRAM: 512x2048 71-75 -> 58-62 us, 2048x512
// 58-61 -> 54-56 us). With two passes it measured 8-15% slower, so more tokens keep the next-block stream
// (3, and 5-6: run_rows).
template <class V, DType D, int R>
void wide_rows(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n, float* y, int64_t ldy) {
  if (M <= 4) return micro_kernel<V, D, R, 4>(x, ldx, w, n, y, ldy, R, kRowLeadBytes / static_cast<int64_t>(dtype_size(D)));
  const int64_t fours = M % 4 == 0 || M % 4 == 3 ? M / 4 : M / 4 - 1;
  int64_t t = 0;
  for (; t < 4 * fours; t += 4) micro_kernel<V, D, R, 4>(x + t * ldx, ldx, w, n, y + t * ldy, ldy);
  for (; t < M; t += 3) {  // 3 + 2 or 3 + 3 left after the fours, or a lone 3
    if (M - t == 2) return micro_kernel<V, D, R, 2>(x + t * ldx, ldx, w, n, y + t * ldy, ldy);
    micro_kernel<V, D, R, 3>(x + t * ldx, ldx, w, n, y + t * ldy, ldy);
  }
}

// 4 rows of at most 1 KiB (a down projection: bf16 K <= 512) against 7 or 8 tokens: two passes of 4 and
// 3-4, each streaming the rows kShortRowLeadBytes ahead. The tokens' x (8 x 2 KiB at most) stays in L1
// beside 16 KiB in flight, where 6 rows in passes of 4 + rest with the next block streamed left the memory
// idle between blocks (one thread, bf16 2048x512 from DRAM, 5 / 6 / 7 / 8 tokens: 76-79 / 82-84 / 89-98 /
// 96-104 -> 58-62 / 65-68 / 76-80 / 85-87 us; 5-6 tokens, one pass here then, now go as runs: kRunSix).
// Not shared with long_rows through a lead_cols argument: passed at run time, its 0 here kept GCC from
// specialising micro_kernel on it (7-8 tokens measured 15% slower).
template <class V, DType D>
void short_rows(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n, float* y, int64_t ldy) {
  const int64_t row_bytes = w.cols * static_cast<int64_t>(dtype_size(D));
  const int64_t lead = std::max<int64_t>(4, (kShortRowLeadBytes / std::max<int64_t>(row_bytes, 1) + 3) / 4 * 4);
  micro_kernel<V, D, 4, 4>(x, ldx, w, n, y, ldy, lead);
  if (M == 7) return micro_kernel<V, D, 4, 3>(x + 4 * ldx, ldx, w, n, y + 4 * ldy, ldy, lead);
  micro_kernel<V, D, 4, 4>(x + 4 * ldx, ldx, w, n, y + 4 * ldy, ldy, lead);
}

// 4 fp8 rows of more than 1 KiB (a gate or up projection) against 5 or 6 tokens in one pass (20-24
// accumulators), each row streamed kLongRowLeadBytes ahead of its reads. Written for bf16 first: two passes
// over 6 rows (wide_rows) converted every weight twice and ran the second, 1-2 token pass at the load
// ports' pace (one thread, bf16 512x2048, 5 / 6 tokens, weights in L3: 74-75 / 82 -> 57-59 / 68-71 us;
// from DRAM: 85-87 / 95-97 -> 69-71 / 74 us; bf16 and f32 have since gone as runs, kRunSix). Leads of 1,
// 1.5, 3 and 4 KiB measured slower, and so did 3 rows x 7-8 tokens. For fp8 the decoding costs more than
// the FMAs it feeds, so a single pass beats panels decoded once for all tokens (one thread, fp8 2048x7168
// in L3, 5 / 6 tokens: 1.29-1.35 / 1.36-1.40 -> 0.92-0.93 / 1.03-1.04 ms; from DRAM, two threads: 0.72 /
// 0.71-0.72 -> 0.48 / 0.53 ms).
template <class V, DType D>
void long_rows(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n, float* y, int64_t ldy) {
  const int64_t lead_cols = kLongRowLeadBytes / static_cast<int64_t>(dtype_size(D));
  if (M == 5) return micro_kernel<V, D, 4, 5>(x, ldx, w, n, y, ldy, 4, lead_cols);
  micro_kernel<V, D, 4, 6>(x, ldx, w, n, y, ldy, 4, lead_cols);
}

// 3 fp8 rows of more than 1 KiB against 7 or 8 tokens in one pass (21-24 accumulators), for the same reason
// (one thread, fp8 2048x7168 in L3, 7 / 8 tokens: panels 1.56-1.58 / 1.66 ms -> 1.26 / 1.42-1.45; 2 rows
// 1.27-1.34 / 1.47-1.49; two passes of 4 rows 1.60-1.69 / 1.65; from DRAM, two threads: 0.80-0.89 / 0.85 ->
// 0.64-0.66 / 0.73-0.74 ms). bf16 measured slower this way (see long_rows).
template <class V, DType D>
void three_rows(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n, float* y, int64_t ldy) {
  const int64_t lead_cols = kLongRowLeadBytes / static_cast<int64_t>(dtype_size(D));
  if (M == 7) return micro_kernel<V, D, 3, 7>(x, ldx, w, n, y, ldy, 3, lead_cols);
  micro_kernel<V, D, 3, 8>(x, ldx, w, n, y, ldy, 3, lead_cols);
}

// One row block against tokens [0, M), M <= kMaxMacroTokens.
template <class V, DType D, int R>
void row_block(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n, float* y, int64_t ldy) {
  if (M > 4) return row_block_panel<V, D, R>(x, M, ldx, w, n, y, ldy);
  // More tokens than the register file holds accumulators for (V::kTokens): several passes, the later
  // ones re-reading the rows from L1.
  constexpr int kT = V::kTokens;
  int64_t t = 0;
  for (; t + kT <= M; t += kT) micro_kernel<V, D, R, kT>(x + t * ldx, ldx, w, n, y + t * ldy, ldy);
  switch (M - t) {
    case 3: micro_kernel<V, D, R, 3>(x + t * ldx, ldx, w, n, y + t * ldy, ldy); break;
    case 2: micro_kernel<V, D, R, 2>(x + t * ldx, ldx, w, n, y + t * ldy, ldy); break;
    case 1: micro_kernel<V, D, R, 1>(x + t * ldx, ldx, w, n, y + t * ldy, ldy); break;
    default: break;
  }
}

// y[m * ldy + (n - n0)] for m in [0, M), n in [n0, n1): note y points at column n0.
template <class V, DType D>
void linear_rows(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  // Keep a macro-block of x within about half of a 1 MiB L2.
  const int64_t macro = std::clamp<int64_t>((512 << 10) / (std::max<int64_t>(w.cols, 1) * 4), 4, kMaxMacroTokens) & ~3;
  for (int64_t m0 = 0; m0 < M; m0 += macro) {
    const int64_t mc = std::min(macro, M - m0);
    const float* xm = x + m0 * ldx;
    float* ym = y + m0 * ldy;
    int64_t n = n0;
    // Up to kRunTokens tokens: runs of rows, each read as one stream (run_kernel), then the few rows left over.
    if (mc <= kRunTokens<V, D> || (kRunSix<V, D> && (mc == 5 || mc == 6)))
      n = run_rows<V, D>(xm, mc, ldx, w, n, n1, ym + (n - n0), ldy);
    const int64_t row_bytes = w.cols * static_cast<int64_t>(dtype_size(D));
    // Past the runs, to 8 tokens: 6 rows (wide_rows), except 7-8 on rows of at most 1 KiB (short_rows) and
    // fp8 at 5-8 on longer ones (long_rows, three_rows); bf16 and f32 rows of at most 1 KiB take wide_rows
    // at every count from 9 (below, before the panels). 6 rows x 4 tokens fills 24 of 32 registers
    // (measured ~10% faster than 4 x 4 for bf16 on one thread). fp8 rows carry scale registers and stay at
    // 3-4 (6 x 3-4 spilled them: one thread, fp8 2048x7168 in L3, 3 / 4 tokens 650 / 781 -> 828 / 886 us).
    constexpr bool kWide = V::kWideBlocks && D != DType::kF8E4M3;
    constexpr bool kFp8Long = V::kWideBlocks && D == DType::kF8E4M3;  // one-pass blocks on long fp8 rows
    if (kWide && mc >= 7 && mc <= 8 && row_bytes <= 1024)
      for (; n + 4 <= n1; n += 4) short_rows<V, D>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
    if (kFp8Long && mc >= 5 && mc <= 6 && row_bytes > 1024)
      for (; n + 4 <= n1; n += 4) long_rows<V, D>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
    if (kFp8Long && mc >= 7 && mc <= 8 && row_bytes > 1024)
      for (; n + 3 <= n1; n += 3) three_rows<V, D>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
    // From 9 tokens on rows of at most 1 KiB, passes of 6 rows x 4 tokens beat the 8-row panels: the rows
    // stay in L1 across the passes, and converting them again per pass costs less than storing the panel
    // and parking the accumulators per panel (Zen 5, bf16 2048x512 from DRAM, three alternated rounds, 10 /
    // 12 / 16 / 32 tokens, one thread 165-167 / 184-185 / 242-246 / 447-461 -> 141-148 / 172-177 / 219-231
    // / 408-432 us, two 83-107 / 94-116 / 122-157 / 229-252 -> 72-98 / 86-96 / 107-120 / 219-226 us;
    // 512x512 in L2, one thread, 9-32 tokens 139-166 -> 162-184 GFLOP/s). On longer rows the passes
    // re-read them from L2 and measured 4-9% slower at 10-16 tokens (512x2048 from DRAM, two threads).
    if (kWide && mc >= 4 && (mc <= 8 || row_bytes <= 1024))
      for (; n + 6 <= n1; n += 6) wide_rows<V, D, 6>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
    // Wide panels (8 rows x 3 tokens, FMAs on L1-resident panel rows) halve the x traffic per FMA. With
    // the next row block streamed under all micro-blocks they are the faster choice from 9 tokens on (on
    // AVX-512, for bf16 and f32 rows longer than 1 KiB), and for fp8 on rows of at most 1 KiB from 5
    // (Qwen3-Next prefill of 512 tokens: 144-149 -> 134-136 ms).
    // At up to 16 tokens bf16 and f32 take panels of 256 columns (8 KiB): a 512-column panel (16 KiB)
    // with the tokens' x under it (2 KiB each), the rows it is filled from and the next block streamed in
    // comes near a 48 KiB L1. Zen 5: one thread in L3, 512x2048 at 9-12 tokens 1-16% faster in each pair,
    // 2048x512 within 5%; Qwen3-Next prefill of 512 tokens (about 10 per expert) faster in 5 of 7 pairs.
    // At 32 tokens, and for fp8 (its decoding pass) at any count, they measured slower.
    if (mc > 4 && V::kPanelRows > 4) {
      const bool narrow = D != DType::kF8E4M3 && mc <= kNarrowPanelTokens;
      // bf16 as runs (row_block_panel). f32 rows (twice the bytes per panel) measured slower that way:
      // 512x2048 from DRAM, two threads, 10 / 16 tokens 117-129 / 161-173 -> 142-150 / 182-190 us.
      if (narrow && D == DType::kBF16) {
        const int64_t run = (n1 - n) / V::kPanelRows;
        for (int64_t i = 0; i < run; ++i)
          row_block_panel<V, D, V::kPanelRows, kNarrowPanelCols>(xm, mc, ldx, w, n + i, ym + (n + i - n0), ldy, run);
        n += run * V::kPanelRows;
      }
      for (; n + V::kPanelRows <= n1; n += V::kPanelRows) {
        if (narrow) row_block_panel<V, D, V::kPanelRows, kNarrowPanelCols>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
        else row_block_panel<V, D, V::kPanelRows>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
      }
    }
    for (; n + 4 <= n1; n += 4) row_block<V, D, 4>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
    for (; n < n1; ++n) row_block<V, D, 1>(xm, mc, ldx, w, n, ym + (n - n0), ldy);
  }
}

template <class V>
void linear_any(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n0, int64_t n1, float* y,
                int64_t ldy) {
  switch (w.dtype) {
    case DType::kF32: linear_rows<V, DType::kF32>(x, M, ldx, w, n0, n1, y, ldy); break;
    case DType::kBF16: linear_rows<V, DType::kBF16>(x, M, ldx, w, n0, n1, y, ldy); break;
    case DType::kF8E4M3: linear_rows<V, DType::kF8E4M3>(x, M, ldx, w, n0, n1, y, ldy); break;
    case DType::kInt4: break;  // linear_int4_*.cpp (linear.cpp dispatches int4 before reaching here)
  }
}

}  // namespace moe::simd
