// Shared by the kernel tests: seeded activations, and a fixture that runs a test on every ISA this CPU has
// (the ISA is an argument of every kernel call).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/linear.h"

namespace moe::testing_util {

// M rows of ldx standard-normal floats from `seed`.
inline std::vector<float> make_x(int64_t M, int64_t ldx, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * ldx));
  for (auto& v : x) v = nd(rng);
  return x;
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
