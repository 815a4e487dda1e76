#include "overlap_stats.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

namespace moe::tools {

namespace {

using Intervals = std::vector<std::pair<int64_t, int64_t>>;

Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& iv : v) {
    if (!out.empty() && iv.first <= out.back().second) out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}

int64_t total(const Intervals& v) {
  int64_t t = 0;
  for (const auto& [a, b] : v) t += b - a;
  return t;
}

int64_t intersection(const Intervals& a, const Intervals& b) {
  int64_t t = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) t += hi - lo;
    (a[i].second < b[j].second ? i : j)++;
  }
  return t;
}

}  // namespace

OverlapStats overlap_stats(const rt::Trace& trace) {
  Intervals shared, routed, exchange;
  int64_t t0 = INT64_MAX, t1 = INT64_MIN;
  for (const auto& op : trace.ops) {
    if (op.end_ns <= op.start_ns) continue;
    const std::string_view name(op.name);
    (name.rfind("shared", 0) == 0 ? shared : routed).emplace_back(op.start_ns, op.end_ns);
    if (name == "ep.dispatch" || name == "ep.combine") exchange.emplace_back(op.start_ns, op.end_ns);
    t0 = std::min(t0, op.start_ns);
    t1 = std::max(t1, op.end_ns);
  }
  OverlapStats s;
  if (t0 >= t1) return s;
  shared = merged(shared);
  routed = merged(routed);
  s.span_us = static_cast<double>(t1 - t0) / 1e3;
  s.shared_us = static_cast<double>(total(shared)) / 1e3;
  s.routed_us = static_cast<double>(total(routed)) / 1e3;
  s.concurrent_us = static_cast<double>(intersection(shared, routed)) / 1e3;
  s.exchange_us = static_cast<double>(total(merged(exchange))) / 1e3;
  return s;
}

}  // namespace moe::tools
