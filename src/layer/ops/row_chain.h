// RowChain: two grids over the same row tiles run as one operation, without a barrier between them.
//
// The second grid's cells of row tile r read what all of the first's cells of r wrote (the routed experts:
// down reads the whole silu(gate) * up row of its expert; the fused schedule's shared expert: down reads
// its token tile's whole h). As two operations a worker that ends its share of
// the first waits at the barrier for the other workers' last cells (at one decode token, one expert's gate_up
// each); chained, it goes on to the second's cells of the rows already done.
//
// Tiles [0, R * n1) are the first's, then R * n2 the second's, so the runtime hands out the first's before
// the second's. A tile of the first claims the next unclaimed cell of its row (progress[2r], a counter: any
// tile of the row may run any of its cells, each runs once), runs it and counts it done (progress[2r + 1]).
// A tile of the second runs the cells of its row still unclaimed itself, then waits for those others are
// running: it never waits for a cell no worker has started, so any order of the tiles (the schedule
// fuzzer's shuffles, one worker) completes. A cell that throws marks its row failed; the second's tiles of
// that row return without running, and the exception fails the operation as any tile's does.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace moe::ops {

struct RowChain {
  int64_t row_tiles = 0, first_cells = 1, second_cells = 1;  // cells per row tile of each grid
  const int32_t* rows_in_use = nullptr;  // row tiles from *rows_in_use on are skipped (null: none is)
  int32_t* progress = nullptr;           // [row_tiles, 2], zero for the row tiles in use when the op starts

  int first_tiles() const { return static_cast<int>(row_tiles * first_cells); }
  int num_tiles() const { return static_cast<int>(row_tiles * (first_cells + second_cells)); }

  // Tile `tile` of the chained operation: first(t) and second(t) run tile t of their own grid (cell t % cells
  // of row tile t / cells).
  template <class First, class Second>
  void run(int tile, First&& first, Second&& second) const {
    const int64_t n1 = row_tiles * first_cells;
    const int64_t r = tile < n1 ? tile / first_cells : (tile - n1) / second_cells;
    if (rows_in_use != nullptr && r >= *rows_in_use) return;
    std::atomic_ref<int32_t> claimed(progress[2 * r]), done(progress[2 * r + 1]);
    const auto run_one = [&] {  // the row's next unclaimed cell of the first grid; false when none was left
      const int32_t cell = claimed.fetch_add(1, std::memory_order_relaxed);
      if (cell >= first_cells) return false;
      try {
        first(static_cast<int>(r * first_cells + cell));
      } catch (...) {
        done.fetch_or(kRowFailed, std::memory_order_release);
        throw;
      }
      done.fetch_add(1, std::memory_order_release);
      return true;
    };
    if (tile < n1) {
      run_one();
      return;
    }
    // Once the row is done (the common case) the counters are only read: no write to their cache line.
    if (done.load(std::memory_order_acquire) < first_cells)
      while (run_one()) {
      }
    for (;;) {
      const int32_t d = done.load(std::memory_order_acquire);
      if (d & kRowFailed) return;
      if (d >= first_cells) break;
      std::this_thread::yield();  // as the runtime's idle workers spin: the cell's worker may share this CPU
    }
    second(static_cast<int>(tile - n1));
  }

  static constexpr int32_t kRowFailed = int32_t{1} << 30;
};

}  // namespace moe::ops
