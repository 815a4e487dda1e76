#include "layer_cost.h"

#include "kernels/linear.h"
#include "layer/routing.h"

namespace moe::tools {

namespace {

int64_t dense_bytes(const MoeConfig& c, const LayerWeights& w) {
  int64_t b = w.router.bytes() + w.shared.bytes() + (w.shared_gate.empty() ? 0 : w.shared_gate.bytes());
  if (w.correction_bias) b += c.num_experts * 4;
  return b;
}

double dense_flops(const MoeConfig& c, int64_t tokens) {
  const double t = static_cast<double>(tokens), h = static_cast<double>(c.hidden);
  return 2.0 * t * h * (static_cast<double>(c.num_experts) + 3.0 * static_cast<double>(c.shared_intermediate) +
                        (c.shared_expert_gate ? 1.0 : 0.0));
}

}  // namespace

ForwardCost forward_cost(const MoeConfig& c, const LayerWeights& w, const float* x, int64_t tokens) {
  ForwardCost cost;
  const int64_t e = c.num_experts, k = c.top_k;
  std::vector<float> logits(static_cast<size_t>(tokens * e));
  linear_exact(best_isa(), x, tokens, c.hidden, w.router, 0, e, logits.data(), e);  // as the router op
  std::vector<float> scratch(static_cast<size_t>(routing_scratch_floats(c)));
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::vector<float> weights(static_cast<size_t>(k));
  std::vector<char> active(static_cast<size_t>(w.num_local_experts()), 0);
  int64_t routed_rows = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    route_token(c, w.correction_bias, logits.data() + t * e, scratch.data(), ids.data(), weights.data());
    for (int32_t id : ids)
      if (id < w.num_local_experts()) {
        active[static_cast<size_t>(id)] = 1;
        ++routed_rows;
      }
  }
  cost.weight_bytes = tokens > 0 ? dense_bytes(c, w) : 0;
  for (int64_t i = 0; i < w.num_local_experts(); ++i)
    if (active[static_cast<size_t>(i)]) {
      cost.weight_bytes += w.experts[static_cast<size_t>(i)].bytes();
      ++cost.active_experts;
    }
  cost.flops = dense_flops(c, tokens) +
               2.0 * static_cast<double>(routed_rows) * 3.0 * static_cast<double>(c.hidden * c.moe_intermediate);
  return cost;
}

ForwardCost decode_token_cost(const MoeConfig& c, DType dtype) {
  // WeightView::bytes counts fp8 block scales and int4 group scales too.
  auto matrix = [&](DType d, int64_t rows, int64_t cols) {
    return WeightView{.dtype = d, .rows = rows, .cols = cols, .group_size = d == DType::kInt4 ? c.int4_group_size : 0}
        .bytes();
  };
  const int64_t router_bytes = c.num_experts * c.hidden * (dtype == DType::kF32 ? 4 : 2);  // never fp8 or int4
  // int4 quantizes the routed experts, and the shared expert only where int4_shared; otherwise it is bf16.
  const DType shared_dtype = dtype == DType::kInt4 && !c.int4_shared ? DType::kBF16 : dtype;
  const int64_t expert = 2 * matrix(dtype, c.moe_intermediate, c.hidden) + matrix(dtype, c.hidden, c.moe_intermediate);
  const int64_t shared = c.has_shared_expert() ? 2 * matrix(shared_dtype, c.shared_intermediate, c.hidden) +
                                                     matrix(shared_dtype, c.hidden, c.shared_intermediate)
                                               : 0;
  ForwardCost cost;
  cost.active_experts = c.top_k;
  cost.weight_bytes = router_bytes + c.top_k * expert + shared + (c.shared_expert_gate ? c.hidden * 2 : 0) +
                      (c.correction_bias ? c.num_experts * 4 : 0);
  cost.flops = dense_flops(c, 1) + 2.0 * 3.0 * static_cast<double>(c.top_k * c.hidden * c.moe_intermediate);
  return cost;
}

}  // namespace moe::tools
