// "router": fp32 logits [T, E] = x W_router^T, with fp32 activations on every kernel path (linear_exact).
#include "kernels/linear.h"
#include "layer/ops/ops.h"

namespace moe::ops {

namespace {
// 32 tokens per call, as in shared_ops.cpp (one worker, Qwen3-Next at 128 tokens: 1.54-1.63 -> 1.40-1.46 ms
// against 16).
constexpr int64_t kTokensPerTile = 32;
}

rt::Op make_router_op(const Context& c) {
  const Isa isa = c.isa;
  const int64_t t = c.tokens, h = c.config->hidden, e = c.config->num_experts;
  const Grid grid = make_grid((t + kTokensPerTile - 1) / kTokensPerTile, kTokensPerTile, t, e, c.num_workers);
  const WeightView w = c.weights->router;
  const float* x = c.x;
  float* logits = c.routed.logits;
  rt::Op op{.name = "router", .num_tiles = grid.num_tiles()};
  op.tile = [=](int tile) {
    const Grid::Cell cell = grid.cell(tile);
    if (cell.r0 >= cell.r1) return;
    linear_exact(isa, x + cell.r0 * h, cell.r1 - cell.r0, h, w, cell.c0, cell.c1, logits + cell.r0 * e, e);
  };
  op.accesses = {rt::reads(x, static_cast<size_t>(t * h) * 4), rt::writes(logits, static_cast<size_t>(t * e) * 4)};
  return op;
}

}  // namespace moe::ops
