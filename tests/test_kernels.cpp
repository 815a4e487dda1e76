// Conformance of the linear kernels: every compiled ISA against an fp64 reference for every weight dtype,
// the determinism contract (a row's bits do not depend on batch, range or neighbours), gate_up_silu ==
// linear + linear + silu_mul bitwise, special values, and the dtype conversions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/dtype.h"
#include "kernels/linear.h"
#include "kernels/linear_isa.h"
#include "kernels/roofline.h"
#include "kernels/weight.h"
#include "kernel_test_util.h"

namespace moe {
namespace {

using testing_util::make_weight;
using testing_util::TestWeight;
using testing_util::expect_part_is_full;
using testing_util::make_x;

// Every kernel test runs on each ISA this CPU has; the ISA is an argument of every kernel call.
class KernelIsa : public testing_util::IsaTest {};

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF8E4M3};

// y vs an fp64 dot product of the same fp32 weights, with an fp32-summation error bound; columns outside
// [n0, n1) and the padding beyond N must stay untouched.
void check_against_reference(Isa isa, DType dt, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " M=" << M << " N=" << N << " K=" << K << " range=["
                                    << n0 << "," << n1 << ")");
  const TestWeight w = make_weight(dt, N, K, static_cast<uint32_t>(M * 131 + N * 7 + K));
  const int64_t ldx = K + 3, ldy = N + 5;
  const std::vector<float> x = make_x(M, ldx, static_cast<uint32_t>(K));
  constexpr float kSentinel = -12345.0f;
  std::vector<float> y(static_cast<size_t>(M * ldy), kSentinel);
  linear(isa, x.data(), M, ldx, w.view, n0, n1, y.data(), ldy);
  const bool bf16_inputs = isa == Isa::kAvx512Bf16 && dt != DType::kF32;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < ldy; ++n) {
      const float got = y[m * ldy + n];
      if (n < n0 || n >= n1) {
        ASSERT_EQ(got, kSentinel) << "wrote outside the range at m=" << m << " n=" << n;
        continue;
      }
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(x[m * ldx + k]) * weight_at(w.view, n, k);
        ref += p;
        mag += std::fabs(p);
      }
      double tol = 2.0 * (K + 4) * std::numeric_limits<float>::epsilon() * mag + 1e-30;
      if (bf16_inputs) tol += std::ldexp(mag, -8);  // x rounded to bf16: at most 2^-9 relative per product
      ASSERT_NEAR(got, ref, tol) << "m=" << m << " n=" << n;
    }
}

TEST_P(KernelIsa, MatchesFp64ReferenceOddSizes) {
  for (DType dt : kDTypes) {
    for (int64_t K : {1, 7, 16, 33, 129, 300}) check_against_reference(isa(), dt, 3, 13, K, 0, 13);
    for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 37}) check_against_reference(isa(), dt, M, 11, 100, 0, 11);
    check_against_reference(isa(), dt, 5, 19, 64, 3, 17);  // sub-range with both tails
  }
}

TEST_P(KernelIsa, Fp8BlockScalesAcrossBlocks) {
  // Several 128x128 scale blocks in both directions, a range that starts inside the second row block.
  check_against_reference(isa(), DType::kF8E4M3, 6, 300, 391, 0, 300);
  check_against_reference(isa(), DType::kF8E4M3, 2, 300, 391, 130, 261);
  check_against_reference(isa(), DType::kF8E4M3, 7, 20, 1100, 0, 20);  // several 512-column panels and a tail
  // Rows longer than 1 KiB at 5-8 tokens (one-pass blocks of 4 and 3 rows on AVX-512), with row ranges
  // that leave rows over for the narrower blocks.
  for (int64_t M : {5, 6, 7, 8}) check_against_reference(isa(), DType::kF8E4M3, M, 23, 1100, 1, 23);
}

