// The worker side of the CPU device: workers take the ready head op of every stream (or a ready node of a
// graph replay), in scheduling order, claim its tiles and run them without the lock, and the worker that
// counts the last tile completes the op (cpu_device.h describes the counters and their ordering).
//
// Everything here runs under CpuCore::mu_ except run_tiles' loop and the poll calls. Entries live in a
// std::deque, whose references survive push_back, so a worker may hold a CpuEntry* while unlocked; the entry
// is popped only by whoever finishes its last tile or poll.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>

#include "runtime/cpu_device.h"
#include "runtime/graph_capture.h"

namespace moe::rt {

static_assert(std::atomic_ref<int>::required_alignment <= alignof(int));
static_assert(std::atomic_ref<bool>::required_alignment <= alignof(bool));

namespace {
std::string describe_failure(const CpuStream& s, uint64_t seq, const std::string& op_name,
                             const std::string& what) {
  return op_name + " (position " + std::to_string(seq) + ") on stream '" + s.name + "' (id " +
         std::to_string(s.id) + ") failed: " + what;
}

// How a failing op or graph node is named in the stream's error.
std::string work_label(const CpuWork& w) {
  if (w.node < 0) return "op '" + w.op->name + "'";
  const GraphNode& n = w.entry->graph->nodes[w.node];
  return "graph node " + std::to_string(w.node) + " op '" + n.op.name + "' (captured on stream '" + n.stream_name +
         "')";
}

// Calls f, returning false with the exception's message if it throws.
template <class F>
bool call(F&& f, std::string& error) {
  try {
    f();
    return true;
  } catch (const std::exception& ex) {
    error = ex.what();
  } catch (...) {
    error = "unknown exception";
  }
  return false;
}
}  // namespace

void CpuCore::notify(bool from_worker) {
  gen_.fetch_add(1, std::memory_order_release);
  int want = wake_budget_ - (from_worker ? 1 : 0);
  wake_budget_ = 0;
  if (num_sleepers_ > 0 && want > 0) {
    if (want >= num_sleepers_) {
      work_cv_.notify_all();
    } else {
      for (int i = 0; i < want; ++i) work_cv_.notify_one();
    }
  }
  if (host_dirty_) {
    host_dirty_ = false;
    for (HostWaiter* w : host_waiters_)
      if ((*w->done)()) w->cv.notify_one();
  }
}

void CpuCore::worker_main(int worker) {
  std::unique_lock<std::mutex> lk(mu_);
  CpuWork work;
  bool busy = false;  // counted in num_busy_: written when this worker goes idle or leaves idle, not per pick
  for (;;) {
    if (pick(work)) {
      if (!busy) num_busy_.fetch_add(1, std::memory_order_relaxed);
      busy = true;
      if (work.tile < 0) {
        run_poll(work, lk);
      } else {
        run_tiles(work, worker, lk);
      }
      continue;
    }
    if (busy) num_busy_.fetch_sub(1, std::memory_order_relaxed);  // after the retire's gen_ bump, if any
    busy = false;
    if (stop_) return;
    idle(worker, lk);
  }
}

void CpuCore::idle(int worker, std::unique_lock<std::mutex>& lk) {
  uint64_t g = gen_.load(std::memory_order_acquire);
  if (options_.spin_us > 0) {
    // Not past spin_us while an op is in its poll phase: a poll falls due with time, not with a change of
    // gen_, and waits for a worker that sleeps at most a poll interval (one entering it changes gen_).
    const bool extend = spin_while_running_ && num_poll_heads_ == 0;
    lk.unlock();
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::microseconds(options_.spin_us);
    const auto running_deadline = start + std::chrono::microseconds(options_.spin_while_running_us);
    while (gen_.load(std::memory_order_acquire) == g) {
      const auto now = std::chrono::steady_clock::now();
      const bool peer_running = extend && num_busy_.load(std::memory_order_relaxed) > 0;
      if (now >= deadline && !(peer_running && now < running_deadline)) break;
      std::this_thread::yield();
    }
    lk.lock();
    if (gen_.load(std::memory_order_acquire) != g || stop_) return;
  }
  auto changed = [&] { return stop_ || gen_.load(std::memory_order_acquire) != g; };
  ++num_sleepers_;
  // Recorded when it begins, so that a trace taken while this worker sleeps has it (take_trace ends it there).
  // The naps between polls end on their own and are not recorded.
  const size_t record = tracing_ && num_poll_heads_ == 0 ? trace_.sleeps.size() : SIZE_MAX;
  const uint64_t epoch = trace_epoch_;
  if (record != SIZE_MAX) trace_.sleeps.push_back(SleepRecord{worker, now_ns(), -1});
  if (num_poll_heads_ > 0) {
    work_cv_.wait_for(lk, std::chrono::nanoseconds(kPollIntervalNs), changed);
  } else {
    work_cv_.wait(lk, changed);
  }
  --num_sleepers_;
  if (record != SIZE_MAX && epoch == trace_epoch_) trace_.sleeps[record].end_ns = now_ns();
}

bool CpuCore::pick(CpuWork& work) {
  if (options_.fuzz.hold_until_host_waits && host_waits_ == 0) return false;
  int64_t now = num_poll_heads_ > 0 ? now_ns() : 0;
  for (CpuStream* s : order_) {
    if (pick_from(*s, work, now)) return true;
  }
  return false;
}

bool CpuCore::pick_from(CpuStream& s, CpuWork& work, int64_t now) {
  if (s.queue.empty()) return false;
  CpuEntry& e = s.queue.front();
  if (e.kind == CpuEntry::Kind::kWait) return false;  // an unsatisfied wait: a dependency, not work
  if (options_.fuzz.serialize_streams && serial_owner_ != nullptr && serial_owner_ != &s) return false;
  if (e.kind == CpuEntry::Kind::kGraph) return e.started && pick_graph(s, e, work, now);
  work.node = -1;
  work.op = &e.op;
  if (e.poll_phase) {
    if (e.polling || now < e.next_poll_ns) return false;
    e.polling = 1;
    work.tile = -1;
  } else {
    // The first claim is made under the lock: until this worker counts it, the entry stays at the head.
    std::atomic_ref<int> next(e.next_tile);
    const int n = e.op.num_tiles;
    if (next.load(std::memory_order_relaxed) >= n) return false;
    int i = next.fetch_add(1, std::memory_order_relaxed);
    if (i >= n) return false;  // the other workers took the last ones meanwhile
    work.tile = i;
    work.next = &e.next_tile;
    work.done = &e.tiles_done;
    work.order = e.tile_order.empty() ? nullptr : e.tile_order.data();
    work.trace = e.trace.get();
  }
  if (!e.started) {
    e.started = true;
    if (e.trace) e.trace->start_ns = now_ns();
    if (options_.fuzz.serialize_streams) serial_owner_ = &s;
  }
  work.stream = &s;
  work.entry = &e;
  work.delay_us = options_.fuzz.max_delay_us > 0
                      ? std::uniform_int_distribution<int>(0, options_.fuzz.max_delay_us)(rng_)
                      : 0;
  return true;
}

// Runs the claimed tile and claims the next ones, unlocked, until the op's tiles run out, the scheduling
// state changes (a higher-priority op may be ready: pick again), a poll is due or the entry fails; then
// counts them.
void CpuCore::run_tiles(const CpuWork& work, int worker, std::unique_lock<std::mutex>& lk) {
  const Op& op = *work.op;
  const int n = op.num_tiles;
  std::atomic_ref<int> next(*work.next);
  std::atomic_ref<bool> failed(work.entry->failed);
  const uint64_t gen = gen_.load(std::memory_order_relaxed);
  // A fuzzed delay is drawn per pick, so each tile gets its own: one tile per pick.
  const bool one_tile = options_.fuzz.max_delay_us > 0;
  // Ops in their poll phase are polled between tiles, as often as idle workers would poll them: pick again
  // after a poll interval. (One entering its poll phase meanwhile changes gen_.)
  const int64_t repick_ns = num_poll_heads_ > 0 ? now_ns() + kPollIntervalNs : 0;
  lk.unlock();
  if (work.delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(work.delay_us));
  int count = 0;  // tiles run (or skipped) by this call, not yet added to tiles_done
  std::string error;
  for (int i = work.tile;;) {
    // Relaxed: a stale flag only runs one more tile of a failed entry, as a tile already running would.
    bool skip = failed.load(std::memory_order_relaxed);
    if (!skip) {
      const int tile = work.order ? work.order[i] : i;
      const int64_t t0 = work.trace ? now_ns() : 0;
      const bool ok = call([&] { op.tile(tile); }, error);
      if (work.trace) work.trace->tiles[i] = TileRecord{tile, worker, t0, now_ns()};  // it ran, even if it threw
      if (!ok) {
        // Close the handing out before taking the lock, which every pick and retire contends for: from here
        // on no claim succeeds, so only tiles claimed before now can still start. The op cannot retire before
        // the failure is recorded: this worker's count, added below, is one it waits for.
        failed.store(true, std::memory_order_relaxed);
        const int rest = next.exchange(n, std::memory_order_relaxed);
        count += 1 + std::max(0, n - rest);
        lk.lock();
        fail_work(work, error);
        lk.unlock();
        break;
      }
    }
    ++count;
    if (skip) {  // hand out no more tiles of this op: count the unclaimed ones as skipped
      const int rest = next.exchange(n, std::memory_order_relaxed);
      count += std::max(0, n - rest);
      break;
    }
    if (i + 1 >= n) break;  // that was the last index: no claim can succeed
    if (one_tile || gen_.load(std::memory_order_relaxed) != gen) break;
    if (repick_ns > 0 && now_ns() >= repick_ns) break;
    i = next.fetch_add(1, std::memory_order_relaxed);
    if (i >= n) break;
  }
  // Release: this worker's tile writes (and trace slots) before the count; acquire: the last counter sees
  // every other worker's. A worker that ran every tile (a one-tile op) has nobody to count with.
  const int total =
      count == n ? n : std::atomic_ref<int>(*work.done).fetch_add(count, std::memory_order_acq_rel) + count;
  lk.lock();
  if (total == n) tiles_finished(work);
}

void CpuCore::run_poll(const CpuWork& work, std::unique_lock<std::mutex>& lk) {
  lk.unlock();
  if (work.delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(work.delay_us));
  std::string error;
  bool done = false;
  const bool ok = call([&] { done = work.op->poll(); }, error);
  lk.lock();
  finish_poll(work, done, ok ? nullptr : &error);
}

void CpuCore::fail_work(const CpuWork& work, const std::string& what) {
  std::atomic_ref<bool>(work.entry->failed).store(true, std::memory_order_relaxed);
  fail(*work.stream, work.entry->seq, work_label(work), what);
}

void CpuCore::fail(CpuStream& s, uint64_t seq, const std::string& op_name, const std::string& what) {
  if (s.error) return;  // the first error is the one reported
  s.error = std::make_shared<const CpuFailure>(CpuFailure{describe_failure(s, seq, op_name, what), &s});
  s.error_from = seq;
  s.error_via = 0;
}

// Every entry of `from` at or after error_from completed without running while the error was set (or while
// the cleared one was, up to cleared_to), so a wait on such a position depends on the failed operation.
void CpuCore::inherit_error(CpuStream& s, uint64_t seq, const CpuStream& from, uint64_t wait_seq) {
  if (s.error) return;
  std::shared_ptr<const CpuFailure> f;
  if (from.error && from.error_from <= wait_seq) {
    f = from.error;
  } else if (from.cleared && from.cleared_from <= wait_seq && wait_seq <= from.cleared_to) {
    f = from.cleared;
  }
  if (!f) return;
  s.error = std::move(f);
  s.error_from = seq;
  s.error_via = seq;
}

void CpuCore::tiles_finished(const CpuWork& work) {
  // Slots of tiles skipped after a failure were never written.
  if (work.trace) std::erase_if(work.trace->tiles, [](const TileRecord& r) { return r.worker < 0; });
  if (work.op->poll && !work.stream->error) return start_poll(work);  // its tiles done, it polls next
  work_done(work);
}

void CpuCore::start_poll(const CpuWork& work) {
  if (work.node >= 0) {
    graph_start_poll(*work.entry, work.node);
  } else {
    work.entry->poll_phase = true;
    ++num_poll_heads_;
    ++wake_budget_;
  }
  notify(true);
}

void CpuCore::finish_poll(const CpuWork& work, bool done, const std::string* error) {
  CpuEntry& e = *work.entry;
  if (error) fail_work(work, *error);
  if (work.node >= 0) {
    GraphExecImpl& g = *e.graph;
    g.polling[work.node] = 0;
    if (!done && !error) {
      g.next_poll_ns[work.node] = now_ns() + kPollIntervalNs;
      return;
    }
    g.polls.erase(std::find(g.polls.begin(), g.polls.end(), work.node));  // a handful at most
  } else {
    e.polling = 0;
    if (!done && !error) {
      e.next_poll_ns = now_ns() + kPollIntervalNs;
      return;
    }
  }
  --num_poll_heads_;
  work_done(work);
}

void CpuCore::work_done(const CpuWork& work) {
  if (work.node < 0) return complete_head(*work.stream);
  graph_node_done(*work.stream, *work.entry, work.node);
  finish_graph_if_done(*work.stream, *work.entry);
}

// Pops the head op that a worker finished, then lets every stream move on.
void CpuCore::complete_head(CpuStream& s) {
  CpuEntry& e = s.queue.front();
  if (e.trace) {
    e.trace->end_ns = now_ns();
    trace_.ops.push_back(std::move(*e.trace));
  }
  if (serial_owner_ == &s) {
    // Fuzzing's one-stream-at-a-time: the heads other streams announced while this one owned the device
    // spent their wake-ups then; they may start now, so wake every sleeper.
    serial_owner_ = nullptr;
    wake_budget_ += num_workers_ + 1;
  }
  pop_head(s);
  advance_all();
  notify(true);
}

void CpuCore::pop_head(CpuStream& s) {
  uint64_t seq = s.queue.front().seq;
  s.queue.pop_front();
  s.completed.store(seq, std::memory_order_release);
  host_dirty_ = true;
}

// Completes the entries at the head of `s` that need no worker. Returns whether any completed.
bool CpuCore::advance(CpuStream& s) {
  bool any = false;
  while (!s.queue.empty()) {
    CpuEntry& e = s.queue.front();
    if (e.kind == CpuEntry::Kind::kWait) {
      if (e.wait_stream && e.wait_stream->completed.load(std::memory_order_acquire) < e.wait_seq) break;
      if (e.wait_stream) {
        inherit_error(s, e.seq, static_cast<const CpuStream&>(*e.wait_stream), e.wait_seq);
        if (tracing_) trace_.edges.push_back(EdgeRecord{e.wait_stream->id, e.wait_seq, s.id, e.seq, now_ns()});
      }
    } else if (e.kind == CpuEntry::Kind::kGraph) {
      if (e.started) break;
      if (options_.fuzz.serialize_streams && serial_owner_ != nullptr && serial_owner_ != &s) break;
      // Another replay of the same GraphExec still running holds this one back (one replay at a time).
      if (!s.error && (e.graph->running || !start_graph(s, e))) break;
    } else if (e.kind == CpuEntry::Kind::kOp) {
      if (e.started || e.poll_phase) break;
      if (!s.error) {
        if (e.op.num_tiles > 0) {
          if (!e.announced) wake_budget_ += e.op.num_tiles;
          e.announced = true;
          break;
        }
        if (e.op.poll) {
          e.poll_phase = true;
          ++num_poll_heads_;
          ++wake_budget_;
          break;
        }
        if (e.trace) {  // an empty op: done the moment it is ready
          e.trace->start_ns = e.trace->end_ns = now_ns();
          trace_.ops.push_back(std::move(*e.trace));
        }
      }
    }
    pop_head(s);
    any = true;
  }
  return any;
}

void CpuCore::advance_all() {
  bool changed = true;
  while (changed) {
    changed = false;
    for (auto& s : streams_) changed |= advance(*s);
  }
}

}  // namespace moe::rt
