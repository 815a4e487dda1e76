// The layer on int4 routed experts (compressed-tensors pack-quantized): the fp64 reference reads the int4
// weights as weight_at() dequantizes them, and on every compiled ISA every schedule (serial, dual, phased,
// fused, auto through a tuning table), eager and replayed as a graph, on 1 and 2 workers, gives the bits of
// serial on 1 worker, which agrees with the reference within the tolerance of `check` (1e-2 on avx512bf16,
// 3e-2 on avx2int8: they approximate x).
// Configurations: qwen3_next (gated bf16 shared expert), deepseek_v3 (expert groups, bf16 shared expert) and
// kimi_k2 (int4 shared expert), at tiny sizes and at real ones (H >= 512, several 128-column blocks and a
// partial one along the intermediate dimension).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "check/reference.h"
#include "check/tiny_configs.h"
#include "kernels/linear.h"
#include "layer/moe_layer.h"
#include "layer_test_inputs.h"
#include "model/host_buffer.h"

namespace moe {
namespace {

constexpr int64_t kMaxTokens = 17;
constexpr int64_t kTokenCounts[] = {1, 3, kMaxTokens};
constexpr Schedule kEverySchedule[] = {Schedule::kSerial, Schedule::kDual, Schedule::kPhased, Schedule::kFused,
                                       Schedule::kAuto};

rt::Device& device(int workers) {
  static std::map<int, std::unique_ptr<rt::Device>> devices;
  auto& d = devices[workers];
  if (!d) d = rt::make_cpu_device({.num_workers = workers});
  return *d;
}

struct Case {
  std::string name;
  MoeConfig config;
  Isa isa;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " " << isa_name(c.isa); }

MoeConfig resized(const std::string& tiny_name, int64_t h, int64_t i, int64_t is) {
  for (const TinyConfig& t : tiny_int4_configs())
    if (t.name == tiny_name) {
      MoeConfig c = t.config;
      c.hidden = h;
      c.moe_intermediate = i;
      c.shared_intermediate = is;
      return c;
    }
  throw std::logic_error("no tiny int4 config " + tiny_name);
}

std::vector<Case> every_case() {
  std::vector<std::pair<std::string, MoeConfig>> configs;
  for (const TinyConfig& t : tiny_int4_configs()) configs.push_back({t.name, t.config});
  configs.push_back({"qwen3_next_int4_real", resized("qwen3_next_int4", 640, 192, 320)});
  configs.push_back({"kimi_k2_int4_shared_real", resized("kimi_k2_int4_shared", 576, 192, 192)});
  std::vector<Case> v;
  for (const auto& [name, c] : configs)
    for (Isa isa : {Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAvx2, Isa::kAvx2Int8, Isa::kScalar}) {
      if (isa == Isa::kScalar && c.hidden > 256) continue;  // the scalar path at real sizes: minutes
      v.push_back({name, c, isa});
    }
  return v;
}

class LayerInt4 : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam().isa)) GTEST_SKIP() << isa_name(GetParam().isa) << " not available here";
  }
};

LayerOptions options(Isa isa) {
  // auto: phased at 1 token, fused at 2..7, dual from 8.
  return {.max_tokens = kMaxTokens,
          .policy = OverlapPolicy::always(),
          .isa = isa,
          .tuning = {{{1, Schedule::kPhased}, {2, Schedule::kFused}, {8, Schedule::kDual}}}};
}

std::vector<float> run(MoeLayer& layer, const std::vector<float>& x, int64_t tokens, Schedule s, bool graph) {
  std::vector<float> y(static_cast<size_t>(tokens * layer.config().hidden), -7.0f);
  if (graph) {
    const LayerGraph g = layer.capture(x.data(), tokens, y.data(), {.schedule = s});
    layer.replay(g, x.data(), tokens, y.data());
  } else {
    layer.forward(x.data(), tokens, y.data(), {.schedule = s});
  }
  rt::current_stream(layer.device()).synchronize();
  return y;
}

TEST(LayerInt4Setup, ConfigsCoverBothSharedExpertDtypesAndGroups) {
  bool bf16_shared = false, int4_shared = false, groups = false, gated = false;
  for (const TinyConfig& t : tiny_int4_configs()) {
    EXPECT_TRUE(t.config.int4) << t.name;
    EXPECT_NO_THROW(t.config.validate()) << t.name;
    bf16_shared |= t.config.has_shared_expert() && !t.config.int4_shared;
    int4_shared |= t.config.int4_shared;
    groups |= t.config.n_group > 1;
    gated |= t.config.shared_expert_gate;
    const LayerWeights w = make_random_weights(t.config, {.dtype = DType::kInt4, .seed = 5});
    EXPECT_EQ(w.experts[0].gate.dtype, DType::kInt4) << t.name;
    EXPECT_EQ(w.shared.gate.dtype, t.config.int4_shared ? DType::kInt4 : DType::kBF16) << t.name;
    EXPECT_EQ(w.router.dtype, DType::kBF16) << t.name;
  }
  EXPECT_TRUE(bf16_shared && int4_shared && groups && gated);
}

