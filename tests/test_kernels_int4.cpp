// The int4 (compressed-tensors pack-quantized) kernels: the scalar definition (weight_at) on hand-packed
// words, every compiled ISA against an fp64 dot product of those values, the exact decoding of every column
// position (one-hot x), the determinism contract, gate_up_silu == linear + linear + silu_mul bitwise, and
// bytes() / row_slice().
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/cpu_features.h"
#include "kernels/linear.h"
#include "kernels/linear_isa.h"
#include "kernels/weight.h"
#include "kernel_test_util.h"

namespace moe {
namespace {

struct Int4Weight {
  std::vector<uint32_t> words;
  std::vector<uint16_t> scales;
  WeightView view;
};

// Random codes (all 16) and random bf16 scales of both signs, some tiny (bf16 subnormals) and some large.
Int4Weight make_int4(int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
  std::mt19937 rng(seed);
  Int4Weight t;
  t.words.resize(static_cast<size_t>(rows * cols / 8));
  for (auto& w : t.words) w = static_cast<uint32_t>(rng());
  std::uniform_real_distribution<float> us(1e-3f, 1e-1f);
  t.scales.resize(static_cast<size_t>(rows * (cols / group)));
  for (size_t i = 0; i < t.scales.size(); ++i) {
    float s = us(rng) * (i % 3 == 1 ? -1.0f : 1.0f);
    if (i % 17 == 5) s = 3e-40f;  // subnormal in bf16 and fp32
    if (i % 23 == 7) s = 1e30f;
    t.scales[i] = f32_to_bf16(s);
  }
  t.view.dtype = DType::kInt4;
  t.view.rows = rows;
  t.view.cols = cols;
  t.view.data = t.words.data();
  t.view.group_scale = t.scales.data();
  t.view.group_size = group;
  return t;
}

using testing_util::make_x;

class Int4Isa : public testing_util::IsaTest {};

TEST(Int4Weights, WeightAtIsTheFieldMinusEightTimesTheGroupScale) {
  // Row 0: words 0x76543210 and 0xfedcba98, i.e. columns 0..15 hold fields 0..15 = values -8..7.
  std::vector<uint32_t> words = {0x76543210u, 0xfedcba98u, 0x88888888u, 0x0f0f0f0fu,
                                 0x12345678u, 0x9abcdef0u, 0x00000000u, 0xffffffffu};
  // 32 columns per row, groups of 32: one scale per row.
  std::vector<uint16_t> scales = {f32_to_bf16(0.5f), f32_to_bf16(-2.0f)};
  WeightView w{.dtype = DType::kInt4, .data = words.data(), .rows = 2, .cols = 32};
  w.group_scale = scales.data();
  w.group_size = 32;
  for (int c = 0; c < 16; ++c) EXPECT_EQ(weight_at(w, 0, c), static_cast<float>(c - 8) * 0.5f) << c;
  for (int c = 16; c < 24; ++c) EXPECT_EQ(weight_at(w, 0, c), 0.0f) << c;  // field 8 = value 0
  EXPECT_EQ(weight_at(w, 0, 24), 7.0f * 0.5f);  // 0x0f0f0f0f: fields f, 0, f, 0, ...
  EXPECT_EQ(weight_at(w, 0, 25), -8.0f * 0.5f);
  EXPECT_EQ(weight_at(w, 1, 0), (8 - 8) * -2.0f);  // 0x12345678: field 0 is 8
  EXPECT_EQ(weight_at(w, 1, 7), (1 - 8) * -2.0f);
  EXPECT_EQ(weight_at(w, 1, 8), (0 - 8) * -2.0f);  // 0x9abcdef0
  EXPECT_EQ(weight_at(w, 1, 31), 7.0f * -2.0f);
  // 16 bytes of codes and 2 of scale per row.
  EXPECT_EQ(w.bytes(), 2 * (16 + 2));
  const WeightView r1 = w.row_slice(1, 2);
  EXPECT_EQ(r1.rows, 1);
  for (int c = 0; c < 32; ++c) EXPECT_EQ(weight_at(r1, 0, c), weight_at(w, 1, c)) << c;
}

TEST(Int4Weights, RowSliceKeepsEachRowsScales) {
  const Int4Weight t = make_int4(7, 256, 64, 3);
  for (int64_t r0 : {0, 1, 3})
    for (int64_t r1 : {int64_t{4}, int64_t{7}}) {
      const WeightView s = t.view.row_slice(r0, r1);
      EXPECT_EQ(s.bytes(), (r1 - r0) * (128 + 4 * 2));
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t c = 0; c < 256; c += 5) {
          const float a = weight_at(s, r, c), b = weight_at(t.view, r0 + r, c);
          EXPECT_EQ(std::memcmp(&a, &b, 4), 0) << r0 << " " << r << " " << c;
        }
    }
}

// The int4 paths are exact fp32 but two opt-in ones: avx512bf16 rounds x to bf16 (as it does for bf16 and fp8
// weights), avx2int8 quantizes it to int8.
TEST(Int4Weights, OnlyTheOptInIsasApproximateXForInt4) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) EXPECT_FALSE(approximates_x(isa, DType::kInt4));
  EXPECT_TRUE(rounds_x_to_bf16(Isa::kAvx512Bf16, DType::kInt4));
  EXPECT_FALSE(quantizes_x_to_int8(Isa::kAvx512Bf16, DType::kInt4));
  EXPECT_TRUE(quantizes_x_to_int8(Isa::kAvx2Int8, DType::kInt4));
  EXPECT_FALSE(rounds_x_to_bf16(Isa::kAvx2Int8, DType::kInt4));
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF8E4M3}) EXPECT_FALSE(approximates_x(Isa::kAvx2Int8, dt));
}