// Every fp8 code through the kernel: token m is the one-hot x selecting column m of a single row, so y[m] is
// the weight, fp8(code) * scale rounded once, on every path. The row holds the 256 codes in two 128-column
// blocks (with zero and subnormal codes: the AVX-512 path's fp16 decoding), then the normal codes again in
// two blocks of their own (its fast decoding), under scales that take the slower decodings (2^7 and more,
// 2^100 and more) and, where x is not rounded to bf16 with the scale in it, scales that need rounding. (The
// two NaN codes would make every token NaN, 0 * NaN; they are zero here and have their own test below.)
TEST_P(KernelIsa, Fp8DecodesEveryCodeExactly) {
  constexpr int64_t K = 512;
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) codes.push_back(static_cast<uint8_t>((c & 0x7f) == 0x7f ? 0 : c));
  for (int sign : {0, 0x80})
    for (int c = 0; c < 128; ++c) codes.push_back(static_cast<uint8_t>(sign | std::clamp(c, 8, 0x7e)));
  WeightView w;
  w.dtype = DType::kF8E4M3;
  w.rows = 1;
  w.cols = K;
  w.data = codes.data();
  std::vector<float> x(K * K, 0.0f), y(K);
  for (int64_t m = 0; m < K; ++m) x[m * K + m] = 1.0f;
  std::vector<float> scale_list = {0.25f, 0x1p-22f, 0x1p7f, 0x1p101f};
  if (!rounds_x_to_bf16(isa(), DType::kF8E4M3)) scale_list.insert(scale_list.end(), {0.0123f, 3e-7f, 100.0f, 200.0f, 2e30f});
  for (float scale : scale_list) {
    const float scales[4] = {scale, scale, scale, scale};  // four 128-column blocks
    w.scale_inv = scales;
    for (int64_t M : {int64_t{1}, K}) {  // one token (decoded as read) and all (decoded into panels)
      std::fill(y.begin(), y.end(), -1.0f);
      for (int64_t m = 0; m < K; m += M) linear(isa(), x.data() + m * K, M, K, w, 0, 1, y.data() + m, 1);
      for (int64_t c = 0; c < K; ++c)
        ASSERT_EQ(y[c], fp8e4m3_to_f32(codes[c]) * scale) << "code " << int{codes[c]} << " scale " << scale << " M=" << M;
    }
  }
}

TEST_P(KernelIsa, LongRowsAtDecodeShapes) {
  check_against_reference(isa(), DType::kBF16, 1, 9, 2048, 0, 9);
  check_against_reference(isa(), DType::kBF16, 33, 6, 2051, 0, 6);  // two token macro-blocks
  // 1-8 tokens on rows of 1 KiB (a down projection): 2-row blocks streaming several blocks ahead (the
  // bf16-dot path takes them for up to 8 tokens in one pass, the exact path for 1-2), 4-row short_rows
  // for 5-8 on the exact path.
  for (int64_t M : {1, 2, 3, 5, 6, 7, 8}) {
    check_against_reference(isa(), DType::kBF16, M, 21, 512, 0, 21);
    check_against_reference(isa(), DType::kF32, M, 13, 300, 3, 12);
  }
  // 3-8 tokens on rows of 4 KiB (a gate or up projection): wide_rows, and long_rows (4 rows, one pass)
  // for 5-6 on the exact path.
  for (int64_t M : {3, 4, 5, 6, 7}) check_against_reference(isa(), DType::kBF16, M, 9, 2048, 1, 9);
  // 9-16 tokens: AVX-512's narrow panels (256 columns; here three and a tail), one full 8-row block and a rest.
  for (int64_t M : {9, 10, 16}) {
    check_against_reference(isa(), DType::kBF16, M, 13, 600, 0, 13);
    check_against_reference(isa(), DType::kF32, M, 13, 600, 2, 13);
  }
}

// The determinism contract: each row's bits are the same alone, in any batch, in any row range. (A single
// row of a single token is reduced on its own, a batch several accumulators per register on AVX-512, so
// this also pins the packed reduction to the plain one.)
TEST_P(KernelIsa, RowBitsIndependentOfBatchAndRange) {
  constexpr int64_t M = 37, N = 23;
  for (auto [dt, K] : {std::pair{DType::kF32, int64_t{259}}, {DType::kBF16, int64_t{259}},
                       {DType::kF8E4M3, int64_t{259}}, {DType::kF8E4M3, int64_t{1100}},
                       {DType::kBF16, int64_t{600}}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " K=" << K);
    const TestWeight w = make_weight(dt, N, K, 99);
    const std::vector<float> x = make_x(M, K, 7);
    std::vector<float> full(M * N);
    linear(isa(), x.data(), M, K, w.view, 0, N, full.data(), N);
    // Every row alone, every column alone.
    for (int64_t m = 0; m < M; ++m) {
      std::vector<float> one(N);
      linear(isa(), x.data() + m * K, 1, K, w.view, 0, N, one.data(), N);
      ASSERT_EQ(0, std::memcmp(one.data(), full.data() + m * N, N * sizeof(float))) << "row " << m;
      for (int64_t n = 0; n < N; n += 5) {
        std::vector<float> single(N, 0.0f);
        linear(isa(), x.data() + m * K, 1, K, w.view, n, n + 1, single.data(), N);
        ASSERT_EQ(0, std::memcmp(&single[n], &full[m * N + n], sizeof(float))) << "m=" << m << " n=" << n;
      }
    }
    // Batches of every size from several starts, odd row ranges.
    for (int64_t m0 : {0, 3, 10}) {
      // Every blocking case: runs, 4, > 4, panels, and on short rows passes ending 3 + 2 (13), 3 + 3 (10), 3 (27).
      for (int64_t cnt : {1, 2, 3, 4, 5, 6, 7, 8, 10, 13, 27}) {
        if (m0 + cnt > M) continue;
        for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {1, 9}, {5, 22}, {8, 12}})
          ASSERT_NO_FATAL_FAILURE(expect_part_is_full(isa(), x, K, w.view, full, N, m0, cnt, n0, n1));
      }
    }
  }
}

