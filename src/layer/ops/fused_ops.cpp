// "fused": the fused schedule's one operation, the shared expert as one more expert of the routed ones:
// shared_gate (Qwen), the shared expert's chain ("shared": gate_up with its act, then down per token tile)
// and the routed experts' ("experts"), each part keeping its own tiles, arithmetic and buffers, so the
// output is serial's bit for bit. Their tiles are handed out in this order:
//   shared_gate | shared gate_up | experts gate_up | shared down | experts down
// all gate_up before any down, so a down cell rarely waits for its row (row_chain.h); the shared parts
// before the routed ones of each kind: their size is known, the routed tiles' is not (surplus routed tiles
// return at once), so the long tiles start early. A worker done with its routed tiles takes shared ones and
// no worker waits at a barrier between gate_up and down.
#include <array>
#include <memory>

#include "layer/ops/ops.h"

namespace moe::ops {

namespace {

// The parts and the order of their tile ranges: one allocation per operation (the tile function's
// captures would not fit in place).
struct FusedParts {
  struct Range {
    int part, first, count;  // tiles [first, first + count) of parts[part]
  };
  std::array<rt::Op, 3> parts;  // shared_gate (no tiles without the gate), shared, experts
  std::array<Range, 5> order;

  void run(int tile) const {
    for (const Range& r : order) {
      if (tile < r.count) {
        parts[static_cast<size_t>(r.part)].tile(r.first + tile);
        return;
      }
      tile -= r.count;
    }
  }
};

}  // namespace

rt::Op make_fused_op(const Context& c) {
  auto p = std::make_shared<FusedParts>();
  int shared_first = 0, experts_first = 0;
  if (c.config->shared_expert_gate) p->parts[0] = make_shared_gate_op(c);
  else p->parts[0].num_tiles = 0;
  p->parts[1] = make_shared_chain_op(c, &shared_first);
  p->parts[2] = make_experts_op(c, &experts_first);
  const int shared_second = p->parts[1].num_tiles - shared_first;
  const int experts_second = p->parts[2].num_tiles - experts_first;
  p->order = {{{0, 0, p->parts[0].num_tiles},
               {1, 0, shared_first},
               {2, 0, experts_first},
               {1, shared_first, shared_second},
               {2, experts_first, experts_second}}};
  rt::Op op{.name = "fused", .num_tiles = 0};
  for (const rt::Op& part : p->parts) {
    op.num_tiles += part.num_tiles;
    op.accesses.append(part.accesses.begin(), part.accesses.end());
  }
  op.tile = [p = std::shared_ptr<const FusedParts>(std::move(p))](int tile) { p->run(tile); };
  return op;
}

}  // namespace moe::ops
