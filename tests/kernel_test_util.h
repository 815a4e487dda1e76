// Shared by the kernel tests: seeded weights and activations, the row-bits comparison, and a fixture that
// runs a test on every ISA this CPU has (the ISA is an argument of every kernel call).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/linear.h"
#include "kernels/weight.h"

namespace moe::testing_util {

// M rows of ldx standard-normal floats from `seed`.
inline std::vector<float> make_x(int64_t M, int64_t ldx, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * ldx));
  for (auto& v : x) v = nd(rng);
  return x;
}

// A weight matrix with its storage; scale_inv covers [ceil(rows/128), ceil(cols/128)] blocks.
struct TestWeight {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> fp8;
  std::vector<float> scales;
  WeightView view;
};

inline TestWeight make_weight(DType dt, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  TestWeight t;
  t.view.dtype = dt;
  t.view.rows = rows;
  t.view.cols = cols;
  const size_t n = static_cast<size_t>(rows * cols);
  if (dt == DType::kF32) {
    for (size_t i = 0; i < n; ++i) t.f32.push_back(nd(rng));
    t.view.data = t.f32.data();
  } else if (dt == DType::kBF16) {
    for (size_t i = 0; i < n; ++i) t.bf16.push_back(f32_to_bf16(nd(rng)));
    t.view.data = t.bf16.data();
  } else {
    // Any code but NaN (see the special-value test). Zero and subnormal codes only in about a fifth of the
    // 128-column blocks of each row, as in a quantised checkpoint, where they are rare: the AVX-512 path
    // decodes those blocks another way than the rest, and a block of rows mixes both.
    std::uniform_int_distribution<int> code(0, 255);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) {
        int c = code(rng);
        if ((c & 0x7f) == 0x7f) c &= 0xfe;
        if ((c & 0x78) == 0 && (r * 7 + k / 128 * 3) % 5 != 0) c |= 0x08;
        t.fp8.push_back(static_cast<uint8_t>(c));
      }
    const int64_t nb = ((rows + 127) / 128) * ((cols + 127) / 128);
    std::uniform_real_distribution<float> us(1e-3f, 1e-1f);
    for (int64_t b = 0; b < nb; ++b) t.scales.push_back(us(rng));
    // A large scale, a tiny one, and (with 3 row blocks) one above 2^100, which takes the kernels' exact
    // slow path since scale * 2^8 is no longer safe.
    const int64_t col_blocks = (cols + 127) / 128;
    t.scales[0] = 300.0f;
    if (nb > 1) t.scales[nb - 1] = 3e-7f;
    if (rows > 256) t.scales[2 * col_blocks] = 2e30f;
    t.view.data = t.fp8.data();
    t.view.scale_inv = t.scales.data();
  }
  return t;
}

// Tokens [m0, m0 + cnt) of x (rows K apart) against rows [n0, n1) of w, in one call, give bit for bit
// those entries of `full`, the call on every token and row (N columns per token): the determinism contract.
inline void expect_part_is_full(Isa isa, const std::vector<float>& x, int64_t K, const WeightView& w,
                                const std::vector<float>& full, int64_t N, int64_t m0, int64_t cnt, int64_t n0,
                                int64_t n1) {
  std::vector<float> part(static_cast<size_t>(cnt * N), 0.0f);
  linear(isa, x.data() + m0 * K, cnt, K, w, n0, n1, part.data(), N);
  for (int64_t m = 0; m < cnt; ++m)
    ASSERT_EQ(0, std::memcmp(part.data() + m * N + n0, full.data() + (m0 + m) * N + n0,
                             static_cast<size_t>(n1 - n0) * sizeof(float)))
        << "m0=" << m0 << " cnt=" << cnt << " range=[" << n0 << "," << n1 << ")";
}

// Skips the ISAs this CPU (or build) lacks.
class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << " not available here";
  }
  Isa isa() const { return GetParam(); }
};

}  // namespace moe::testing_util
