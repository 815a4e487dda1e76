// The layer's operations: each builds one rt::Op (a grid of tiles plus the buffers it reads and writes) for
// one forward call. Names, as the trace shows them:
//   routed path (main stream): router, topk, dispatch, experts (gate_up chained with down), combine
//   shared branch:             shared_gate, shared.gate_up, shared.act, shared.down
//   join:                      sum
//   optional:                  check_input
//   fused schedule:            fused (shared_gate, the shared expert and the routed experts, one operation)
// An op's tile count is fixed when it is enqueued, before routing is known (and graph mode captures it once),
// so the expert grids are sized for the worst case and surplus tiles return at once. Tiles cut output rows and
// columns, never a reduction, so every output element is computed by exactly one tile in a fixed order
// (kernels/linear.h's determinism contract): the bits do not depend on the tiling, the worker count or the
// schedule.
//
// The ops capture raw pointers: the layer that built them must outlive their execution.
//
// Declared accesses cover every activation and workspace byte an op reads or writes, not the weights: they are
// immutable while the layer lives, owned by LayerWeights rather than announced to the device, and a declared
// read of memory the device's allocator never announced would look to the sanitizer like a use of freed bytes
// whenever the OS hands the weights addresses a freed workspace once had.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ep/communicator.h"
#include "kernels/linear.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/runtime.h"

