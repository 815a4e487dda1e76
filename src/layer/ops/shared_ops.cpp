// The shared expert's operations (run on the side stream under dual/phased):
//   "shared_gate"     gate[t] = sigmoid(x_t . w_shared_gate) (Qwen only)
//   "shared.gate_up"  g = x gate_proj^T, u = x up_proj^T   [T, Is] each
//   "shared.act"      h = silu(g) * u
//   "shared.down"     out = h down_proj^T                   [T, H]
//   "shared"          the fused schedule's: gate_up with act on each cell (bitwise the same h) chained with
//                     down per token tile (row_chain.h), one operation
// The gate scaling is applied by "sum", so every schedule runs the same arithmetic. Names stay within
// std::string's 15 in-place characters, so building an operation allocates nothing.
#include <algorithm>

#include "kernels/linear.h"
#include "layer/ops/ops.h"
#include "layer/ops/row_chain.h"

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
// What the gate_up and down tiles read and write: the weights by pointer, so that a tile (and the chained
// operation's, two grids more) stays within SmallFunction's in-place buffer (a tile stored on the heap
// costs an allocation per call; test_layer_alloc).
struct SharedArgs {
  Isa isa;
  int64_t h, is;
  const ExpertWeights* w;
  const float* x;
  SharedBuffers b;
};

SharedArgs shared_args(const Context& c) {
  return {c.isa, c.config->hidden, c.config->shared_intermediate, &c.weights->shared, c.x, c.shared};
}

// g and u of a cell of the [T, Is] grid.
void gate_up_cell(const SharedArgs& a, const Grid& grid, int tile) {
  const Grid::Cell cell = grid.cell(tile);
  if (cell.r0 >= cell.r1) return;
  const float* xr = a.x + cell.r0 * a.h;
  linear(a.isa, xr, cell.r1 - cell.r0, a.h, a.w->gate, cell.c0, cell.c1, a.b.g + cell.r0 * a.is, a.is);
  linear(a.isa, xr, cell.r1 - cell.r0, a.h, a.w->up, cell.c0, cell.c1, a.b.u + cell.r0 * a.is, a.is);
}

// h = silu(g) * u of a cell through gate_up_silu: the same bits as gate_up_cell followed by "act".
void swiglu_cell(const SharedArgs& a, const Grid& grid, int tile) {
  const Grid::Cell cell = grid.cell(tile);
  if (cell.r0 >= cell.r1) return;
  gate_up_silu(a.isa, a.x + cell.r0 * a.h, cell.r1 - cell.r0, a.h, a.w->gate, a.w->up, cell.c0, cell.c1,
               a.b.h + cell.r0 * a.is, a.is);
}

// out = h down_proj^T of a cell of the [T, H] grid.
void down_cell(const SharedArgs& a, const Grid& grid, int tile) {
  const Grid::Cell cell = grid.cell(tile);
  if (cell.r0 >= cell.r1) return;
  linear(a.isa, a.b.h + cell.r0 * a.is, cell.r1 - cell.r0, a.is, a.w->down, cell.c0, cell.c1,
         a.b.out + cell.r0 * a.h, a.h);
}

size_t rows_bytes(const Context& c, int64_t cols) { return static_cast<size_t>(c.tokens * cols) * 4; }
}  // namespace

int64_t shared_chain_counters(const MoeConfig& config, int64_t tokens) {
  return config.has_shared_expert() ? 2 * ((tokens + kTokensPerTile - 1) / kTokensPerTile) : 0;
}

SharedChainReset shared_chain_reset(const Context& c) {
  return {c.routed.shared_progress, shared_chain_counters(*c.config, c.tokens)};
}

rt::Op make_shared_gate_up_op(const Context& c) {
  const SharedArgs a = shared_args(c);
  const Grid grid = token_grid(c, a.is);
  rt::Op op{.name = "shared.gate_up", .num_tiles = grid.num_tiles()};
  op.tile = [a, grid](int tile) { gate_up_cell(a, grid, tile); };
  op.accesses = {rt::reads(a.x, rows_bytes(c, a.h)), rt::writes(a.b.g, rows_bytes(c, a.is)),
                 rt::writes(a.b.u, rows_bytes(c, a.is))};
  return op;
}

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
  const SharedArgs a = shared_args(c);
  const Grid grid = token_grid(c, a.h);
  rt::Op op{.name = "shared.down", .num_tiles = grid.num_tiles()};
  op.tile = [a, grid](int tile) { down_cell(a, grid, tile); };
  op.accesses = {rt::reads(a.b.h, rows_bytes(c, a.is)), rt::writes(a.b.out, rows_bytes(c, a.h))};
  return op;
}

rt::Op make_shared_chain_op(const Context& c, int* first_tiles) {
  const SharedArgs a = shared_args(c);
  const Grid swiglu = token_grid(c, a.is), down = token_grid(c, a.h);
  const RowChain chain{.row_tiles = swiglu.num_row_blocks, .first_cells = swiglu.num_col_blocks,
                       .second_cells = down.num_col_blocks, .progress = c.routed.shared_progress};
  if (first_tiles != nullptr) *first_tiles = chain.first_tiles();
  rt::Op op{.name = "shared", .num_tiles = chain.num_tiles()};
  op.tile = [a, swiglu, down, chain](int tile) {
    chain.run(tile, [&](int t) { swiglu_cell(a, swiglu, t); }, [&](int t) { down_cell(a, down, t); });
  };
  // h is written and read back inside the operation: declared as written (which orders it as a read too).
  op.accesses = {rt::reads(a.x, rows_bytes(c, a.h)), rt::writes(a.b.h, rows_bytes(c, a.is)),
                 rt::writes(a.b.out, rows_bytes(c, a.h)),
                 rt::updates(chain.progress, static_cast<size_t>(chain.row_tiles) * 2 * 4)};
  return op;
}

}  // namespace moe::ops