// The same contract where the test above does not reach: row ranges that start or end inside a 128-row
// fp8 scale block and cross into the next (the bf16-dot path cuts its runs at those blocks), and rows of
// 2048 columns, whose converted x rows the bf16-dot path spaces apart (4 KiB rows would share L1 sets).
TEST_P(KernelIsa, RowBitsIndependentOfRangeAcrossScaleBlocksAndLongRows) {
  constexpr int64_t M = 8;
  for (auto [dt, N, K] : {std::tuple{DType::kF8E4M3, int64_t{300}, int64_t{391}},
                          {DType::kF8E4M3, int64_t{260}, int64_t{2048}}, {DType::kBF16, int64_t{40}, int64_t{2048}}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " N=" << N << " K=" << K);
    const TestWeight w = make_weight(dt, N, K, 17);
    const std::vector<float> x = make_x(M, K, 5);
    std::vector<float> full(M * N);
    linear(isa(), x.data(), M, K, w.view, 0, N, full.data(), N);
    for (int64_t cnt : {1, 2, 3, 4, 5, 8}) {
      for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {130, 261}, {127, 129}, {1, 38}, {250, 260}}) {
        n1 = std::min(n1, N);
        if (n0 >= n1) continue;
        ASSERT_NO_FATAL_FAILURE(expect_part_is_full(isa(), x, K, w.view, full, N, M - cnt, cnt, n0, n1));
      }
    }
  }
  check_against_reference(isa(), DType::kF8E4M3, 2, 260, 2048, 120, 260);
  check_against_reference(isa(), DType::kBF16, 8, 10, 2048, 0, 10);
}

TEST_P(KernelIsa, GateUpSiluEqualsUnfusedBitwise) {
  constexpr int64_t M = 37, I = 150, K = 200;  // more tokens and rows than one fused tile
  for (DType dt : kDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const TestWeight gate = make_weight(dt, I, K, 1), up = make_weight(dt, I, K, 2);
    const std::vector<float> x = make_x(M, K, 3);
    std::vector<float> g(M * I), u(M * I), want(M * I), got(M * I, 0.0f);
    linear(isa(), x.data(), M, K, gate.view, 0, I, g.data(), I);
    linear(isa(), x.data(), M, K, up.view, 0, I, u.data(), I);
    silu_mul(isa(), g.data(), u.data(), want.data(), M * I);
    gate_up_silu(isa(), x.data(), M, K, gate.view, up.view, 0, I, got.data(), I);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
    std::vector<float> part(M * I, 0.0f);
    gate_up_silu(isa(), x.data(), M, K, gate.view, up.view, 7, 131, part.data(), I);
    for (int64_t m = 0; m < M; ++m)
      ASSERT_EQ(0, std::memcmp(&part[m * I + 7], &want[m * I + 7], (131 - 7) * sizeof(float))) << m;
  }
}

