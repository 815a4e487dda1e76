// "check_input" (opt-in): fails the stream, naming the first non-finite element of x, before any other op
// reads it. It runs on the stream rather than on the host at enqueue because x may still be being produced
// by earlier work on the stream. One tile, so "first" is well defined.
#include <cmath>
#include <stdexcept>
#include <string>

#include "layer/ops/ops.h"

namespace moe::ops {

rt::Op make_check_input_op(const Context& c) {
  const int64_t t = c.tokens, h = c.config->hidden;
  const float* x = c.x;
  rt::Op op{.name = "check_input", .num_tiles = 1};
  op.tile = [=](int) {
    for (int64_t i = 0; i < t * h; ++i)
      if (!std::isfinite(x[i]))
        throw std::invalid_argument("MoE layer input x has a non-finite value (" + std::to_string(x[i]) +
                                    ") at token " + std::to_string(i / h) + ", column " + std::to_string(i % h));
  };
  op.accesses = {rt::reads(x, static_cast<size_t>(t * h) * 4)};
  return op;
}

}  // namespace moe::ops