// The reference of int4 weights is the reference of their dequantized fp32 copies, bit for bit.
TEST(LayerInt4Setup, ReferenceDequantizesInt4AsWeightAt) {
  for (const TinyConfig& t : tiny_int4_configs()) {
    const LayerWeights w = make_random_weights(t.config, {.dtype = DType::kInt4, .seed = 5});
    LayerWeights f;
    f.router = w.router;
    f.correction_bias = w.correction_bias;
    f.shared_gate = w.shared_gate;
    const auto to_f32 = [&](const WeightView& v) {
      auto buf = std::make_shared<HostBuffer>(static_cast<size_t>(v.rows * v.cols) * 4);
      for (int64_t r = 0; r < v.rows; ++r)
        for (int64_t c = 0; c < v.cols; ++c) buf->as<float>()[r * v.cols + c] = weight_at(v, r, c);
      f.storage.emplace_back(buf);
      return WeightView{.dtype = DType::kF32, .data = buf->data(), .rows = v.rows, .cols = v.cols};
    };
    for (const ExpertWeights& e : w.experts) f.experts.push_back({to_f32(e.gate), to_f32(e.up), to_f32(e.down)});
    if (t.config.has_shared_expert()) f.shared = {to_f32(w.shared.gate), to_f32(w.shared.up), to_f32(w.shared.down)};
    const std::vector<float> x = random_input(5 * t.config.hidden, 3);
    const std::vector<double> a = reference_forward(t.config, w, x.data(), 5), b = reference_forward(t.config, f, x.data(), 5);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0) << t.name;
  }
}

TEST_P(LayerInt4, EveryScheduleAndModeGivesTheBitsOfSerialWhichMatchesTheReference) {
  const Case& k = GetParam();
  const MoeConfig& c = k.config;
  const LayerWeights w = make_random_weights(c, {.dtype = DType::kInt4, .seed = 5});
  std::vector<std::unique_ptr<MoeLayer>> layers;
  for (int workers : {1, 2}) layers.push_back(std::make_unique<MoeLayer>(c, w, device(workers), options(k.isa)));
  const std::vector<float> all = random_input(kMaxTokens * c.hidden, 77);
  std::vector<ReferenceRoute> routes;
  const std::vector<double> ref = reference_forward(c, w, all.data(), kMaxTokens, &routes);
  // x rounded to bf16 (avx512bf16, about 2^-9 per product) or quantized to int8 (avx2int8): the bounds check
  // allows such kernels.
  const double tol = quantizes_x_to_int8(k.isa, DType::kInt4) ? 3e-2
                     : rounds_x_to_bf16(k.isa, DType::kInt4)  ? 1e-2
                                                              : 1e-5 * std::max(1.0, std::sqrt(static_cast<double>(c.hidden) / 256.0));
  for (int64_t t : kTokenCounts) {
    const std::vector<float> x(all.begin(), all.begin() + t * c.hidden);
    const std::string at = k.name + " " + std::string(isa_name(k.isa)) + " tokens " + std::to_string(t);
    const std::vector<float> serial = run(*layers[0], x, t, Schedule::kSerial, false);
    double scale = 1e-30;
    for (int64_t i = 0; i < t * c.hidden; ++i) scale = std::max(scale, std::abs(ref[static_cast<size_t>(i)]));
    int64_t skipped = 0;
    for (int64_t m = 0; m < t; ++m) {
      const double margin = routes[static_cast<size_t>(m)].margin;
      if (margin != 0.0 && margin < 1e-5) {
        ++skipped;
        continue;
      }
      double err = 0.0;
      for (int64_t i = 0; i < c.hidden; ++i) {
        const size_t j = static_cast<size_t>(m * c.hidden + i);
        err = std::max(err, std::abs(static_cast<double>(serial[j]) - ref[j]));
      }
      EXPECT_LE(err, tol * scale) << at << " token " << m << " (error " << err / scale << " of the output scale)";
    }
    EXPECT_LE(skipped, t < 8 ? 1 : 2) << at << ": too many near-tie tokens skipped";
    for (auto& layer : layers)
      for (Schedule s : kEverySchedule)
        for (bool graph : {false, true}) {
          const std::vector<float> y = run(*layer, x, t, s, graph);
          EXPECT_EQ(std::memcmp(y.data(), serial.data(), y.size() * sizeof(float)), 0)
              << at << " " << schedule_name(s) << (graph ? " replayed" : " eager") << " on "
              << layer->device().num_workers() << " workers differs from serial on 1 worker";
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Int4, LayerInt4, ::testing::ValuesIn(every_case()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return p.param.name + "_" + std::string(isa_name(p.param.isa));
                         });

}  // namespace
}  // namespace moe
