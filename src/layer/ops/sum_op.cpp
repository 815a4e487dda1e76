// "sum": y = routed + gate * shared (Qwen), or routed + shared (DeepSeek/Kimi/GLM: ungated), after the join.
#include "kernels/linear.h"
#include "layer/ops/ops.h"

namespace moe::ops {

namespace {
constexpr int64_t kTokensPerTile = 16;
}

rt::Op make_sum_op(const Context& c) {
  const Isa isa = c.isa;
  const int64_t t = c.tokens, h = c.config->hidden;
  const Grid grid = make_grid((t + kTokensPerTile - 1) / kTokensPerTile, kTokensPerTile, t, h, c.num_workers);
  const float* routed = c.routed.routed;
  const float* shared = c.shared.out;
  const float* gate = c.config->shared_expert_gate ? c.shared.gate : nullptr;
  float* y = c.y;
  rt::Op op{.name = "sum", .num_tiles = grid.num_tiles()};
  op.tile = [=](int tile) {
    const Grid::Cell cell = grid.cell(tile);
    for (int64_t i = cell.r0; i < cell.r1; ++i) {
      const int64_t at = i * h + cell.c0;
      scale_add(isa, y + at, routed + at, shared + at, gate != nullptr ? gate[i] : 1.0f, cell.c1 - cell.c0);  // 1 * s == s
    }
  };
  const size_t n = static_cast<size_t>(t * h) * 4;
  op.accesses = {rt::reads(routed, n), rt::reads(shared, n), rt::writes(y, n)};
  if (gate != nullptr) op.accesses.push_back(rt::reads(gate, static_cast<size_t>(t) * 4));
  return op;
}

}  // namespace moe::ops
