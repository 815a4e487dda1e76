// Tiling helpers shared by the layer's operations.
#include <algorithm>

#include "layer/ops/ops.h"

namespace moe::ops {

Grid make_grid(int64_t row_blocks, int64_t row_block, int64_t rows, int64_t cols, int num_workers,
               int64_t busy_row_blocks) {
  Grid g;
  g.rows = rows;
  g.row_block = row_block;
  g.cols = cols;
  g.num_row_blocks = row_blocks;
  const int64_t target = 4 * static_cast<int64_t>(std::max(num_workers, 1));
  const int64_t max_col_blocks = std::max<int64_t>(1, cols / kMinCols);
  const int64_t busy = std::clamp<int64_t>(busy_row_blocks < 0 ? row_blocks : busy_row_blocks, 1,
                                           std::max<int64_t>(row_blocks, 1));
  const int64_t want = (target + busy - 1) / busy;
  const int64_t col_blocks = std::clamp<int64_t>(want, 1, max_col_blocks);
  g.col_block = (cols + col_blocks - 1) / col_blocks;
  g.num_col_blocks = g.col_block > 0 ? (cols + g.col_block - 1) / g.col_block : 1;
  return g;
}

}  // namespace moe::ops
