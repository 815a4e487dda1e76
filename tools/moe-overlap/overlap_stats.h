// Figures read off a trace of one forward: how long the shared expert's operations ran, and for how long they
// ran at the same time as routed-path operations.
#pragma once

#include "runtime/runtime.h"

namespace moe::tools {

struct OverlapStats {
  double span_us = 0;         // first op start to last op end
  double shared_us = 0;       // union of the shared branch's op intervals
  double routed_us = 0;       // union of the routed path's op intervals
  double concurrent_us = 0;   // time both were running
  double exchange_us = 0;     // union of the expert-parallel exchanges' intervals (ep.dispatch, ep.combine)
};

// Operations whose names start with "shared" belong to the shared branch; the rest to the routed path.
OverlapStats overlap_stats(const rt::Trace& trace);

}  // namespace moe::tools
