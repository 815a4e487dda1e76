// RowChain (layer/ops/row_chain.h), the routed experts' gate_up and down as one operation: in any order of
// its tiles every cell of the first grid runs once and before the second grid's cells of its row; on the
// device the second's cells see all of their row's first cells' writes; a first cell that throws fails the
// operation (the error reaches synchronize) without a hang. The layer's schedules keep serial's bits with it
// (test_layer, test_schedule_fuzz).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "layer/ops/row_chain.h"
#include "runtime/runtime.h"

namespace moe::ops {
namespace {

constexpr int64_t kRows = 5, kFirstCells = 3, kSecondCells = 2;

// The chain over kRows row tiles of kFirstCells then kSecondCells cells, with its counters in `progress`.
RowChain chain_over(const int32_t* rows_in_use, std::vector<int32_t>& progress) {
  return {.row_tiles = kRows, .first_cells = kFirstCells, .second_cells = kSecondCells, .rows_in_use = rows_in_use,
          .progress = progress.data()};
}

// Launches the chain of first(c) and second(c) cells as one operation named "chained" on `s`.
template <class First, class Second>
void launch_chain(rt::Stream& s, const RowChain& chain, First first, Second second) {
  s.launch({.name = "chained", .num_tiles = chain.num_tiles(),
            .tile = [chain, first, second](int tile) { chain.run(tile, first, second); }});
}

TEST(RowChain, AnyTileOrderRunsEachFirstCellOnceBeforeItsRowsSecondCells) {
  const int32_t in_use = 4;  // row tile 4 is past the rows in use: none of its cells runs
  std::vector<int> orders_seen;
  std::mt19937 rng(7);
  for (int order = 0; order < 50; ++order) {
    std::vector<int32_t> progress(kRows * 2, 0);
    const RowChain chain = chain_over(&in_use, progress);
    std::vector<int> tiles(static_cast<size_t>(chain.num_tiles()));
    std::iota(tiles.begin(), tiles.end(), 0);
    if (order == 1) std::reverse(tiles.begin(), tiles.end());  // every second cell first: it runs its row
    if (order > 1) std::shuffle(tiles.begin(), tiles.end(), rng);
    std::vector<int> first_runs(kRows * kFirstCells, 0), second_runs(kRows * kSecondCells, 0);
    for (const int t : tiles)
      chain.run(
          t, [&](int c) { ++first_runs[static_cast<size_t>(c)]; },
          [&](int c) {
            const int64_t r = c / kSecondCells;
            for (int64_t f = 0; f < kFirstCells; ++f)
              ASSERT_EQ(first_runs[static_cast<size_t>(r * kFirstCells + f)], 1) << "order " << order << " cell " << c;
            ++second_runs[static_cast<size_t>(c)];
          });
    for (int64_t c = 0; c < kRows * kFirstCells; ++c)
      EXPECT_EQ(first_runs[static_cast<size_t>(c)], c / kFirstCells < in_use ? 1 : 0) << "order " << order;
    for (int64_t c = 0; c < kRows * kSecondCells; ++c)
      EXPECT_EQ(second_runs[static_cast<size_t>(c)], c / kSecondCells < in_use ? 1 : 0) << "order " << order;
  }
}

// Busy for about `us` microseconds, so that the workers' cells overlap in time.
void busy(int us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(RowChain, OnTheDeviceTheSecondCellsSeeTheirRowsWrites) {
  auto dev = rt::make_cpu_device({.num_workers = 4});
  rt::Stream s = dev->create_stream(rt::kPriorityDefault, "chain");
  const int32_t in_use = kRows;
  std::vector<int32_t> progress(kRows * 2);
  std::vector<int> written(kRows * kFirstCells), seen(kRows * kSecondCells);  // plain: the chain orders them
  for (int round = 0; round < 100; ++round) {
    std::fill(progress.begin(), progress.end(), 0);
    std::fill(written.begin(), written.end(), 0);
    std::fill(seen.begin(), seen.end(), 0);
    launch_chain(
        s, chain_over(&in_use, progress),
        [&](int c) {
          busy(c % 3 == 0 ? 200 : 20);  // a slow cell in each row, so that its second cells wait
          written[static_cast<size_t>(c)] = round + 1;
        },
        [&](int c) {
          const int64_t r = c / kSecondCells;
          int sum = 0;
          for (int64_t f = 0; f < kFirstCells; ++f) sum += written[static_cast<size_t>(r * kFirstCells + f)];
          seen[static_cast<size_t>(c)] = sum;
        });
    s.synchronize();
    for (int64_t c = 0; c < kRows * kSecondCells; ++c)
      ASSERT_EQ(seen[static_cast<size_t>(c)], kFirstCells * (round + 1)) << "round " << round << " cell " << c;
  }
}

TEST(RowChain, AFailingFirstCellFailsTheOperationWithoutAHang) {
  auto dev = rt::make_cpu_device({.num_workers = 2});
  rt::Stream s = dev->create_stream(rt::kPriorityDefault, "chain");
  const int32_t in_use = kRows;
  std::vector<int32_t> progress(kRows * 2, 0);
  std::vector<int> second_runs(kRows * kSecondCells, 0);
  launch_chain(
      s, chain_over(&in_use, progress),
      [](int c) {
        // The failing cell is slow: the other worker reaches row 1's second cells and waits for it.
        if (c != kFirstCells + 1) return busy(10);
        busy(5000);
        throw std::runtime_error("cell of row 1 failed");
      },
      [&](int c) { ++second_runs[static_cast<size_t>(c)]; });
  try {
    s.synchronize();
    FAIL() << "expected a StreamError";
  } catch (const rt::StreamError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("chained"), std::string::npos) << what;
    EXPECT_NE(what.find("cell of row 1 failed"), std::string::npos) << what;
  }
  EXPECT_EQ(second_runs[kSecondCells], 0);  // row 1's second cells did not run on a failed row
  EXPECT_EQ(second_runs[kSecondCells + 1], 0);
}

}  // namespace
}  // namespace moe::ops
