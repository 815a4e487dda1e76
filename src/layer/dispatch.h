// Dispatch: groups the (token, slot) pairs by local expert, stably (token ascending, then slot), and gathers
// the token rows into a grouped buffer so every expert runs one dense GEMM over contiguous rows.
//
// Buffers (E_l = local experts, P = tokens * k pairs, R = kExpertRowsPerTile):
//   ids       [P] int32    routed expert per pair (from top-k), any of [0, E)
//   pair_row  [P] int32    grouped row of the pair, -1 when its expert is not local (another rank owns it)
//   offsets   [E_l + 1]    first grouped row of each local expert; offsets[E_l] = rows in use
//   row_tiles [max_row_tiles * 3] (expert, row0, row1) blocks of at most R rows, expert ascending;
//   num_row_tiles [1]
//   row_progress [max_row_tiles * 2] zeroed for the row tiles in use (the experts op's counters)
//   xg        [P, H]       gathered token rows
//
// The work is split over token ranges. Every tile recounts all P pairs (O(P + E_l), microseconds) into its
// own counter row, so the tiles need no communication and the grouping is the same whatever the split;
// tile 0 also writes offsets and the row-tile table.
#pragma once

#include <cstdint>

namespace moe {

inline constexpr int64_t kExpertRowsPerTile = 32;

// Upper bound of row tiles for `pairs` (token, slot) pairs over `local_experts`: sum over experts of
// ceil(count / R) <= floor(pairs / R) + active experts.
int64_t max_row_tiles(int64_t pairs, int64_t local_experts);

struct DispatchArgs {
  const int32_t* ids = nullptr;
  int64_t tokens = 0;
  int64_t top_k = 0;
  int64_t local_experts = 0;
  const float* x = nullptr;  // [tokens, hidden]
  int64_t hidden = 0;
  int32_t* counters = nullptr;  // [num_tiles, local_experts] scratch
  int32_t* pair_row = nullptr;
  int32_t* offsets = nullptr;
  int32_t* row_tiles = nullptr;
  int32_t* num_row_tiles = nullptr;
  int32_t* row_progress = nullptr;
  float* xg = nullptr;
};

// Tile `tile` of `num_tiles`: handles tokens [tokens * tile / num_tiles, tokens * (tile + 1) / num_tiles).
void dispatch_tile(const DispatchArgs& a, int tile, int num_tiles);

// The grouped rows' plan from each local expert's first row (start[E_l]) and the rows in use: offsets and
// the row-tile table (expert ascending, blocks of at most kExpertRowsPerTile rows), and zeroes the
// progress counters of the row tiles in use. Shared by the dispatch of one process and expert parallelism's
// grouping of received rows (layer/ops/ep_ops.cpp).
void write_row_plan(const int32_t* start, int32_t total, int64_t local_experts, int32_t* offsets, int32_t* row_tiles,
                    int32_t* num_row_tiles, int32_t* row_progress);

}  // namespace moe