// scale_add rounds the product before the sum on every path (the layer's combine and sum depend on it
// for the same bits on every ISA): values where a fused multiply-add would round differently.
TEST_P(KernelIsa, ScaleAddRoundsTheProductFirst) {
  constexpr int64_t n = 37;  // two vectors and a tail
  std::vector<float> x(n), y(n), want(n);
  const float a = 1.0f + 0x1p-12f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = (1.0f + 0x1p-12f) * static_cast<float>(i % 5 + 1);
    y[i] = -static_cast<float>(i % 5 + 1) * (1.0f + 0x1p-11f);
    volatile float p = a * x[i];  // rounded, as the contract says
    want[i] = y[i] + p;
  }
  int differs_from_fma = 0;
  for (int64_t i = 0; i < n; ++i) differs_from_fma += std::fma(a, x[i], y[i]) != want[i];
  ASSERT_GT(differs_from_fma, 0) << "the inputs must tell the two roundings apart";
  scale_add(isa(), y.data(), x.data(), a, n);
  EXPECT_EQ(0, std::memcmp(y.data(), want.data(), n * sizeof(float)));
}

// weighted_rows_sum (the combine) gives the bits of zeroing y and adding each slot's rounded product in
// slot order, skipping slots at row -1: values where an FMA, another order or a read of y would differ.
TEST_P(KernelIsa, WeightedRowsSumIsTheSlotOrderSum) {
  constexpr int64_t n = 37, ldx = 40, rows_in_x = 6;  // two vectors and a tail
  std::vector<float> x(rows_in_x * ldx);
  for (int64_t i = 0; i < rows_in_x * ldx; ++i)
    x[i] = (1.0f + 0x1p-12f) * static_cast<float>((i * 7) % 11 - 5) * (i % 3 == 0 ? 0x1p20f : 1.0f);
  const int32_t rows[] = {4, -1, 0, 5, 4, 2};
  const float a[] = {1.0f + 0x1p-12f, 9.0f, -0.75f, 0.0f, 1.0f - 0x1p-13f, -3.0f};
  constexpr int64_t k = 6;
  std::vector<float> want(n), y(n, std::numeric_limits<float>::quiet_NaN());
  int differs_from_fma = 0;
  for (int64_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      if (rows[j] < 0) continue;
      volatile float p = a[j] * x[rows[j] * ldx + i];  // rounded, as the contract says
      differs_from_fma += std::fma(a[j], x[rows[j] * ldx + i], s) != s + p;
      s += p;
    }
    want[i] = s;
  }
  ASSERT_GT(differs_from_fma, 0) << "the inputs must tell the two roundings apart";
  weighted_rows_sum(isa(), y.data(), x.data(), ldx, rows, a, k, n);
  EXPECT_EQ(0, std::memcmp(y.data(), want.data(), n * sizeof(float)));
  // No slot, or every slot skipped: zeros.
  const int32_t none[] = {-1, -1};
  weighted_rows_sum(isa(), y.data(), x.data(), ldx, none, a, 2, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(0.0f, y[i]) << i;
}

// silu_mul on every path against the fp64 formula: a few ulp for finite results (the AVX-512 exp is a
// polynomial, the others expf), the same inf/NaN/zero behaviour as the formula, every tail length.
TEST_P(KernelIsa, SiluMulMatchesTheFormula) {
  std::vector<float> g, u;
  for (int i = -4000; i <= 4000; ++i) {  // a dense sweep of [-40, 40] plus the saturating ends
    g.push_back(static_cast<float>(i) * 0.01f);
    u.push_back(1.0f + static_cast<float>(i % 7) * 0.25f);
  }
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float z : {0.0f, -0.0f, 1e-40f, -1e-40f, 87.0f, 89.0f, -87.0f, -89.0f, 104.0f, -104.0f, 200.0f, -200.0f,
                  1e30f, -1e30f, inf, -inf, nan}) {
    g.push_back(z);
    u.push_back(3.0f);
  }
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, static_cast<int64_t>(g.size())}) {
    std::vector<float> h(static_cast<size_t>(n), -7.0f);
    silu_mul(isa(), g.data(), u.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double z = g[i], want = z / (1.0 + std::exp(-z)) * u[i];
      SCOPED_TRACE(::testing::Message() << "g=" << g[i] << " u=" << u[i] << " n=" << n);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(h[i])) << h[i];
      } else if (std::isinf(want) || want == 0.0) {
        EXPECT_EQ(h[i], static_cast<float>(want));
      } else {
        // Below -88.7, exp(-z) overflows float and the float formula gives -0 where fp64 still has
        // ~1e-37: an absolute 1e-30 covers it.
        EXPECT_NEAR(h[i], want, 8 * std::abs(want) * 0x1p-24 + 1e-30) << h[i];
      }
    }
  }
}