// Row m of x as the kernel multiplies it (K columns): rounded to bf16 (to nearest even) on avx512bf16; on
// avx2int8, per 32 columns q * d with d = max |x| / 127 and q = x * (127 / max |x|) rounded to nearest even.
std::vector<double> as_multiplied(Isa isa, const float* x, int64_t K) {
  std::vector<double> v(x, x + K);
  if (rounds_x_to_bf16(isa, DType::kInt4))
    for (int64_t k = 0; k < K; ++k) v[k] = bf16_to_f32(f32_to_bf16(x[k]));
  if (quantizes_x_to_int8(isa, DType::kInt4))
    for (int64_t c = 0; c < K; c += 32) {
      float amax = 0.0f;
      for (int64_t k = c; k < c + 32; ++k) amax = std::max(amax, std::fabs(x[k]));
      const float d = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int64_t k = c; k < c + 32; ++k) v[k] = std::nearbyint(x[k] * inv) * static_cast<double>(d);
    }
  return v;
}

// y vs an fp64 dot product of weight_at's values and x as multiplied, with the fp32-summation bound of
// test_kernels.cpp (the bf16-dot products and the int8 dot products are exact too); columns outside [n0, n1)
// untouched.
void check_against_reference(Isa isa, int64_t M, int64_t N, int64_t K, int64_t group, int64_t n0, int64_t n1) {
  SCOPED_TRACE(::testing::Message() << isa_name(isa) << " M=" << M << " N=" << N << " K=" << K << " group=" << group
                                    << " range=[" << n0 << "," << n1 << ")");
  Int4Weight w = make_int4(N, K, group, static_cast<uint32_t>(M * 131 + N * 7 + K + group));
  for (auto& s : w.scales)  // no huge scales here: the bound below is relative to sum |x w|
    if (std::fabs(bf16_to_f32(s)) > 1.0f) s = f32_to_bf16(0.25f);
  const int64_t ldx = K + 3, ldy = N + 5;
  const std::vector<float> x = make_x(M, ldx, static_cast<uint32_t>(K));
  constexpr float kSentinel = -12345.0f;
  std::vector<float> y(static_cast<size_t>(M * ldy), kSentinel);
  linear(isa, x.data(), M, ldx, w.view, n0, n1, y.data(), ldy);
  for (int64_t m = 0; m < M; ++m) {
    const std::vector<double> xm = as_multiplied(isa, x.data() + m * ldx, K);
    for (int64_t n = 0; n < ldy; ++n) {
      const float got = y[m * ldy + n];
      if (n < n0 || n >= n1) {
        ASSERT_EQ(got, kSentinel) << "wrote outside the range at m=" << m << " n=" << n;
        continue;
      }
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = xm[static_cast<size_t>(k)] * weight_at(w.view, n, k);
        ref += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(got, ref, 2.0 * (K + 4) * std::numeric_limits<float>::epsilon() * mag + 1e-30) << "m=" << m << " n=" << n;
    }
  }
}

