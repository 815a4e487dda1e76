// "combine": per token, the weighted sum of its k expert outputs, in slot order (selection order: score
// descending, expert index ascending), fp32, starting from 0, each product rounded before its sum
// (weighted_rows_sum: the same bits on every ISA). Slots owned by another expert-parallel rank
// (pair_row -1) are skipped. The routing weights already carry routed_scaling_factor (layer/routing.h).
#include "kernels/linear.h"
#include "layer/ops/ops.h"

namespace moe::ops {

namespace {
constexpr int64_t kTokensPerTile = 16;
}

rt::Op make_combine_op(const Context& c) {
  const Isa isa = c.isa;
  const int64_t t = c.tokens, h = c.config->hidden, k = c.config->top_k;
  const Grid grid = make_grid((t + kTokensPerTile - 1) / kTokensPerTile, kTokensPerTile, t, h, c.num_workers);
  const RoutedBuffers b = c.routed;
  float* out = c.config->has_shared_expert() ? b.routed : c.y;
  // The expert outputs: grouped rows here, or (expert parallelism) the rows the owners sent back.
  const float* rows = c.ep.comm != nullptr ? c.ep.ret_rows : b.og;
  const size_t num_rows = c.ep.comm != nullptr ? static_cast<size_t>(c.ep.ranks * c.ep.capacity)
                                               : static_cast<size_t>(t * k);
  rt::Op op{.name = "combine", .num_tiles = grid.num_tiles()};
  op.tile = [=](int tile) {
    const Grid::Cell cell = grid.cell(tile);
    for (int64_t i = cell.r0; i < cell.r1; ++i)
      weighted_rows_sum(isa, out + i * h + cell.c0, rows + cell.c0, h, b.pair_row + i * k, b.topk_weights + i * k, k,
                        cell.c1 - cell.c0);
  };
  const size_t pairs = static_cast<size_t>(t * k);
  op.accesses = {rt::reads(b.pair_row, pairs * 4), rt::reads(b.topk_weights, pairs * 4),
                 rt::reads(rows, num_rows * static_cast<size_t>(h) * 4),
                 rt::writes(out, static_cast<size_t>(t * h) * 4)};
  return op;
}

}  // namespace moe::ops
