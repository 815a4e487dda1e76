// The check of a captured graph on its own (check_graph, sanitizer.h): every pair of nodes whose accesses
// overlap, one of them writing, must be ordered by the captured dependencies.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "runtime/graph.h"
#include "runtime/sanitizer.h"
#include "runtime/sanitizer_report.h"

namespace moe::rt {

using detail::describe;
using detail::hex;
using detail::hint;
using detail::writes_of;

namespace {

// First overlap of two nodes' accesses where one writes: {current access, previous access}, or nulls.
std::pair<const Access*, const Access*> graph_conflict(const Op& later, const Op& earlier) {
  for (const Access& a : later.accesses) {
    for (const Access& b : earlier.accesses) {
      if (!writes_of(a.mode) && !writes_of(b.mode)) continue;
      auto a0 = reinterpret_cast<uintptr_t>(a.ptr), b0 = reinterpret_cast<uintptr_t>(b.ptr);
      if (a.ptr && b.ptr && a0 < b0 + b.bytes && b0 < a0 + a.bytes) return {&a, &b};
    }
  }
  return {nullptr, nullptr};
}

AccessSite node_site(const GraphNode& n, size_t index, AccessMode mode) {
  return {n.op.name + " (graph node " + std::to_string(index) + ")", n.stream_id, n.stream_name, 0, mode};
}

}  // namespace

std::vector<RaceReport> check_graph(const std::vector<GraphNode>& nodes) {
  const size_t n = nodes.size();
  const size_t words = (n + 63) / 64;
  std::vector<uint64_t> reach(n * words, 0);  // reach[j] has bit i when node i happens before node j
  std::vector<RaceReport> out;
  for (size_t j = 0; j < n; ++j) {
    uint64_t* rj = &reach[j * words];
    for (int d : nodes[j].deps) {
      if (d < 0 || static_cast<size_t>(d) >= j) continue;
      const uint64_t* rd = &reach[static_cast<size_t>(d) * words];
      for (size_t w = 0; w < words; ++w) rj[w] |= rd[w];
      rj[d / 64] |= uint64_t{1} << (d % 64);
    }
    for (size_t i = 0; i < j; ++i) {
      if (rj[i / 64] >> (i % 64) & 1) continue;
      auto [a, b] = graph_conflict(nodes[j].op, nodes[i].op);
      if (!a) continue;
      RaceReport r;
      r.kind = writes_of(a->mode) ? (writes_of(b->mode) ? HazardKind::kWriteAfterWrite : HazardKind::kWriteAfterRead)
                                  : HazardKind::kReadAfterWrite;
      r.current = node_site(nodes[j], j, a->mode);
      r.previous = node_site(nodes[i], i, b->mode);
      uintptr_t lo = std::max(reinterpret_cast<uintptr_t>(a->ptr), reinterpret_cast<uintptr_t>(b->ptr));
      uintptr_t hi = std::min(reinterpret_cast<uintptr_t>(a->ptr) + a->bytes, reinterpret_cast<uintptr_t>(b->ptr) + b->bytes);
      r.ptr = reinterpret_cast<const void*>(lo);
      r.bytes = hi - lo;
      r.message = std::string("stream sanitizer: graph ") + to_string(r.kind) + " on bytes [" + hex(lo) + ", " +
                  hex(hi) + "): " + describe(r.current) + " is not ordered after " + describe(r.previous) +
                  " by the captured dependencies; " + hint(r) + " inside the capture";
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace moe::rt