TEST_P(Int4Isa, MatchesTheReferenceOnEveryShapeTokenCountAndGroupSize) {
  // K: one partial 128-column block (32, 96), whole blocks (128, 512), blocks and a tail (160, 1408 = 11 x 128,
  // 2080), long rows (7168).
  for (int64_t K : {32, 96, 128, 160, 512, 1408, 2080})
    for (int64_t g : {32, 64, 128, 256})
      if (K % g == 0) check_against_reference(isa(), 3, 13, K, g, 0, 13);
  for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33}) {
    check_against_reference(isa(), M, 23, 256, 32, 0, 23);
    check_against_reference(isa(), M, 11, 2048, 32, 1, 10);
  }
  check_against_reference(isa(), 2, 9, 7168, 32, 0, 9);
  check_against_reference(isa(), 1, 40, 512, 128, 7, 33);
}

// x = 127 e_k for every column k: y[k, n] is 127 w[n, k] alone, plus zeros, so every decoded weight of every
// column position (all 8 fields, every block, the tail) must be weight_at()'s value exactly, subnormal, huge
// and negative scales included. (127 is exact in bf16 and the int8 quantization takes it as 127 * 1; 127 w
// is exact in fp32.)
TEST_P(Int4Isa, DecodesEveryColumnExactly) {
  for (int64_t K : {160, 192, 320, 512})
    for (int64_t g : {32, 64, 128, 256}) {
      if (K % g != 0) continue;
      const Int4Weight w = make_int4(9, K, g, static_cast<uint32_t>(K + g));
      std::vector<float> x(static_cast<size_t>(K * K), 0.0f);
      for (int64_t k = 0; k < K; ++k) x[static_cast<size_t>(k * K + k)] = 127.0f;
      std::vector<float> y(static_cast<size_t>(K * 9));
      linear(isa(), x.data(), K, K, w.view, 0, 9, y.data(), 9);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < 9; ++n)
          ASSERT_EQ(y[static_cast<size_t>(k * 9 + n)], 127.0f * weight_at(w.view, n, k)) << "K=" << K << " g=" << g << " k=" << k << " n=" << n;
    }
}

// The bits of y[m, n] depend only on x row m and W row n: any token count, range, or neighbour.
TEST_P(Int4Isa, RowBitsDoNotDependOnBatchRangeOrNeighbours) {
  for (int64_t K : {96, 2048}) {
    const int64_t N = 29, M = 19;
    const Int4Weight w = make_int4(N, K, 32, static_cast<uint32_t>(K));
    const std::vector<float> x = make_x(M, K, 9);
    std::vector<float> all(static_cast<size_t>(M * N));
    linear(isa(), x.data(), M, K, w.view, 0, N, all.data(), N);
    for (int64_t m = 0; m < M; m += 3)
      for (int64_t mc : {int64_t{1}, int64_t{2}, int64_t{5}}) {
        if (m + mc > M) continue;
        for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {3, 4}, {5, 17}, {10, N}})
          ASSERT_NO_FATAL_FAILURE(testing_util::expect_part_is_full(isa(), x, K, w.view, all, N, m, mc, n0, n1))
              << "K=" << K;
      }
  }
}

