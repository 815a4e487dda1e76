// "dispatch": groups the (token, slot) pairs by local expert and gathers their rows (layer/dispatch.h).
#include <algorithm>

#include "layer/dispatch.h"
#include "layer/ops/ops.h"

namespace moe::ops {

namespace {
constexpr int64_t kTokensPerTile = 8;
}

rt::Op make_dispatch_op(const Context& c) {
  const int64_t t = c.tokens, k = c.config->top_k, h = c.config->hidden;
  const int64_t el = c.weights->num_local_experts();
  const RoutedBuffers b = c.routed;
  DispatchArgs a{.ids = b.topk_ids, .tokens = t, .top_k = k, .local_experts = el, .x = c.x, .hidden = h,
                 .counters = b.counters, .pair_row = b.pair_row, .offsets = b.offsets, .row_tiles = b.row_tiles,
                 .num_row_tiles = b.num_row_tiles, .row_progress = b.row_progress, .xg = b.xg};
  const int num_tiles =
      static_cast<int>(std::clamp<int64_t>((t + kTokensPerTile - 1) / kTokensPerTile, 1, kMaxDispatchTiles));
  const SharedChainReset reset_shared_chain = shared_chain_reset(c);
  rt::Op op{.name = "dispatch", .num_tiles = num_tiles};
  op.tile = [a, num_tiles, reset_shared_chain](int tile) {
    if (tile == 0) reset_shared_chain();
    dispatch_tile(a, tile, num_tiles);
  };
  const size_t p = static_cast<size_t>(t * k);
  op.accesses = {rt::reads(b.topk_ids, p * 4),
                 rt::reads(c.x, static_cast<size_t>(t * h) * 4),
                 rt::writes(b.counters, static_cast<size_t>(num_tiles * el) * 4),
                 rt::writes(b.pair_row, p * 4),
                 rt::writes(b.offsets, static_cast<size_t>(el + 1) * 4),
                 rt::writes(b.row_tiles, static_cast<size_t>(max_row_tiles(t * k, el) * 3) * 4),
                 rt::writes(b.num_row_tiles, 4),
                 rt::writes(b.row_progress, static_cast<size_t>(max_row_tiles(t * k, el) * 2) * 4),
                 reset_shared_chain.access(),
                 rt::writes(b.xg, p * static_cast<size_t>(h) * 4)};
  return op;
}

}  // namespace moe::ops
