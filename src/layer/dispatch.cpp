#include "layer/dispatch.h"

#include <algorithm>
#include <cstring>

namespace moe {

int64_t max_row_tiles(int64_t pairs, int64_t local_experts) {
  return pairs / kExpertRowsPerTile + std::min(pairs, local_experts);
}

void write_row_plan(const int32_t* start, int32_t total, int64_t el, int32_t* offsets, int32_t* row_tiles,
                    int32_t* num_row_tiles, int32_t* row_progress) {
  std::copy(start, start + el, offsets);
  offsets[el] = total;
  int32_t n = 0;
  constexpr auto kRows = static_cast<int32_t>(kExpertRowsPerTile);
  for (int64_t e = 0; e < el; ++e)
    for (int32_t r = offsets[e]; r < offsets[e + 1]; r += kRows) {
      row_tiles[3 * n] = static_cast<int32_t>(e);
      row_tiles[3 * n + 1] = r;
      row_tiles[3 * n + 2] = std::min(r + kRows, offsets[e + 1]);
      ++n;
    }
  *num_row_tiles = n;
  std::fill(row_progress, row_progress + 2 * static_cast<int64_t>(n), 0);
}

void dispatch_tile(const DispatchArgs& a, int tile, int num_tiles) {
  const int64_t el = a.local_experts, k = a.top_k;
  const int64_t t0 = a.tokens * tile / num_tiles, t1 = a.tokens * (tile + 1) / num_tiles;
  int32_t* cursor = a.counters + static_cast<int64_t>(tile) * el;
  std::fill(cursor, cursor + el, 0);
  for (int64_t p = 0; p < a.tokens * k; ++p)
    if (a.ids[p] < el) ++cursor[a.ids[p]];
  int32_t running = 0;
  for (int64_t e = 0; e < el; ++e) {
    const int32_t count = cursor[e];
    cursor[e] = running;
    running += count;
  }
  if (tile == 0) write_row_plan(cursor, running, el, a.offsets, a.row_tiles, a.num_row_tiles, a.row_progress);
  for (int64_t p = 0; p < t0 * k; ++p)
    if (a.ids[p] < el) ++cursor[a.ids[p]];
  for (int64_t p = t0 * k; p < t1 * k; ++p) {
    const int32_t e = a.ids[p];
    if (e >= el) {
      a.pair_row[p] = -1;
      continue;
    }
    const int32_t r = cursor[e]++;
    a.pair_row[p] = r;
    std::memcpy(a.xg + static_cast<int64_t>(r) * a.hidden, a.x + (p / k) * a.hidden,
                static_cast<size_t>(a.hidden) * sizeof(float));
  }
}

}  // namespace moe
