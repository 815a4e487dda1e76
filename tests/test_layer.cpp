// The layer's fast path against the fp64 reference (every family, f32 / bf16 / fp8 weights), and bitwise
// equality of every schedule and worker count with serial (token counts 0..512, edge routings, seeds).
//
// Tolerance: the reference reads the same weights (bf16 and fp8 as the exact fp32 values the kernels see), so
// for every weight dtype the only difference is fp32 vs fp64 arithmetic: max |y - ref| <= 1e-5 * max |ref|.
// Tokens whose reference routing has a near-tie (margin below 1e-5, but not an exact tie) may legitimately
// route differently in fp32 and are not compared; the tests assert that such tokens are rare.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "kernels/linear.h"
#include "layer/moe_layer.h"
#include "layer_test_inputs.h"
#include "check/reference.h"
#include "check/tiny_configs.h"

namespace moe {
namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

rt::Device& device(int workers) {
  static std::map<int, std::unique_ptr<rt::Device>> devices;
  auto& d = devices[workers];
  if (!d) d = rt::make_cpu_device({.num_workers = workers});
  return *d;
}

LayerOptions test_options(int64_t max_tokens = 512, Isa isa = best_isa()) {
  return {.max_tokens = max_tokens, .policy = OverlapPolicy::always(), .isa = isa};
}

std::vector<float> run(MoeLayer& layer, const std::vector<float>& x, int64_t tokens, Schedule s) {
  std::vector<float> y(static_cast<size_t>(tokens * layer.config().hidden), -7.0f);
  layer.forward(x.data(), tokens, y.data(), {.schedule = s});
  rt::current_stream(layer.device()).synchronize();
  return y;
}

// Compares y with the reference; returns how many tokens were skipped for a near-tie.
int64_t expect_close_to_reference(const MoeConfig& c, const LayerWeights& w, const std::vector<float>& x,
                                  int64_t tokens, const std::vector<float>& y, const std::string& what,
                                  double tolerance = 1e-5) {
  std::vector<ReferenceRoute> routes;
  const std::vector<double> ref = reference_forward(c, w, x.data(), tokens, &routes);
  double scale = 1e-30;
  for (double v : ref) scale = std::max(scale, std::abs(v));
  int64_t skipped = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const double m = routes[static_cast<size_t>(t)].margin;
    if (m != 0.0 && m < 1e-5) {
      ++skipped;
      continue;
    }
    double err = 0.0;
    for (int64_t i = 0; i < c.hidden; ++i)
      err = std::max(err, std::abs(static_cast<double>(y[static_cast<size_t>(t * c.hidden + i)]) -
                                   ref[static_cast<size_t>(t * c.hidden + i)]));
    EXPECT_LE(err, tolerance * scale) << what << " token " << t << " (output scale " << scale << ")";
  }
  return skipped;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  // memcmp of two empty vectors would pass null pointers (undefined, even for 0 bytes).
  EXPECT_TRUE(a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0) << what;
}

TEST(Layer, MatchesReferenceEveryFamilyAndDtype) {
  for (const TinyConfig& tc : tiny_configs()) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
      for (uint64_t seed : {1, 2}) {
        MoeConfig c = tc.config;
        c.fp8 = dtype == DType::kF8E4M3;
        const LayerWeights w = make_random_weights(c, {.dtype = dtype, .seed = seed});
        MoeLayer layer(c, w, device(2), test_options(64));
        const int64_t tokens = 33;
        const auto x = random_input(tokens * c.hidden, seed + 100);
        const auto y = run(layer, x, tokens, Schedule::kSerial);
        const std::string what = tc.name + " " + std::string(dtype_name(dtype)) + " seed " + std::to_string(seed);
        EXPECT_LE(expect_close_to_reference(c, w, x, tokens, y, what), 2) << what;
      }
    }
  }
}

TEST(Layer, ExpertParallelRankOutputsItsLocalExpertsOnly) {
  for (const TinyConfig& tc : tiny_configs()) {
    const MoeConfig& c = tc.config;
    const LayerWeights w = make_random_weights(c, {.dtype = DType::kBF16, .seed = 3, .num_local_experts = c.num_experts / 2});
    MoeLayer layer(c, w, device(2), test_options(64));
    const auto x = random_input(40 * c.hidden, 5);
    const auto serial = run(layer, x, 40, Schedule::kSerial);
    EXPECT_LE(expect_close_to_reference(c, w, x, 40, serial, tc.name + " half the experts"), 2);
    expect_bitwise(run(layer, x, 40, Schedule::kDual), serial, tc.name + " dual, half the experts");
    expect_bitwise(run(layer, x, 40, Schedule::kPhased), serial, tc.name + " phased, half the experts");
    expect_bitwise(run(layer, x, 40, Schedule::kFused), serial, tc.name + " fused, half the experts");
  }
}

std::vector<int64_t> token_counts() {
  if (kSanitized) return {0, 1, 3, 33, 100};
  return {0, 1, 2, 3, 7, 16, 33, 100, 256, 512};
}

// Every schedule on 1, 2 and 4 workers gives the bits of serial on 1 worker.
void expect_schedules_bitwise(const MoeConfig& c, const LayerWeights& w, const std::vector<float>& x, int64_t tokens,
                              std::vector<std::unique_ptr<MoeLayer>>& layers, const std::string& what) {
  const auto base = run(*layers[0], x, tokens, Schedule::kSerial);
  for (auto& layer : layers)
    for (Schedule s : kRunnableSchedules)
      expect_bitwise(run(*layer, x, tokens, s), base,
                     what + " tokens " + std::to_string(tokens) + " " + std::string(schedule_name(s)) + " on " +
                         std::to_string(layer->device().num_workers()) + " workers");
}

