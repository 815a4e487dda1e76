// Shared by the kernel tests: seeded activations, the row-bits comparison, and a fixture that runs a test
// on every ISA this CPU has (the ISA is an argument of every kernel call).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

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
