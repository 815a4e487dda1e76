// "experts.gate_up" and "experts.down": the routed experts' SwiGLU over the grouped rows.
//
// The grid is (row tile, column block) with row tiles sized for the worst case (max_row_tiles); each tile
// looks up its (expert, row0, row1) in the table dispatch wrote and returns at once past its end, so an
// expert that received nothing costs nothing and the tile count does not depend on the routing.
#include <algorithm>

#include "kernels/linear.h"
#include "layer/dispatch.h"
#include "layer/ops/ops.h"

namespace moe::ops {

namespace {

struct RowTile {
  int32_t expert, r0, r1;
};

inline bool lookup(const RoutedBuffers& b, int64_t row_tile, RowTile* out) {
  if (row_tile >= *b.num_row_tiles) return false;
  const int32_t* e = b.row_tiles + 3 * row_tile;
  *out = {e[0], e[1], e[2]};
  return true;
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

void add_plan_reads(rt::Op& op, const Context& c) {
  const int64_t pairs = c.expert_rows;
  const RoutedBuffers& b = c.routed;
  op.accesses.push_back(rt::reads(b.num_row_tiles, 4));
  op.accesses.push_back(
      rt::reads(b.row_tiles, static_cast<size_t>(max_row_tiles(pairs, c.weights->num_local_experts()) * 3) * 4));
}

}  // namespace

rt::Op make_experts_gate_up_op(const Context& c) {
  const Isa isa = c.isa;
  const int64_t h = c.config->hidden, inter = c.config->moe_intermediate;
  const size_t pairs = static_cast<size_t>(c.expert_rows);
  const Grid grid = expert_grid(c, inter);
  const RoutedBuffers b = c.routed;
  const std::vector<ExpertWeights>* experts = &c.weights->experts;
  rt::Op op{.name = "experts.gate_up", .num_tiles = grid.num_tiles()};
  op.tile = [=](int tile) {
    const Grid::Cell cell = grid.cell(tile);
    RowTile rt_;
    if (!lookup(b, cell.row_block, &rt_)) return;
    const ExpertWeights& ew = (*experts)[static_cast<size_t>(rt_.expert)];
    gate_up_silu(isa, b.xg + rt_.r0 * h, rt_.r1 - rt_.r0, h, ew.gate, ew.up, cell.c0, cell.c1, b.hg + rt_.r0 * inter,
                 inter);
  };
  add_plan_reads(op, c);
  op.accesses.push_back(rt::reads(b.xg, pairs * static_cast<size_t>(h) * 4));
  op.accesses.push_back(rt::writes(b.hg, pairs * static_cast<size_t>(inter) * 4));
  return op;
}

rt::Op make_experts_down_op(const Context& c) {
  const Isa isa = c.isa;
  const int64_t h = c.config->hidden, inter = c.config->moe_intermediate;
  const size_t pairs = static_cast<size_t>(c.expert_rows);
  const Grid grid = expert_grid(c, h);
  const RoutedBuffers b = c.routed;
  const std::vector<ExpertWeights>* experts = &c.weights->experts;
  rt::Op op{.name = "experts.down", .num_tiles = grid.num_tiles()};
  op.tile = [=](int tile) {
    const Grid::Cell cell = grid.cell(tile);
    RowTile rt_;
    if (!lookup(b, cell.row_block, &rt_)) return;
    const ExpertWeights& ew = (*experts)[static_cast<size_t>(rt_.expert)];
    linear(isa, b.hg + rt_.r0 * inter, rt_.r1 - rt_.r0, inter, ew.down, cell.c0, cell.c1, b.og + rt_.r0 * h, h);
  };
  add_plan_reads(op, c);
  op.accesses.push_back(rt::reads(b.hg, pairs * static_cast<size_t>(inter) * 4));
  op.accesses.push_back(rt::writes(b.og, pairs * static_cast<size_t>(h) * 4));
  return op;
}

}  // namespace moe::ops