// The bf16-dot path rounds x to bf16: it agrees with the exact avx512 path within that error, and it is
// really a different path (some bits differ) for bf16 and fp8 weights, identical for f32.
TEST_P(KernelIsa, Bf16DotPathStaysWithinItsBound) {
  if (GetParam() != Isa::kAvx512Bf16) GTEST_SKIP() << "only for avx512bf16";
  constexpr int64_t M = 9, N = 21, K = 2050;
  for (DType dt : kDTypes) {
    const TestWeight w = make_weight(dt, N, K, 11);
    const std::vector<float> x = make_x(M, K, 12);
    std::vector<float> dot(M * N), exact(M * N);
    linear(isa(), x.data(), M, K, w.view, 0, N, dot.data(), N);
    linear(Isa::kAvx512, x.data(), M, K, w.view, 0, N, exact.data(), N);
    const bool same = std::memcmp(dot.data(), exact.data(), dot.size() * sizeof(float)) == 0;
    EXPECT_EQ(same, dt == DType::kF32) << dtype_name(dt);
    double err = 0, norm = 0;
    for (size_t i = 0; i < dot.size(); ++i) {
      err += std::fabs(dot[i] - exact[i]);
      norm += std::fabs(exact[i]);
    }
    EXPECT_LT(err / norm, 1e-2) << dtype_name(dt);
  }
}

TEST_P(KernelIsa, NanAndInfPassThrough) {
  constexpr int64_t M = 3, N = 9;
  for (int64_t K : {40, 256}) {  // fp8 NaN codes in a block shorter than 128 columns, and in full blocks
    for (DType dt : kDTypes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " K=" << K);
      TestWeight w = make_weight(dt, N, K, 5);
      std::vector<float> x = make_x(M, K, 6);
      x[0 * K + 17] = std::numeric_limits<float>::quiet_NaN();
      x[1 * K + K - 1] = std::numeric_limits<float>::infinity();  // the tail lane on the SIMD paths
      if (dt == DType::kF8E4M3) {
        w.fp8[4 * K + 3] = 0xff;                  // fp8 NaN codes in row 4
        if (K > 128) w.fp8[6 * K + 200] = 0x7f;  // and in row 6's second block
      }
      std::vector<float> y(M * N);
      linear(isa(), x.data(), M, K, w.view, 0, N, y.data(), N);
      for (int64_t n = 0; n < N; ++n) {
        EXPECT_TRUE(std::isnan(y[n])) << n;
        EXPECT_TRUE(std::isinf(y[N + n]) || std::isnan(y[N + n])) << n;
        EXPECT_EQ(std::isnan(y[2 * N + n]), dt == DType::kF8E4M3 && (n == 4 || (K > 128 && n == 6))) << n;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KernelIsa,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAvx2Int8),
                         [](const ::testing::TestParamInfo<Isa>& p) { return std::string(isa_name(p.param)); });

TEST(KernelDispatch, BestIsaIsSupportedAndUnsupportedThrows) {
  EXPECT_TRUE(isa_supported(best_isa()));
  EXPECT_NE(best_isa(), Isa::kAvx512Bf16);  // rounds x to bf16: opt-in only
  EXPECT_NE(best_isa(), Isa::kAvx2Int8);    // quantizes x to int8: opt-in only
  EXPECT_EQ(exact_isa(best_isa()), best_isa());
  EXPECT_TRUE(isa_supported(Isa::kScalar));
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAvx2Int8}) {
    if (!isa_supported(isa)) {
      EXPECT_THROW(require_isa(isa, "test"), std::invalid_argument);
    }
  }
}

// The AVX2 kernels' two prefetch builds (into L2 4 KiB ahead, into L1 2 KiB ahead; linear.cpp picks one per
// CPU family) give the same bits: every dtype they take, the token counts of each blocking (runs, row blocks,
// panels), rows of a partial scale block and a column tail, and a NaN in x. Both run on every AVX2 CPU.
TEST(Avx2Prefetch, L1AndL2BuildsGiveTheSameBits) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "avx2 not available here";
  for (const DType dt : {DType::kF32, DType::kBF16, DType::kF8E4M3})
    for (const int64_t K : {int64_t{200}, int64_t{2048}})
      for (const int64_t M : {1, 2, 3, 4, 5, 8, 9, 16}) {
        const int64_t N = 23;
        const TestWeight w = make_weight(dt, N, K, static_cast<uint32_t>(M + K));
        std::vector<float> x = testing_util::make_x(M, K, static_cast<uint32_t>(7 * M + K));
        if (M == 5) x[static_cast<size_t>(3 * K + 7)] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> l2(static_cast<size_t>(M * N)), l1(l2.size(), 1.0f);
        detail::linear_avx2(x.data(), M, K, w.view, 0, N, l2.data(), N);
        detail::linear_avx2_prefetch_l1(x.data(), M, K, w.view, 0, N, l1.data(), N);
        EXPECT_EQ(std::memcmp(l2.data(), l1.data(), l2.size() * sizeof(float)), 0)
            << dtype_name(dt) << " K=" << K << " M=" << M;
      }
}