namespace moe::ops {

// The routed path's workspace (used only by the main stream). Shapes for T tokens, k slots, E experts,
// E_l local experts, P = T * k pairs.
struct RoutedBuffers {
  float* logits = nullptr;         // [T, E] fp32 router logits
  float* route_scratch = nullptr;  // [T, routing_scratch_floats]
  float* topk_weights = nullptr;   // [T, k]
  int32_t* topk_ids = nullptr;     // [T, k]
  int32_t* pair_row = nullptr;     // [P]   see layer/dispatch.h
  int32_t* counters = nullptr;     // [kMaxDispatchTiles, E_l]
  int32_t* offsets = nullptr;      // [E_l + 1]
  int32_t* row_tiles = nullptr;    // [max_row_tiles, 3]
  int32_t* num_row_tiles = nullptr;  // [1]
  int32_t* row_progress = nullptr;   // [max_row_tiles, 2] the experts op's progress per row tile (row_chain.h)
  // [shared_row_tiles(T), 2] the fused schedule's shared expert chain's progress (make_shared_chain_op).
  // Here, not in SharedBuffers: the op that zeroes row_progress zeroes it too, on the main stream that runs
  // the fused operation (its own counters are zeroed the same way).
  int32_t* shared_progress = nullptr;
  float* xg = nullptr;             // [P, H] gathered rows
  float* hg = nullptr;             // [P, I] silu(gate) * up per grouped row
  float* og = nullptr;             // [P, H] expert outputs per grouped row
  float* routed = nullptr;         // [T, H] combined routed output (unused without a shared expert)
};

// The shared branch's workspace (used by whichever stream runs the shared expert; never the routed one's).
struct SharedBuffers {
  float* gate = nullptr;  // [T]      sigmoid(x . w_shared_gate) (Qwen)
  float* g = nullptr;     // [T, Is]  x . gate_proj
  float* u = nullptr;     // [T, Is]  x . up_proj
  float* h = nullptr;     // [T, Is]  silu(g) * u
  float* out = nullptr;   // [T, H]   down_proj h
};

inline constexpr int kMaxDispatchTiles = 16;

// Expert parallelism (LayerOptions::comm): this rank's exchange buffers, for N ranks and C = max_tokens * k
// rows per peer block (the most one rank can send another). Row i of a block is H floats.
struct EpBuffers {
  ep::Communicator* comm = nullptr;  // null: one process
  ep::ExchangeMode mode = ep::ExchangeMode::kLowLatency;
  int ranks = 1;
  int64_t capacity = 0;           // C
  int32_t* send_meta = nullptr;   // [N, 1 + C] rows to owner q, then the owner's local expert id of each row
  float* send_rows = nullptr;     // [N, C, H] token rows to each owner, pairs ascending
  int32_t* recv_meta = nullptr;   // [N, 1 + C] as send_meta, from each origin
  float* recv_rows = nullptr;     // [N, C, H]
  int32_t* recv_group = nullptr;  // [N, C] grouped row (xg, og) of each received row
  int32_t* group_cursor = nullptr;  // [E_l] scratch of ep.group
  float* back_rows = nullptr;     // [N, C, H] expert outputs back to each origin, in arrival order
  float* ret_rows = nullptr;      // [N, C, H] this rank's rows back from each owner, in send order
  // The exchanges' messages and progress, owned by the layer (one forward at a time per layer).
  ep::Transfer* counts = nullptr;    // normal mode's count round
  ep::Transfer* dispatch = nullptr;  // rows (and their expert ids) to the owners
  ep::Transfer* combine = nullptr;   // expert outputs back to the origins
  int* dispatch_phase = nullptr;     // 0 idle, 1 counts in flight, 2 rows in flight
};

struct Context {
  const MoeConfig* config = nullptr;
  const LayerWeights* weights = nullptr;
  const float* x = nullptr;  // [T, H], never written
  float* y = nullptr;        // [T, H]
  int64_t tokens = 0;
  int num_workers = 1;
  Isa isa = Isa::kScalar;    // the kernels every op of the call runs (LayerOptions::isa)
  RoutedBuffers routed;
  SharedBuffers shared;
  // The most grouped rows the expert ops see (xg, hg, og): tokens * k in one process, N * C under expert
  // parallelism (every rank's pairs may route here).
  int64_t expert_rows = 0;
  EpBuffers ep;
};

// A 2-D tiling of an [rows, cols] output: row blocks of `row_block`, and enough column blocks to give
// about 4 busy tiles per worker (columns never narrower than kMinCols). `busy_row_blocks` is how many row
// blocks are expected to hold work (the rest return at once); by default all of them.
struct Grid {
  int64_t rows = 0, row_block = 1, cols = 0, col_block = 1;
  int64_t num_row_blocks = 0, num_col_blocks = 1;
  int num_tiles() const { return static_cast<int>(num_row_blocks * num_col_blocks); }
  // The row block and column range of a tile (rows clipped to `rows`; may be empty).
  struct Cell {
    int64_t row_block, r0, r1, c0, c1;
  };
  Cell cell(int tile) const {
    const int64_t rb = tile / num_col_blocks, cb = tile % num_col_blocks;
    const int64_t r0 = rb * row_block, c0 = cb * col_block;
    return {rb, r0, r0 + row_block < rows ? r0 + row_block : rows, c0, c0 + col_block < cols ? c0 + col_block : cols};
  }
};
inline constexpr int64_t kMinCols = 16;
Grid make_grid(int64_t row_blocks, int64_t row_block, int64_t rows, int64_t cols, int num_workers,
               int64_t busy_row_blocks = -1);

rt::Op make_check_input_op(const Context& c);
rt::Op make_router_op(const Context& c);
rt::Op make_topk_op(const Context& c);
rt::Op make_dispatch_op(const Context& c);
// "experts": the routed experts' gate_up and down grids in one operation chained by row tile (row_chain.h): an
// expert's down starts once its own gate_up is done, not the whole grid's. Tiles [0, *first_tiles) are
// gate_up's, the rest down's.
rt::Op make_experts_op(const Context& c, int* first_tiles);
inline rt::Op make_experts_op(const Context& c) { return make_experts_op(c, nullptr); }
rt::Op make_combine_op(const Context& c);  // writes routed, or y when there is no shared expert
rt::Op make_shared_gate_op(const Context& c);
rt::Op make_shared_gate_up_op(const Context& c);
rt::Op make_shared_act_op(const Context& c);
rt::Op make_shared_down_op(const Context& c);
rt::Op make_sum_op(const Context& c);  // y = routed + gate * shared (gate = 1 when ungated)

// "shared": the shared expert's gate_up with SiLU-and-multiply on each cell (gate_up_silu: the same bits
// as gate_up followed by act) chained with down per token tile (row_chain.h), counters in
// RoutedBuffers::shared_progress. Only inside the fused operation: the unfused schedules keep the steps.
// Tiles [0, *first_tiles) are gate_up's, the rest down's.
rt::Op make_shared_chain_op(const Context& c, int* first_tiles);
// The int32 counters of that chain for `tokens` (two per token tile; none without a shared expert): the
// length of RoutedBuffers::shared_progress.
int64_t shared_chain_counters(const MoeConfig& config, int64_t tokens);
// This call's counters of that chain, zeroed (and declared written) by the operations that zero the routed
// experts' (dispatch, ep.group), on the main stream before the fused operation: graphs replay it.
struct SharedChainReset {
  int32_t* counters = nullptr;
  int64_t n = 0;
  void operator()() const { std::fill(counters, counters + n, 0); }
  rt::Access access() const { return rt::writes(counters, static_cast<size_t>(n) * 4); }
};
SharedChainReset shared_chain_reset(const Context& c);
// "fused": shared_gate (Qwen), the shared expert's chain and the routed experts' as one operation
// (fused_ops.cpp).
rt::Op make_fused_op(const Context& c);

// Expert parallelism (layer/ops/ep_ops.cpp), replacing "dispatch" and reading the rows "combine" sums from
// ret_rows: ep.pack (rows to each owner), ep.dispatch (exchange), ep.group (received rows by local expert),
// experts.*, ep.return (outputs in arrival order), ep.combine (exchange back), combine.
rt::Op make_ep_pack_op(const Context& c);
rt::Op make_ep_dispatch_op(const Context& c);
rt::Op make_ep_group_op(const Context& c);
rt::Op make_ep_return_op(const Context& c);
rt::Op make_ep_combine_op(const Context& c);

}  // namespace moe::ops