std::vector<std::unique_ptr<MoeLayer>> layers_on_every_device(const MoeConfig& c, const LayerWeights& w,
                                                             Isa isa = best_isa()) {
  std::vector<std::unique_ptr<MoeLayer>> layers;
  for (int workers : {1, 2, 4})
    layers.push_back(std::make_unique<MoeLayer>(c, w, device(workers), test_options(512, isa)));
  return layers;
}

TEST(Layer, SchedulesAndWorkerCountsAreBitwiseIdentical) {
  for (const TinyConfig& tc : tiny_configs()) {
    for (uint64_t seed : {11, 12}) {
      const LayerWeights w = make_random_weights(tc.config, {.dtype = DType::kBF16, .seed = seed});
      auto layers = layers_on_every_device(tc.config, w);
      for (int64_t tokens : token_counts()) {
        const auto x = random_input(tokens * tc.config.hidden, seed * 1000 + static_cast<uint64_t>(tokens));
        expect_schedules_bitwise(tc.config, w, x, tokens, layers, tc.name + " seed " + std::to_string(seed));
      }
    }
  }
}

// The opt-in bf16-dot kernels (expert matrices with x rounded to bf16; router and shared gate in fp32):
// every schedule and worker count still gives the bits of serial, and the output stays within that
// rounding of the fp64 reference (2^-9 relative per product, accumulated: 1e-2 of the output scale).
TEST(Layer, Bf16DotKernelsKeepTheScheduleContract) {
  if (!isa_supported(Isa::kAvx512Bf16)) GTEST_SKIP() << "no avx512_bf16 on this CPU";
  for (const TinyConfig& tc : tiny_configs()) {
    for (DType dtype : {DType::kBF16, DType::kF8E4M3}) {
      MoeConfig c = tc.config;
      c.fp8 = dtype == DType::kF8E4M3;
      const LayerWeights w = make_random_weights(c, {.dtype = dtype, .seed = 21});
      auto layers = layers_on_every_device(c, w, Isa::kAvx512Bf16);
      const std::string what = tc.name + " " + std::string(dtype_name(dtype)) + " avx512bf16";
      for (int64_t tokens : {1, 7, 33}) {
        const auto x = random_input(tokens * c.hidden, 500 + static_cast<uint64_t>(tokens));
        expect_schedules_bitwise(c, w, x, tokens, layers, what);
        const auto y = run(*layers[0], x, tokens, Schedule::kSerial);
        EXPECT_LE(expect_close_to_reference(c, w, x, tokens, y, what, 1e-2), 2) << what;
      }
    }
  }
}

// Router rows written by hand (f32 weights): the test owns the bytes make_random_weights allocated.
float* mutable_router(LayerWeights& w) { return static_cast<float*>(const_cast<void*>(w.router.data)); }

TEST(Layer, AllTokensToOneExpertAndEmptyExperts) {
  // Only expert 3's router row is non-zero and x > 0: every token puts expert 3 first, the other slots go to the
  // same few experts through exact ties (index ascending), the rest of the experts receive nothing.
  for (const TinyConfig& tc : tiny_configs()) {
    const MoeConfig& c = tc.config;
    LayerWeights w = make_random_weights(c, {.dtype = DType::kF32, .seed = 21});
    float* router = mutable_router(w);
    std::fill(router, router + c.num_experts * c.hidden, 0.0f);
    for (int64_t i = 0; i < c.hidden; ++i) router[3 * c.hidden + i] = 4.0f / static_cast<float>(c.hidden);
    auto layers = layers_on_every_device(c, w);
    for (int64_t tokens : {int64_t{1}, int64_t{100}, kSanitized ? int64_t{128} : int64_t{512}}) {
      const auto x = random_input(tokens * c.hidden, 7, 0.1f, 1.0f);
      const auto y = run(*layers[1], x, tokens, Schedule::kSerial);
      EXPECT_EQ(expect_close_to_reference(c, w, x, tokens, y, tc.name + " one expert"), 0);
      expect_schedules_bitwise(c, w, x, tokens, layers, tc.name + " one expert");
    }
  }
}

TEST(Layer, ExactScoreTiesFromDuplicateRouterRows) {
  for (const TinyConfig& tc : tiny_configs()) {
    const MoeConfig& c = tc.config;
    LayerWeights w = make_random_weights(c, {.dtype = DType::kF32, .seed = 31});
    float* router = mutable_router(w);
    // Experts 5 and 9 copy expert 2 (bias too): wherever one of them is chosen, the others tie exactly.
    for (int64_t dup : {5, 9}) {
      std::memcpy(router + dup * c.hidden, router + 2 * c.hidden, static_cast<size_t>(c.hidden) * sizeof(float));
      if (w.correction_bias != nullptr) const_cast<float*>(w.correction_bias)[dup] = w.correction_bias[2];
    }
    auto layers = layers_on_every_device(c, w);
    const int64_t tokens = 100;
    const auto x = random_input(tokens * c.hidden, 8);
    const auto y = run(*layers[1], x, tokens, Schedule::kSerial);
    EXPECT_LE(expect_close_to_reference(c, w, x, tokens, y, tc.name + " ties"), 2);
    expect_schedules_bitwise(c, w, x, tokens, layers, tc.name + " ties");
  }
}

TEST(Layer, ZeroTokensEnqueuesNothing) {
  const MoeConfig c = tiny_configs()[0].config;
  const LayerWeights w = make_random_weights(c, {.seed = 1});
  MoeLayer layer(c, w, device(2), test_options());
  device(2).set_tracing(true);
  layer.forward(nullptr, 0, nullptr, {});
  device(2).synchronize();
  EXPECT_TRUE(device(2).take_trace().ops.empty());
  device(2).set_tracing(false);
}

}  // namespace
}  // namespace moe
