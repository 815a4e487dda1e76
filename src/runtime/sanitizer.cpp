// The stream sanitizer: vector clocks per stream (PyTorch's CUDA sanitizer) over an interval map of byte
// ranges with allocation epochs. See sanitizer.h for the contract; the reports' wording is in
// sanitizer_report.cpp, the check of a captured graph on its own in sanitizer_graph.cpp.
//
// Invariants of the interval map (segments_): segments are disjoint, keyed by their first byte; each holds
// the last write and the latest read of each stream since that write. Keeping only those is enough: clocks
// are monotone, so an access ordered after a stream's latest read is ordered after its earlier ones, and a
// write that was itself checked against the reads before it is ordered after them (or was reported).
#include "runtime/sanitizer.h"

#include "runtime/graph.h"
#include "runtime/sanitizer_report.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <utility>

namespace moe::rt {

// The hazards one access found, one per earlier access, with the hull of the bytes in conflict.
struct Sanitizer::Pending {
  HazardKind kind;
  bool has_previous = false;
  Record previous;
  uint32_t alloc = 0;
  uintptr_t lo = 0;
  uintptr_t hi = 0;
};

namespace {

using detail::describe;
using detail::hex;
using detail::hint;
using detail::reads_of;
using detail::writes_of;

// Sanitizers registered through enable_sanitizer, for note_host_write.
std::mutex g_registry_mu;
std::atomic<int> g_registry_size{0};
std::vector<std::pair<const Device*, std::weak_ptr<Sanitizer>>> g_registry;

}  // namespace

bool Sanitizer::Segment::same_state(const Segment& o) const {
  return has_write == o.has_write && (!has_write || write == o.write) && reads == o.reads && alloc == o.alloc &&
         initialized == o.initialized && freed == o.freed;
}

Sanitizer::Sanitizer(SanitizerOptions options) : options_(options) {}
Sanitizer::~Sanitizer() = default;

std::vector<RaceReport> Sanitizer::reports() const {
  std::lock_guard lk(mu_);
  return reports_;
}

std::vector<RaceReport> Sanitizer::take_reports() {
  std::lock_guard lk(mu_);
  return std::exchange(reports_, {});
}

size_t Sanitizer::num_reports() const {
  std::lock_guard lk(mu_);
  return reports_.size();
}

size_t Sanitizer::num_ranges() const {
  std::lock_guard lk(mu_);
  return segments_.size();
}

void Sanitizer::reset() {
  std::lock_guard lk(mu_);
  stream_ids_.clear();
  streams_.clear();
  events_.clear();
  host_.clear();
  segments_.clear();
  allocs_.clear();
  reports_.clear();
}

// ---- clocks --------------------------------------------------------------------------------------------

uint32_t Sanitizer::stream_index(const Stream& s) {
  auto [it, fresh] = stream_ids_.try_emplace(s.impl().get(), static_cast<uint32_t>(streams_.size()));
  if (fresh) {
    // A stream first seen now has seen everything the host has (it can only run what is enqueued later).
    streams_.push_back({host_, s.id(), s.name()});
  }
  return it->second;
}

uint32_t Sanitizer::intern(const std::string& name) {
  auto [it, fresh] = name_ids_.try_emplace(name, static_cast<uint32_t>(names_.size()));
  if (fresh) names_.push_back(name);
  return it->second;
}

bool Sanitizer::ordered(const Record& earlier, uint32_t later_stream) const {
  if (earlier.stream == kHost || earlier.stream == later_stream) return true;
  if (later_stream == kHost) return host_ordered(earlier);
  const Clock& c = streams_[later_stream].clock;
  return earlier.stream < c.size() && c[earlier.stream] >= earlier.seq;
}

bool Sanitizer::host_ordered(const Record& earlier) const {
  if (earlier.stream == kHost) return true;
  return earlier.stream < host_.size() && host_[earlier.stream] >= earlier.seq;
}

void Sanitizer::merge(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

// Whatever the host waited for happens before everything enqueued later, on every stream.
void Sanitizer::host_merge(const Clock& from) {
  merge(host_, from);
  for (StreamState& s : streams_) merge(s.clock, host_);
}

void Sanitizer::on_stream_created(const Stream& s) {
  std::lock_guard lk(mu_);
  stream_index(s);
}

void Sanitizer::on_record(const Stream& s, uint64_t seq, const Event& e) {
  std::lock_guard lk(mu_);
  uint32_t si = stream_index(s);
  // wait_stream() makes a fresh event each time: drop the dead ones now and then.
  if (events_.size() > 256) std::erase_if(events_, [](const auto& kv) { return kv.second.owner.expired(); });
  EventState& ev = events_[e.impl().get()];
  ev.owner = e.impl();
  ev.clock = streams_[si].clock;
}

void Sanitizer::on_wait(const Stream& s, uint64_t seq, const Event& e) {
  std::lock_guard lk(mu_);
  uint32_t si = stream_index(s);
  auto it = events_.find(e.impl().get());
  // Never recorded (or recorded before the sanitizer was attached, or a dead event's address): a no-op.
  if (it == events_.end() || it->second.owner.lock() != e.impl()) return;
  merge(streams_[si].clock, it->second.clock);
}

void Sanitizer::on_stream_synchronize(const Stream& s) {
  std::lock_guard lk(mu_);
  Clock c = streams_[stream_index(s)].clock;
  host_merge(c);
}

void Sanitizer::on_event_synchronize(const Event& e) {
  std::lock_guard lk(mu_);
  auto it = events_.find(e.impl().get());
  if (it == events_.end() || it->second.owner.lock() != e.impl()) return;
  Clock c = it->second.clock;
  host_merge(c);
}

void Sanitizer::on_device_synchronize() {
  std::lock_guard lk(mu_);
  Clock all = host_;
  for (const StreamState& s : streams_) merge(all, s.clock);
  host_merge(all);
}

// ---- the interval map ----------------------------------------------------------------------------------

void Sanitizer::split_at(uintptr_t at) {
  auto it = segments_.upper_bound(at);
  if (it == segments_.begin()) return;
  --it;
  if (it->first == at || it->second.end <= at) return;
  Segment tail = it->second;
  it->second.end = at;
  segments_.emplace_hint(std::next(it), at, std::move(tail));
}

Sanitizer::SegIt Sanitizer::cover(uintptr_t begin, uintptr_t end) {
  split_at(begin);
  split_at(end);
  uintptr_t cursor = begin;
  auto it = segments_.lower_bound(begin);
  while (cursor < end) {
    uintptr_t next = (it == segments_.end()) ? end : std::min(it->first, end);
    if (cursor < next) {  // bytes never seen: memory nobody announced, assumed initialized
      Segment fresh;
      fresh.end = next;
      it = segments_.emplace_hint(it, cursor, fresh);
    }
    cursor = it->second.end;
    ++it;
  }
  return segments_.lower_bound(begin);
}

void Sanitizer::coalesce(uintptr_t begin, uintptr_t end) {
  auto it = segments_.lower_bound(begin);
  if (it != segments_.begin()) --it;
  while (it != segments_.end() && it->first <= end) {
    auto next = std::next(it);
    if (next != segments_.end() && next->first == it->second.end && it->second.same_state(next->second)) {
      it->second.end = next->second.end;
      segments_.erase(next);
    } else {
      it = next;
    }
  }
}

// ---- checking ------------------------------------------------------------------------------------------

void Sanitizer::check_segment(uintptr_t begin, const Segment& seg, const Record& cur, std::vector<Pending>& out) {
  auto add = [&](HazardKind kind, const Record* prev) {
    for (Pending& p : out) {
      bool same = p.kind == kind && p.has_previous == (prev != nullptr) &&
                  (!prev || (p.previous.stream == prev->stream && p.previous.seq == prev->seq &&
                             p.previous.name == prev->name));
      if (same) {
        p.lo = std::min(p.lo, begin);
        p.hi = std::max(p.hi, seg.end);
        return;
      }
    }
    Pending p{kind, prev != nullptr, prev ? *prev : Record{}, seg.alloc, begin, seg.end};
    out.push_back(p);
  };
  auto conflict = [&](const Record& prev, HazardKind kind) {
    add(prev.alloc != seg.alloc ? HazardKind::kReuseBeforeOrdered : kind, &prev);
  };
  if (seg.freed) {
    add(HazardKind::kUseAfterFree, nullptr);
    return;
  }
  if (reads_of(cur.mode)) {
    if (seg.has_write && !ordered(seg.write, cur.stream)) conflict(seg.write, HazardKind::kReadAfterWrite);
    if (!seg.initialized && options_.check_uninitialized) add(HazardKind::kUninitializedRead, nullptr);
  }
  if (writes_of(cur.mode)) {
    if (seg.has_write && !ordered(seg.write, cur.stream)) conflict(seg.write, HazardKind::kWriteAfterWrite);
    for (const Record& r : seg.reads) {
      if (!ordered(r, cur.stream)) conflict(r, HazardKind::kWriteAfterRead);
    }
  }
}

void Sanitizer::check_access(const Access& a, const Record& cur, std::vector<Pending>& out) {
  if (a.ptr == nullptr || a.bytes == 0) return;
  auto begin = reinterpret_cast<uintptr_t>(a.ptr);
  uintptr_t end = begin + a.bytes;
  for (auto it = cover(begin, end); it != segments_.end() && it->first < end; ++it) {
    check_segment(it->first, it->second, cur, out);
  }
}

void Sanitizer::apply_access(const Access& a, const Record& cur, bool poison) {
  if (a.ptr == nullptr || a.bytes == 0) return;
  auto begin = reinterpret_cast<uintptr_t>(a.ptr);
  uintptr_t end = begin + a.bytes;
  for (auto it = cover(begin, end); it != segments_.end() && it->first < end; ++it) {
    Segment& seg = it->second;
    Record r = cur;
    r.alloc = seg.alloc;
    if (writes_of(cur.mode)) {
      seg.has_write = true;
      seg.write = r;
      seg.reads.clear();
      seg.initialized = !poison;
    } else {
      auto same = std::find_if(seg.reads.begin(), seg.reads.end(), [&](const Record& x) { return x.stream == r.stream; });
      if (same != seg.reads.end()) *same = r;
      else seg.reads.push_back(r);
    }
  }
  coalesce(begin, end);
}

AccessSite Sanitizer::site(const Record& r) const {
  AccessSite s;
  s.op = names_[r.name];
  s.mode = r.mode;
  s.seq = r.seq;
  if (r.stream == kHost) {
    s.stream_id = -1;
    s.stream_name = "host";
  } else {
    s.stream_id = streams_[r.stream].id;
    s.stream_name = streams_[r.stream].name;
  }
  return s;
}

RaceReport Sanitizer::make_report(const Pending& p, const Record& cur) const {
  RaceReport r;
  r.kind = p.kind;
  r.current = site(cur);
  if (p.has_previous) {
    r.previous = site(p.previous);
  } else {
    r.previous.op = "allocation #" + std::to_string(p.alloc);
    r.previous.stream_name = "host";
    r.previous.mode = AccessMode::kWrite;
  }
  r.ptr = reinterpret_cast<const void*>(p.lo);
  r.bytes = p.hi - p.lo;
  std::string where = "bytes [" + hex(p.lo) + ", " + hex(p.hi) + ") (" + std::to_string(r.bytes) + " bytes)";
  if (p.alloc != 0) {
    const Allocation& a = allocs_[p.alloc - 1];
    r.buffer = reinterpret_cast<const void*>(a.begin);
    r.buffer_bytes = a.bytes;
    where += " = offset " + std::to_string(p.lo - a.begin) + " of buffer " + hex(a.begin) + " (" +
             std::to_string(a.bytes) + " bytes, allocation #" + std::to_string(p.alloc) + ")";
  }
  r.message = std::string("stream sanitizer: ") + to_string(r.kind) + " on " + where + ": " + describe(r.current);
  if (p.kind == HazardKind::kUninitializedRead || p.kind == HazardKind::kUseAfterFree) {
    r.message += " touches them; " + hint(r);
  } else {
    r.message += " is not ordered after " + describe(r.previous) + "; " + hint(r);
  }
  return r;
}

void Sanitizer::emit(std::vector<Pending>& pending, const Record& cur) {
  if (pending.empty()) return;
  size_t first = reports_.size();
  for (const Pending& p : pending) reports_.push_back(make_report(p, cur));
  if (options_.throw_on_first) throw RaceError(reports_[first]);
}

// ---- the hooks that carry accesses ---------------------------------------------------------------------

void Sanitizer::on_launch(const Stream& s, uint64_t seq, const Op& op) {
  std::lock_guard lk(mu_);
  uint32_t si = stream_index(s);
  Record cur{si, intern(op.name), seq, 0, AccessMode::kRead};
  std::vector<Pending> pending;
  for (const Access& a : op.accesses) {
    cur.mode = a.mode;
    check_access(a, cur, pending);
    emit(pending, cur);  // per access, so that each report carries this access's mode
    pending.clear();
  }
  // Only now (the launch goes ahead): tick the stream's own component and remember the accesses.
  Clock& c = streams_[si].clock;
  if (c.size() <= si) c.resize(si + 1, 0);
  c[si] = seq;
  for (const Access& a : op.accesses) {
    cur.mode = a.mode;
    apply_access(a, cur, op.fills_garbage);
  }
}

void Sanitizer::host_write(const void* p, size_t bytes) {
  std::lock_guard lk(mu_);
  Access a = writes(p, bytes);
  Record cur{kHost, intern("host write"), 0, 0, AccessMode::kWrite};
  std::vector<Pending> pending;
  check_access(a, cur, pending);
  emit(pending, cur);
  apply_access(a, cur, false);
}

void Sanitizer::host_read(const void* p, size_t bytes) {
  std::lock_guard lk(mu_);
  Record cur{kHost, intern("host read"), 0, 0, AccessMode::kRead};
  std::vector<Pending> pending;
  check_access(reads(p, bytes), cur, pending);
  emit(pending, cur);
}

void Sanitizer::on_alloc(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  std::lock_guard lk(mu_);
  auto begin = reinterpret_cast<uintptr_t>(p);
  allocs_.push_back({begin, bytes});
  auto id = static_cast<uint32_t>(allocs_.size());
  // The earlier owner's records stay: the first conflicting use of the new allocation reports them as reuse.
  for (auto it = cover(begin, begin + bytes); it != segments_.end() && it->first < begin + bytes; ++it) {
    it->second.alloc = id;
    it->second.initialized = false;
    it->second.freed = false;
  }
  coalesce(begin, begin + bytes);
}

void Sanitizer::on_free(const void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  std::lock_guard lk(mu_);
  auto begin = reinterpret_cast<uintptr_t>(p);
  uintptr_t end = begin + bytes;
  Record cur{kHost, intern("free"), 0, 0, AccessMode::kWrite};
  std::vector<Pending> pending;
  if (options_.host_ordered_free) {
    for (auto it = cover(begin, end); it != segments_.end() && it->first < end; ++it) {
      const Segment& seg = it->second;
      if (seg.freed) continue;
      auto check = [&](const Record& r) {
        if (host_ordered(r)) return;
        Pending x{HazardKind::kFreeWhileInUse, true, r, seg.alloc, it->first, seg.end};
        for (Pending& q : pending) {
          if (q.previous.stream == r.stream && q.previous.seq == r.seq) {
            q.lo = std::min(q.lo, x.lo);
            q.hi = std::max(q.hi, x.hi);
            return;
          }
        }
        pending.push_back(x);
      };
      if (seg.has_write) check(seg.write);
      for (const Record& r : seg.reads) check(r);
    }
    emit(pending, cur);
  }
  if (options_.host_ordered_free) {
    // The bytes go back to the heap, which may hand them to memory nobody announces (weights, a vector):
    // forget them. A racy free has been reported above.
    split_at(begin);
    split_at(end);
    segments_.erase(segments_.lower_bound(begin), segments_.lower_bound(end));
    return;
  }
  // Stream-ordered: the bytes stay in the allocator's pool until the next on_alloc; keep the records for the
  // reuse check.
  for (auto it = cover(begin, end); it != segments_.end() && it->first < end; ++it) it->second.freed = true;
  coalesce(begin, end);
}

void Sanitizer::on_graph_launch(const Stream& s, uint64_t seq, const GraphExec& exec) {
  std::lock_guard lk(mu_);
  std::shared_ptr<const void> id = exec.impl();
  bool checked = std::any_of(checked_graphs_.begin(), checked_graphs_.end(),
                             [&](const std::weak_ptr<const void>& w) { return w.lock() == id; });
  if (!checked) {
    std::erase_if(checked_graphs_, [](const auto& w) { return w.expired(); });
    checked_graphs_.push_back(id);
    std::vector<RaceReport> inner = check_graph(exec.nodes());
    if (!inner.empty()) {
      size_t first = reports_.size();
      reports_.insert(reports_.end(), inner.begin(), inner.end());
      if (options_.throw_on_first) throw RaceError(reports_[first]);
    }
  }
  // Node by node in capture order (a topological order), each checked then applied, so that a node reading
  // what an earlier node of the same replay wrote sees it initialised. Within a replay everything counts as
  // one position (s, seq); the graph's own order was checked above.
  uint32_t si = stream_index(s);
  Clock& c = streams_[si].clock;
  if (c.size() <= si) c.resize(si + 1, 0);
  c[si] = seq;
  std::vector<Pending> pending;
  for (const GraphNode& node : exec.nodes()) {
    Record cur{si, intern(node.op.name + " (graph replay)"), seq, 0, AccessMode::kRead};
    for (const Access& a : node.op.accesses) {
      cur.mode = a.mode;
      check_access(a, cur, pending);
      emit(pending, cur);
      pending.clear();
    }
    for (const Access& a : node.op.accesses) {
      cur.mode = a.mode;
      apply_access(a, cur, node.op.fills_garbage);
    }
  }
}

// ---- registration --------------------------------------------------------------------------------------

std::shared_ptr<Sanitizer> enable_sanitizer(Device& device, SanitizerOptions options) {
  auto san = std::make_shared<Sanitizer>(options);
  device.add_observer(san);
  std::lock_guard lk(g_registry_mu);
  std::erase_if(g_registry, [](const auto& e) { return e.second.expired(); });
  g_registry.emplace_back(&device, san);
  g_registry_size.store(static_cast<int>(g_registry.size()), std::memory_order_release);
  return san;
}

void disable_sanitizer(Device& device, const Sanitizer& sanitizer) {
  device.remove_observer(&sanitizer);
  std::lock_guard lk(g_registry_mu);
  std::erase_if(g_registry, [&](const auto& e) { return e.second.expired() || e.second.lock().get() == &sanitizer; });
  g_registry_size.store(static_cast<int>(g_registry.size()), std::memory_order_release);
}

void note_host_write(Device& device, const void* p, size_t bytes) {
  if (g_registry_size.load(std::memory_order_acquire) == 0) return;
  std::vector<std::shared_ptr<Sanitizer>> found;
  {
    std::lock_guard lk(g_registry_mu);
    for (const auto& [dev, weak] : g_registry) {
      if (dev != &device) continue;
      if (auto s = weak.lock()) found.push_back(std::move(s));
    }
  }
  for (const auto& s : found) s->host_write(p, bytes);
}

}  // namespace moe::rt