TEST_P(Int4Isa, GateUpSiluIsLinearLinearSiluMulBitwise) {
  const int64_t H = 256, I = 96;
  const Int4Weight gate = make_int4(I, H, 32, 1), up = make_int4(I, H, 32, 2);
  for (int64_t M : {1, 4, 9, 40}) {
    const std::vector<float> x = make_x(M, H, 4);
    std::vector<float> g(static_cast<size_t>(M * I)), u(g.size()), want(g.size()), got(g.size());
    linear(isa(), x.data(), M, H, gate.view, 0, I, g.data(), I);
    linear(isa(), x.data(), M, H, up.view, 0, I, u.data(), I);
    for (int64_t m = 0; m < M; ++m) silu_mul(isa(), g.data() + m * I, u.data() + m * I, want.data() + m * I, I);
    gate_up_silu(isa(), x.data(), M, H, gate.view, up.view, 0, I, got.data(), I);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "M=" << M;
  }
}

// A NaN scale poisons its group's row on every path; an inf scale gives a non-finite row.
TEST_P(Int4Isa, NonFiniteScalesReachTheirRowsOnly) {
  Int4Weight w = make_int4(8, 256, 32, 5);
  for (auto& s : w.scales) s = f32_to_bf16(0.01f);
  w.scales[3 * 8 + 2] = 0x7fc0;  // row 3, group 2: NaN
  w.scales[6 * 8 + 7] = 0x7f80;  // row 6, last group: +inf
  const std::vector<float> x = make_x(2, 256, 1);
  std::vector<float> y(16);
  linear(isa(), x.data(), 2, 256, w.view, 0, 8, y.data(), 8);
  for (int64_t m = 0; m < 2; ++m)
    for (int64_t n = 0; n < 8; ++n) {
      const float v = y[static_cast<size_t>(m * 8 + n)];
      if (n == 3) EXPECT_TRUE(std::isnan(v)) << m;
      else if (n == 6) EXPECT_FALSE(std::isfinite(v)) << m;
      else EXPECT_TRUE(std::isfinite(v)) << m << " " << n;
    }
}

// The bf16-dot path is really a different path from the exact one (some bits differ), and agrees with it
// within x's rounding.
TEST_P(Int4Isa, Bf16DotPathStaysWithinItsBoundOfTheExactPath) {
  if (isa() != Isa::kAvx512Bf16) GTEST_SKIP() << "only for avx512bf16";
  const int64_t M = 9, N = 21, K = 2048;
  Int4Weight w = make_int4(N, K, 32, 11);
  for (auto& s : w.scales)
    if (std::fabs(bf16_to_f32(s)) > 1.0f) s = f32_to_bf16(0.25f);
  const std::vector<float> x = make_x(M, K, 12);
  std::vector<float> dot(static_cast<size_t>(M * N)), exact(dot.size());
  linear(isa(), x.data(), M, K, w.view, 0, N, dot.data(), N);
  linear(Isa::kAvx512, x.data(), M, K, w.view, 0, N, exact.data(), N);
  EXPECT_NE(std::memcmp(dot.data(), exact.data(), dot.size() * sizeof(float)), 0);
  double err = 0, norm = 0;
  for (size_t i = 0; i < dot.size(); ++i) {
    err += std::fabs(dot[i] - exact[i]);
    norm += std::fabs(exact[i]);
  }
  EXPECT_LT(err / norm, 1e-2);
}

// A NaN or an infinity in x reaches that token's outputs on every path (the int8 quantization gives its
// 32 columns a NaN scale), and no other token's.
TEST_P(Int4Isa, NonFiniteXReachesItsTokenOnly) {
  const Int4Weight w = make_int4(6, 256, 32, 8);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = make_x(3, 256, 2);
    x[1 * 256 + 77] = bad;
    std::vector<float> y(18);
    linear(isa(), x.data(), 3, 256, w.view, 0, 6, y.data(), 6);
    for (int64_t m = 0; m < 3; ++m)
      for (int64_t n = 0; n < 6; ++n)
        EXPECT_EQ(std::isfinite(y[static_cast<size_t>(m * 6 + n)]), m != 1) << bad << " m=" << m << " n=" << n;
  }
}