// Reports name the L1 build exactly where linear() picks it: AMD family 0x1a (Zen 5) and later.
TEST(Avx2Prefetch, IsNamedWhereItRuns) {
  const CpuFeatures& f = cpu_features();
  const bool l1 = isa_supported(Isa::kAvx2) && f.amd && f.family >= 0x1a;
  EXPECT_EQ(isa_build(Isa::kAvx2) == "weights prefetched into L1", l1) << isa_build(Isa::kAvx2);
  EXPECT_EQ(isa_build(Isa::kAvx2).empty(), !l1);
  EXPECT_EQ(isa_build(Isa::kAvx2Int8).find("other weights prefetched into L1") != std::string::npos, l1);
}

TEST(Dtype, Fp8RoundTripsAllCodes) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float f = fp8e4m3_to_f32(code);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << c;
      EXPECT_EQ(f32_to_fp8e4m3(f) & 0x7f, 0x7f) << c;
      continue;
    }
    EXPECT_EQ(f32_to_fp8e4m3(f), code) << c << " -> " << f;
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
}

TEST(Dtype, Fp8RoundingAndSaturation) {
  EXPECT_EQ(f32_to_fp8e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  // 1.0 = 0x38, next 1.125 = 0x39; the midpoint 1.0625 ties to the even code, just above goes up.
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_fp8e4m3(1.07f), 0x39);
  EXPECT_EQ(f32_to_fp8e4m3(1.1875f), 0x3a);  // midpoint of 0x39 and 0x3a: to the even 0x3a
  EXPECT_EQ(f32_to_fp8e4m3(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
}

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);       // exact half: to even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);   // exact half: to even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h) << h;
  }
}

// The probes must run and return plausible numbers (their values are the benchmark's business).
TEST(Roofline, ProbesReturnPositiveFigures) {
  EXPECT_GT(measure_read_bandwidth_gbps(2, size_t{16} << 20), 0.0);
  EXPECT_GT(measure_peak_gflops(1, PeakKind::kF32Fma), 0.0);
  if (__builtin_cpu_supports("avx512bf16")) {
    EXPECT_GT(measure_peak_gflops(1, PeakKind::kBf16Dot), 0.0);
  }
  // The AVX2 kernels' peak is the one of 256-bit vectors; the scalar kernels have no FMA peak to quote.
  if (isa_supported(Isa::kAvx2)) {
    EXPECT_GT(measure_peak_gflops(1, PeakKind::kF32Fma, Isa::kAvx2), 0.0);
  }
  EXPECT_EQ(measure_peak_gflops(1, PeakKind::kF32Fma, Isa::kScalar), 0.0);
}

// The bench times read_once over its cache-evicting sweep: every word must be read, whatever the ISA.
TEST(Roofline, ReadOnceReadsEveryWord) {
  constexpr size_t kBytes = 64 << 10, kWords = kBytes / 8;
  std::unique_ptr<uint64_t, decltype(&std::free)> mem(static_cast<uint64_t*>(std::aligned_alloc(64, kBytes)), &std::free);
  ASSERT_NE(mem, nullptr);
  uint64_t* words = mem.get();
  for (size_t i = 0; i < kWords; ++i) words[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
  auto expected = [&](size_t n) {
    uint64_t x = 0;
    for (size_t i = 0; i < n; ++i) x ^= words[i];
    return x;
  };
  EXPECT_EQ(read_once(words, kBytes), expected(kWords));
  EXPECT_EQ(read_once(words, 1024), expected(128));
  for (size_t i : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{130}, kWords - 1}) {
    words[i] ^= 1;  // any one word changes the result
    EXPECT_EQ(read_once(words, kBytes), expected(kWords)) << i;
  }
}

}  // namespace
}  // namespace moe
