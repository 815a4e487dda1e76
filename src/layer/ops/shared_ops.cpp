// The shared expert's operations (run on the side stream under dual/phased):
//   "shared_gate"     gate[t] = sigmoid(x_t . w_shared_gate) (Qwen only)
//   "shared.gate_up"  g = x gate_proj^T, u = x up_proj^T   [T, Is] each
//   "shared.act"      h = silu(g) * u
//   "shared.down"     out = h down_proj^T                   [T, H]
//   "shared.swiglu"   gate_up and act in one (the fused schedule), bitwise the same h
// The gate scaling is applied by "sum", so every schedule runs the same arithmetic. Names stay within
// std::string's 15 in-place characters, so building an operation allocates nothing.
#include <algorithm>

#include "kernels/linear.h"
#include "layer/ops/ops.h"

namespace moe::ops {

namespace {
// 32 tokens per call: the matrix's conversion to fp32 panels and its reads from cache are shared by twice
// as many tokens as with 16 (one worker, Qwen3-Next at 128 tokens: gate_up + down 4.9-5.0 -> 4.4-4.6 ms).
constexpr int64_t kTokensPerTile = 32;
constexpr int64_t kActChunk = 4096;  // elements per "act" tile

Grid token_grid(const Context& c, int64_t cols) {
  return make_grid((c.tokens + kTokensPerTile - 1) / kTokensPerTile, kTokensPerTile, c.tokens, cols, c.num_workers);
}
}  // namespace

rt::Op make_shared_gate_op(const Context& c) {
  const Isa isa = c.isa;
  const int64_t t = c.tokens, h = c.config->hidden;
  const WeightView w = c.weights->shared_gate;
  const float* x = c.x;
  float* gate = c.shared.gate;
  rt::Op op{.name = "shared_gate", .num_tiles = static_cast<int>((t + kTokensPerTile - 1) / kTokensPerTile)};
  op.tile = [=](int tile) {
    const int64_t t0 = tile * kTokensPerTile, t1 = std::min(t0 + kTokensPerTile, t);
    linear_exact(isa, x + t0 * h, t1 - t0, h, w, 0, 1, gate + t0, 1);
    for (int64_t i = t0; i < t1; ++i) gate[i] = sigmoid(gate[i]);
  };
  op.accesses = {rt::reads(x, static_cast<size_t>(t * h) * 4), rt::writes(gate, static_cast<size_t>(t) * 4)};
  return op;
}

namespace {
// g and u (act = false), or h = silu(g) * u per tile through gate_up_silu (act = true): the same bits.
rt::Op shared_gate_up(const Context& c, bool act) {
  const Isa isa = c.isa;
  const int64_t t = c.tokens, h = c.config->hidden, is = c.config->shared_intermediate;
  const Grid grid = token_grid(c, is);
  // The gate and up views, not the whole ExpertWeights: the tile must stay within SmallFunction's
  // in-place buffer (a tile stored on the heap costs an allocation per call; test_layer_alloc).
  const WeightView gate = c.weights->shared.gate, up = c.weights->shared.up;
  const float* x = c.x;
  const SharedBuffers b = c.shared;
  rt::Op op{.name = act ? "shared.swiglu" : "shared.gate_up", .num_tiles = grid.num_tiles()};
  op.tile = [=](int tile) {
    const Grid::Cell cell = grid.cell(tile);
    if (cell.r0 >= cell.r1) return;
    const float* xr = x + cell.r0 * h;
    if (act) {
      gate_up_silu(isa, xr, cell.r1 - cell.r0, h, gate, up, cell.c0, cell.c1, b.h + cell.r0 * is, is);
      return;
    }
    linear(isa, xr, cell.r1 - cell.r0, h, gate, cell.c0, cell.c1, b.g + cell.r0 * is, is);
    linear(isa, xr, cell.r1 - cell.r0, h, up, cell.c0, cell.c1, b.u + cell.r0 * is, is);
  };
  const size_t hidden_bytes = static_cast<size_t>(t * is) * 4;
  op.accesses = {rt::reads(x, static_cast<size_t>(t * h) * 4)};
  if (act) {
    op.accesses.push_back(rt::writes(b.h, hidden_bytes));
  } else {
    op.accesses.push_back(rt::writes(b.g, hidden_bytes));
    op.accesses.push_back(rt::writes(b.u, hidden_bytes));
  }
  return op;
}
}  // namespace

rt::Op make_shared_gate_up_op(const Context& c) { return shared_gate_up(c, false); }
rt::Op make_shared_gate_up_act_op(const Context& c) { return shared_gate_up(c, true); }

rt::Op make_shared_act_op(const Context& c) {
  const Isa isa = c.isa;
  const int64_t n = c.tokens * c.config->shared_intermediate;
  const SharedBuffers b = c.shared;
  rt::Op op{.name = "shared.act", .num_tiles = static_cast<int>((n + kActChunk - 1) / kActChunk)};
  op.tile = [=](int tile) {
    const int64_t i0 = tile * kActChunk, i1 = std::min(i0 + kActChunk, n);
    silu_mul(isa, b.g + i0, b.u + i0, b.h + i0, i1 - i0);
  };
  op.accesses = {rt::reads(b.g, static_cast<size_t>(n) * 4), rt::reads(b.u, static_cast<size_t>(n) * 4),
                 rt::writes(b.h, static_cast<size_t>(n) * 4)};
  return op;
}

rt::Op make_shared_down_op(const Context& c) {
  const Isa isa = c.isa;
  const int64_t t = c.tokens, h = c.config->hidden, is = c.config->shared_intermediate;
  const Grid grid = token_grid(c, h);
  const WeightView w = c.weights->shared.down;
  const SharedBuffers b = c.shared;
  rt::Op op{.name = "shared.down", .num_tiles = grid.num_tiles()};
  op.tile = [=](int tile) {
    const Grid::Cell cell = grid.cell(tile);
    if (cell.r0 >= cell.r1) return;
    linear(isa, b.h + cell.r0 * is, cell.r1 - cell.r0, is, w, cell.c0, cell.c1, b.out + cell.r0 * h, h);
  };
  op.accesses = {rt::reads(b.h, static_cast<size_t>(t * is) * 4), rt::writes(b.out, static_cast<size_t>(t * h) * 4)};
  return op;
}

}  // namespace moe::ops
