// "experts": the routed experts' SwiGLU over the grouped rows, gate_up (with its act) and down, two grids
// chained by row tile (row_chain.h) in one operation.
//
// The grid is (row tile, column block) with row tiles sized for the worst case (max_row_tiles); each tile
// looks up its (expert, row0, row1) in the table dispatch wrote and returns at once past its end, so an
// expert that received nothing costs nothing and the tile count does not depend on the routing.
#include <algorithm>
#include <vector>

#include "kernels/linear.h"
#include "layer/dispatch.h"
#include "layer/ops/ops.h"
#include "layer/ops/row_chain.h"

namespace moe::ops {

namespace {

// What the experts' tiles read and write (smaller than RoutedBuffers, so that the chained operation's
// captures stay in place: rt::kTileInlineBytes).
struct ExpertsArgs {
  Isa isa;
  int64_t h, inter;
  const int32_t* row_tiles;
  const int32_t* num_row_tiles;
  const float* xg;
  float* hg;
  float* og;
  const std::vector<ExpertWeights>* experts;
};

ExpertsArgs experts_args(const Context& c) {
  const RoutedBuffers& b = c.routed;
  return {c.isa, c.config->hidden, c.config->moe_intermediate, b.row_tiles, b.num_row_tiles, b.xg, b.hg, b.og,
          &c.weights->experts};
}

struct RowTile {
  int32_t expert, r0, r1;
};

inline bool lookup(const ExpertsArgs& a, int64_t row_tile, RowTile* out) {
  if (row_tile >= *a.num_row_tiles) return false;
  const int32_t* e = a.row_tiles + 3 * row_tile;
  *out = {e[0], e[1], e[2]};
  return true;
}

void gate_up_cell(const ExpertsArgs& a, const Grid& grid, int tile) {
  const Grid::Cell cell = grid.cell(tile);
  RowTile t;
  if (!lookup(a, cell.row_block, &t)) return;
  const ExpertWeights& ew = (*a.experts)[static_cast<size_t>(t.expert)];
  gate_up_silu(a.isa, a.xg + t.r0 * a.h, t.r1 - t.r0, a.h, ew.gate, ew.up, cell.c0, cell.c1, a.hg + t.r0 * a.inter,
               a.inter);
}

void down_cell(const ExpertsArgs& a, const Grid& grid, int tile) {
  const Grid::Cell cell = grid.cell(tile);
  RowTile t;
  if (!lookup(a, cell.row_block, &t)) return;
  const ExpertWeights& ew = (*a.experts)[static_cast<size_t>(t.expert)];
  linear(a.isa, a.hg + t.r0 * a.inter, t.r1 - t.r0, a.inter, ew.down, cell.c0, cell.c1, a.og + t.r0 * a.h, a.h);
}

// The tile count must not depend on the routing (graphs replay it), but the column split should fit the
// work that will probably arrive: with one expert-parallel rank's share (E_l of E experts) only about
// pairs * E_l / E pairs are local, so a decode step may bring one or two busy experts; were the columns
// split for the worst case (every pair local), those few experts would be a tile or two each and one
// worker would do it all (measured: DeepSeek-V3 with 64 of 256 experts ran at 42-54% of the bandwidth).
Grid expert_grid(const Context& c, int64_t cols) {
  const int64_t pairs = c.expert_rows;
  const int64_t local = c.weights->num_local_experts();
  const int64_t row_tiles = max_row_tiles(pairs, local);
  const int64_t experts = std::max<int64_t>(c.config->num_experts, local);
  const int64_t local_pairs = (pairs * local + experts - 1) / experts;
  return make_grid(row_tiles, kExpertRowsPerTile, row_tiles * kExpertRowsPerTile, cols, c.num_workers,
                   max_row_tiles(local_pairs, local));
}

size_t max_rows_bytes(const Context& c, int64_t cols) { return static_cast<size_t>(c.expert_rows * cols) * 4; }

}  // namespace

rt::Op make_experts_op(const Context& c, int* first_tiles) {
  const ExpertsArgs a = experts_args(c);
  const Grid gate_up = expert_grid(c, a.inter), down = expert_grid(c, a.h);
  const RowChain chain{.row_tiles = gate_up.num_row_blocks, .first_cells = gate_up.num_col_blocks,
                       .second_cells = down.num_col_blocks, .rows_in_use = a.num_row_tiles,
                       .progress = c.routed.row_progress};
  if (first_tiles != nullptr) *first_tiles = chain.first_tiles();
  rt::Op op{.name = "experts", .num_tiles = chain.num_tiles()};
  op.tile = [a, gate_up, down, chain](int tile) {
    chain.run(tile, [&](int t) { gate_up_cell(a, gate_up, t); }, [&](int t) { down_cell(a, down, t); });
  };
  op.accesses.push_back(rt::reads(a.num_row_tiles, 4));
  op.accesses.push_back(rt::reads(a.row_tiles, static_cast<size_t>(chain.row_tiles * 3) * 4));
  op.accesses.push_back(rt::reads(a.xg, max_rows_bytes(c, a.h)));
  // hg is written and read back inside the operation: declared as written (which orders it as a read too).
  op.accesses.push_back(rt::writes(a.hg, max_rows_bytes(c, a.inter)));
  op.accesses.push_back(rt::writes(a.og, max_rows_bytes(c, a.h)));
  // The progress counters dispatch (or ep.group) zeroed.
  op.accesses.push_back(rt::updates(chain.progress, static_cast<size_t>(chain.row_tiles) * 2 * 4));
  return op;
}

}  // namespace moe::ops