// The int8 path is really a different path from the exact AVX2 one (some bits differ), agrees with it within
// x's quantization, and for other weight types is the exact AVX2 path.
TEST_P(Int4Isa, Int8PathStaysWithinItsBoundOfTheExactPath) {
  if (isa() != Isa::kAvx2Int8) GTEST_SKIP() << "only for avx2int8";
  const int64_t M = 9, N = 21, K = 2048;
  Int4Weight w = make_int4(N, K, 32, 11);
  for (auto& s : w.scales)
    if (std::fabs(bf16_to_f32(s)) > 1.0f) s = f32_to_bf16(0.25f);
  const std::vector<float> x = make_x(M, K, 12);
  std::vector<float> q8(static_cast<size_t>(M * N)), exact(q8.size());
  linear(isa(), x.data(), M, K, w.view, 0, N, q8.data(), N);
  linear(Isa::kAvx2, x.data(), M, K, w.view, 0, N, exact.data(), N);
  EXPECT_NE(std::memcmp(q8.data(), exact.data(), q8.size() * sizeof(float)), 0);
  double err = 0, norm = 0;
  for (size_t i = 0; i < q8.size(); ++i) {
    err += std::fabs(q8[i] - exact[i]);
    norm += std::fabs(exact[i]);
  }
  EXPECT_LT(err / norm, 1e-2);
  std::vector<uint16_t> bf16(static_cast<size_t>(N * K), f32_to_bf16(0.5f));
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32_to_bf16(static_cast<float>(i % 13) * 0.01f - 0.06f);
  const WeightView b{.dtype = DType::kBF16, .data = bf16.data(), .rows = N, .cols = K};
  linear(isa(), x.data(), M, K, b, 0, N, q8.data(), N);
  linear(Isa::kAvx2, x.data(), M, K, b, 0, N, exact.data(), N);
  EXPECT_EQ(std::memcmp(q8.data(), exact.data(), q8.size() * sizeof(float)), 0);
}

// avx2int8's VNNI build (vpdpbusd) gives the plain build's bits: every token count of the kernel's blocking,
// a half block at the end of each row, rows left over by the runs, and a NaN in x.
// Reports name the VNNI build exactly where linear() picks it, and the AVX-512 ISAs name no build.
TEST(Int4Int8Vnni, IsNamedWhereItRuns) {
  const CpuFeatures& f = cpu_features();
  const bool vnni = isa_supported(Isa::kAvx2Int8) && f.avx512f && f.avx512vl && f.avx512vnni;
  EXPECT_EQ(isa_build(Isa::kAvx2Int8).find("vpdpbusd, two rows per 512-bit vector") != std::string::npos, vnni);
  for (const Isa isa : {Isa::kScalar, Isa::kAvx512, Isa::kAvx512Bf16}) EXPECT_TRUE(isa_build(isa).empty());
}

TEST(Int4Int8Vnni, GivesThePlainBuildsBits) {
  const CpuFeatures& f = cpu_features();
  if (!(f.avx2 && f.fma && f.avx512f && f.avx512vl && f.avx512vnni)) GTEST_SKIP() << "no AVX512-VNNI here";
  for (const int64_t K : {int64_t{96}, int64_t{2048}})
    for (const int64_t M : {1, 2, 3, 4, 5, 8, 9}) {
      const int64_t N = 23;
      const Int4Weight w = make_int4(N, K, 32, 21 + M);
      std::vector<float> x = make_x(M, K, 22 + M);
      if (M == 5) x[static_cast<size_t>(3 * K + 7)] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> plain(static_cast<size_t>(M * N)), vnni(plain.size(), 1.0f);
      detail::linear_int4_avx2int8(x.data(), M, K, w.view, 0, N, plain.data(), N);
      detail::linear_int4_avx2int8_vnni(x.data(), M, K, w.view, 0, N, vnni.data(), N);
      EXPECT_EQ(std::memcmp(plain.data(), vnni.data(), plain.size() * sizeof(float)), 0) << "K=" << K << " M=" << M;
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Int4Isa,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAvx2Int8),
                         [](const ::testing::TestParamInfo<Isa>& p) { return std::string(isa_name(p.param)); });

}  // namespace
}  // namespace moe
