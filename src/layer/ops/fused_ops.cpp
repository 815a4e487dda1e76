// The fused schedule's operations: the shared expert as one more expert of the routed expert operations.
//   "fused.gate_up"  shared_gate (Qwen) + shared.swiglu + experts.gate_up
//   "fused.down"     shared.down + experts.down
// Each part keeps its own tiles, arithmetic and buffers, so the output is serial's bit for bit; what
// changes is that they are one operation: no barrier between them, and a worker done with its routed
// tiles takes shared ones. The shared parts come first: their size is known, the routed tiles' is not
// (surplus routed tiles return at once), so the long tiles start early.
#include <utility>

#include "layer/ops/ops.h"

namespace moe::ops {

rt::Op concat_ops(std::string name, std::vector<rt::Op> parts) {
  rt::Op op{.name = std::move(name), .num_tiles = 0};
  for (const rt::Op& p : parts) {
    op.num_tiles += p.num_tiles;
    op.accesses.append(p.accesses.begin(), p.accesses.end());
  }
  // The parts' list is the one allocation of the operation (their tiles and accesses live in place).
  op.tile = [parts = std::move(parts)](int tile) {
    size_t i = 0;
    while (tile >= parts[i].num_tiles) tile -= parts[i++].num_tiles;  // parts are few (two or three)
    parts[i].tile(tile);
  };
  return op;
}

rt::Op make_fused_gate_up_op(const Context& c) {
  std::vector<rt::Op> parts;
  parts.reserve(3);
  if (c.config->shared_expert_gate) parts.push_back(make_shared_gate_op(c));
  parts.push_back(make_shared_gate_up_act_op(c));
  parts.push_back(make_experts_gate_up_op(c));
  return concat_ops("fused.gate_up", std::move(parts));
}

rt::Op make_fused_down_op(const Context& c) {
  std::vector<rt::Op> parts;
  parts.reserve(2);
  parts.push_back(make_shared_down_op(c));
  parts.push_back(make_experts_down_op(c));
  return concat_ops("fused.down", std::move(parts));
}

}  // namespace moe::ops
