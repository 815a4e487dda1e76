// The panel path of the SIMD linear kernel (internal to moe_kernels; included by linear_simd.h, with the
// same rules: templates on the ISA's traits V, instantiated in each ISA's translation unit). A row block
// against more tokens than the register file holds accumulators for: its rows converted to fp32 once per
// panel of columns (row_block_panel), then reused from L1 by register-blocked micro-blocks of a few tokens
// each (micro_panel). The numerics are linear_simd.h's: each accumulator sees the same sequence of FMAs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/linear_isa.h"
#include "kernels/row_cursor.h"
#include "kernels/weight.h"

namespace moe::simd {

inline constexpr int64_t kMaxMacroTokens = 32;  // tokens per macro-block (linear_rows in linear_simd.h)
inline constexpr int64_t kPanelCols = 512;  // a multiple of kScaleBlock
// Narrow panels: AVX-512's 8-row panels of bf16 and f32 rows at up to kNarrowPanelTokens tokens (linear_rows).
inline constexpr int64_t kNarrowPanelCols = 256;
inline constexpr int64_t kNarrowPanelTokens = 16;
// How far ahead of the first micro-block's reads a narrow panel's runs of rows are streamed in (a panel:
// 256 bf16 columns). 1 KiB measured within 4%, 2 and 4 KiB up to 3% and 20% slower (bf16 512x2048, two threads).
inline constexpr int64_t kPanelRunLeadBytes = 512;

// Tokens x[0 .. T) against panel columns [c0, c1) of R converted rows; the accumulators live in acc_mem
// ([T][R][kLanes]) between panels, stored and reloaded unchanged, so the per-lane sequence is the same as
// in micro_kernel.
// pf .. pf_end (may be empty): bytes of the next row block to stream in, spread over the k steps (a burst
// of them at the panel's start measured slower: it overflows the miss buffers).
// fill (the first micro-block of a panel: bf16 and f32 rows, and fp8 ones where V::kFp8FillPanels, block
// by 128-column block in the widest decoding its R rows need): the R rows' cursors; each vector is read
// from its row, converted, used and stored into the panel for the later micro-blocks, so the conversion
// and the waits for the weights run under this block's FMAs instead of in a pass of their own (Zen 5,
// bf16 512x2048 and 2048x512 at 10-16 tokens: AVX-512 3-13% faster, AVX2 9-13%; Qwen3-Next prefill of
// 512 tokens on the AVX2 kernels 277 -> 242 ms, on AVX-512 unchanged).
// fill_lead (with fill): each row is also streamed in fill_lead bytes ahead of its reads, on into the row
// that follows it in memory (row_block_panel's runs).
template <class V, int R, int T, int64_t C, class Cursor = void>
void micro_panel(const float* x, int64_t ldx, float (*panel)[C], int64_t c0, int64_t c1,
                 float* acc_mem, const char* pf = nullptr, const char* pf_end = nullptr,
                 Cursor* fill = nullptr, int64_t fill_lead = 0) {
  using Reg = typename V::Reg;
  constexpr int L = V::kLanes;
  const int64_t steps = std::max<int64_t>(1, (c1 - c0) / L), lines = pf < pf_end ? (pf_end - pf + 63) / 64 : 0;
  // Bytes streamed per k step (a whole panel's step count known at compile time: no division).
  constexpr int64_t kSteps = C / L;
  const int64_t pf_step = (steps == kSteps ? (lines + kSteps - 1) / kSteps : (lines + steps - 1) / steps) * 64;
  Reg acc[R][T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][t] = V::load(acc_mem + (t * R + r) * L);
  int64_t k = c0;
  // The T token vectors stay live and each panel row is loaded as it is used (L1), so R x T accumulators
  // plus T + 1 registers fit the register file even for R = 8.
  const auto step = [&](auto path) __attribute__((always_inline)) {
    Reg xv[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) xv[t] = V::load(x + t * ldx + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      Reg wv;
      if constexpr (std::is_void_v<Cursor>) {
        wv = V::load(&panel[r][k - c0]);
        // One load per row, not one per FMA: GCC would fold it into all T FMAs and saturate the load ports.
        asm("" : "+v"(wv));
      } else {
        constexpr int64_t kEs = sizeof(*fill[r].p);
        if (fill_lead > 0 && k * kEs % 64 == 0) V::prefetch(reinterpret_cast<const char*>(fill[r].p + k) + fill_lead);
        wv = fill[r].template load<decltype(path)::value>(k);
        V::store(&panel[r][k - c0], wv);
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) acc[r][t] = V::fma(xv[t], wv, acc[r][t]);
    }
  };
  // The next block's share is issued once per V::kPanelPrefetchSteps steps, not checked at each.
  constexpr int kChunk = V::kPanelPrefetchSteps;
  const auto steps_to = [&](int64_t kend, auto path) __attribute__((always_inline)) {
    while (k + kChunk * L <= kend) {
      for (const char* to = std::min(pf + kChunk * pf_step, pf_end); pf < to; pf += 64) V::prefetch(pf);
      for (int s = 0; s < kChunk; ++s, k += L) step(path);
    }
    for (; k + L <= kend; k += L) {
      for (const char* to = std::min(pf + pf_step, pf_end); pf < to; pf += 64) V::prefetch(pf);
      step(path);
    }
  };
  if constexpr (!std::is_same_v<Cursor, RowCursor<V, DType::kF8E4M3>>) {
    steps_to(c1, std::integral_constant<int, kFastPath>{});
  } else {
    // 128-column block by block (c0 is a multiple of kScaleBlock): the decoding is the widest the R rows'
    // blocks need, and load<P> above a row's own decoding reads the same values (fp8; bf16 and f32 have one).
    for (int64_t kb = c0; kb < c1; kb += kScaleBlock) {
      // As in dot_rows (the first micro-block decodes; 2048x7168 at 5 / 8 / 10 / 16 tokens 0.92 / 0.96 /
      // 0.94 / 0.99x the time, 7168x2048 at 10 0.96x).
      if constexpr (V::kFp8TableBlocks) {
        bool table = true;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) table &= fill[r].table_block(kb / kScaleBlock);
        if (table) {
          steps_to(std::min(c1, kb + kScaleBlock), std::integral_constant<int, kFastPath>{});
          continue;
        }
      }
      int path = kFastPath;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        fill[r].block(kb / kScaleBlock);
        path = std::max(path, fill[r].path());
      }
      with_path(path, [&](auto p) __attribute__((always_inline)) { steps_to(std::min(c1, kb + kScaleBlock), p); });
    }
  }
  if (k < c1) {  // the panel's tail lanes are zero, like micro_kernel's tail loads
    Reg wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if constexpr (std::is_void_v<Cursor>) {
        wv[r] = V::load(&panel[r][k - c0]);
      } else {
        wv[r] = fill[r].load_tail(k, static_cast<int>(c1 - k));
        V::store(&panel[r][k - c0], wv[r]);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const Reg xv = V::load_tail(x + t * ldx + k, static_cast<int>(c1 - k));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = V::fma(xv, wv[r], acc[r][t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) V::store(acc_mem + (t * R + r) * L, acc[r][t]);
}

// One row block against 4 < M <= kMaxMacroTokens tokens: the rows are converted to fp32 once per panel of
// C columns (a stack buffer; by the first micro-block as it uses them, or for fp8 on AVX-512 in
// a pass before it) and every later micro-block reuses it, so the dtype conversion is paid once per row
// rather than once per micro-block, and the FMAs read L1.
//
// The block's rows are n + r * run, r < R, y[t * ldy + r * run]. Adjacent rows (run 1) stream the next
// block in under this one's micro-blocks. Rows a run apart (a caller walking n, n + 1, ... as run_rows
// does; bf16 and f32 fill the panel as they read) make R long streams instead, each row read on into the
// next row of its run, which the hardware prefetchers follow and the first micro-block streams
// kPanelRunLeadBytes ahead; adjacent rows end every stream at each block, so that the memory idles at
// every block start. Zen 5, bf16 512x2048 from DRAM, two threads, 9 / 10 / 12 / 16 tokens, one process
// alternating the two: 249 / 257 / 278 / 361 -> 192 / 222 / 241 / 317 us in a slow memory mode, 10-12
// tokens 2-9% faster and 16 within the noise in a fast one; Qwen3-Next prefill of 512 tokens, alternated
// call by call, 1.06x (median of seven runs' paired medians, 0.98-1.08x).
template <class V, DType D, int R, int64_t C = kPanelCols>
void row_block_panel(const float* x, int64_t M, int64_t ldx, const WeightView& w, int64_t n, float* y,
                     int64_t ldy, int64_t run = 1) {
  constexpr int L = V::kLanes;
  constexpr int64_t kColBytes = R * static_cast<int64_t>(dtype_size(D));
  alignas(64) float panel[R][C];
  alignas(64) float acc_mem[kMaxMacroTokens * R * L];
  const int64_t K = w.cols;
  const char* next = static_cast<const char*>(w.data) + (n + R) * K * static_cast<int64_t>(dtype_size(D));
  const char* end = static_cast<const char*>(w.data) + w.rows * K * static_cast<int64_t>(dtype_size(D));
  RowCursor<V, D> rows[R];
  for (int r = 0; r < R; ++r) rows[r].set(w, n + r * run);
  for (int64_t i = 0; i < M * R * L; ++i) acc_mem[i] = 0.0f;
  for (int64_t c0 = 0; c0 < K; c0 += C) {
    const int64_t c1 = std::min(K, c0 + C);
    const char* pf = run == 1 ? std::min(next + c0 * kColBytes, end) : nullptr;
    const char* pf_end = run == 1 ? std::min(next + c1 * kColBytes, end) : nullptr;
    // bf16 and f32 rows (and fp8 ones where V::kFp8FillPanels) are converted by the first micro-block as
    // it uses them (micro_panel's fill); fp8 ones on AVX-512 in a pass of their own before it.
    constexpr bool kFill = D != DType::kF8E4M3 || V::kFp8FillPanels;
    if constexpr (!kFill) {
      for (int64_t kb = c0; kb < c1; kb += kScaleBlock) {
        const int64_t kend = std::min(c1, kb + kScaleBlock);
        for (int r = 0; r < R; ++r) {
          rows[r].block(kb / kScaleBlock);
          int64_t k = kb;
          with_path(rows[r].path(), [&](auto path) {
            for (; k + L <= kend; k += L) V::store(&panel[r][k - c0], rows[r].template load<decltype(path)::value>(k));
          });
          if (k < kend) V::store(&panel[r][k - c0], rows[r].load_tail(k, static_cast<int>(kend - k)));
        }
      }
    }
    constexpr int kT = R >= V::kPanelRows ? V::kPanelTokens : V::kTokens;
    // Each micro-block streams in its share of the next row block's part of this panel, so the reads
    // run at an even rate under all of the panel's FMAs (bf16, one thread, 16 tokens: 249 -> 193 us per
    // 512x2048 matrix; Qwen3-Next prefill of 512 tokens: 161 -> 145 ms). fp8 leaves it all to the first
    // micro-block, measured 3-5% better for its heavier conversion (with the decoding pass before it; not
    // measured again since AVX2 decodes in that micro-block).
    const int64_t blocks = D == DType::kF8E4M3 ? 1 : (M + kT - 1) / kT;
    const int64_t share = ((pf_end - pf) / 64 + blocks - 1) / blocks * 64;
    // M > 4 >= kT: the first micro-block is always a whole one.
    const char* pf_to = std::min(pf + share, pf_end);
    if constexpr (kFill)
      micro_panel<V, R, kT, C>(x, ldx, panel, c0, c1, acc_mem, pf, pf_to, rows, run == 1 ? 0 : kPanelRunLeadBytes);
    else micro_panel<V, R, kT, C>(x, ldx, panel, c0, c1, acc_mem, pf, pf_to);
    int64_t t = kT;
    for (pf = pf_to; t + kT <= M; t += kT, pf = pf_to) {
      pf_to = std::min(pf + share, pf_end);
      micro_panel<V, R, kT, C>(x + t * ldx, ldx, panel, c0, c1, acc_mem + t * R * L, pf, pf_to);
    }
    switch (M - t) {
      case 3: micro_panel<V, R, 3, C>(x + t * ldx, ldx, panel, c0, c1, acc_mem + t * R * L, pf, pf_end); break;
      case 2: micro_panel<V, R, 2, C>(x + t * ldx, ldx, panel, c0, c1, acc_mem + t * R * L, pf, pf_end); break;
      case 1: micro_panel<V, R, 1, C>(x + t * ldx, ldx, panel, c0, c1, acc_mem + t * R * L, pf, pf_end); break;
      default: break;
    }
  }
  if (run == 1) return V::template hsum_mem<R>(acc_mem, M, y, ldy);
  float sums[kMaxMacroTokens * R];
  V::template hsum_mem<R>(acc_mem, M, sums, R);
  for (int64_t t = 0; t < M; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r * run] = sums[t * R + r];
}

}  // namespace moe::simd
