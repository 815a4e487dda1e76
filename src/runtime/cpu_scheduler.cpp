// The worker side of the CPU device: workers take tiles (or poll() calls) of the ready head op of every
// stream, in scheduling order, run them without the lock, and complete the op when its last tile is done.
//
// Everything here runs under CpuCore::mu_ except the tile and poll calls themselves. Entries live in a
// std::deque, whose references survive push_back, so a worker may hold a CpuEntry* while unlocked; the entry
// is popped only by whoever finishes its last tile or poll.
#include <stdexcept>

#include "runtime/cpu_device.h"
#include "runtime/graph_capture.h"

namespace moe::rt {

namespace {
std::string describe_failure(const CpuStream& s, uint64_t seq, const std::string& op_name,
                             const std::string& what) {
  return op_name + " (position " + std::to_string(seq) + ") on stream '" + s.name + "' (id " +
         std::to_string(s.id) + ") failed: " + what;
}
}  // namespace

void CpuCore::bump() {
  gen_.fetch_add(1, std::memory_order_release);
  if (num_sleepers_ > 0) work_cv_.notify_all();
  for (HostWaiter* w : host_waiters_)
    if ((*w->done)()) w->cv.notify_one();
}

void CpuCore::worker_main(int worker) {
  std::unique_lock<std::mutex> lk(mu_);
  CpuWork work;
  for (;;) {
    if (pick(work)) {
      run_work(work, worker, lk);
      continue;
    }
    if (stop_) return;
    idle(lk);
  }
}

void CpuCore::idle(std::unique_lock<std::mutex>& lk) {
  uint64_t g = gen_.load(std::memory_order_acquire);
  if (options_.spin_us > 0) {
    lk.unlock();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(options_.spin_us);
    while (gen_.load(std::memory_order_acquire) == g && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    lk.lock();
    if (gen_.load(std::memory_order_acquire) != g || stop_) return;
  }
  auto changed = [&] { return stop_ || gen_.load(std::memory_order_acquire) != g; };
  ++num_sleepers_;
  if (num_poll_heads_ > 0) {
    work_cv_.wait_for(lk, std::chrono::nanoseconds(kPollIntervalNs), changed);
  } else {
    work_cv_.wait(lk, changed);
  }
  --num_sleepers_;
}

bool CpuCore::pick(CpuWork& work) {
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
  if (e.poll_phase) {
    if (e.polling || now < e.next_poll_ns) return false;
    e.polling = true;
    work.tile = -1;
  } else {
    if (e.next_tile >= e.op.num_tiles) return false;
    int i = e.next_tile++;
    work.tile = e.tile_order.empty() ? i : e.tile_order[i];
  }
  if (!e.started) {
    e.started = true;
    if (e.trace) e.trace->start_ns = now_ns();
    if (options_.fuzz.serialize_streams) serial_owner_ = &s;
  }
  work.stream = &s;
  work.entry = &e;
  work.run = !s.error;
  work.delay_us = options_.fuzz.max_delay_us > 0
                      ? std::uniform_int_distribution<int>(0, options_.fuzz.max_delay_us)(rng_)
                      : 0;
  return true;
}

void CpuCore::run_work(const CpuWork& work, int worker, std::unique_lock<std::mutex>& lk) {
  // Both set at enqueue, before this worker saw the entry.
  const bool tracing = work.entry->trace != nullptr || !work.entry->node_traces.empty();
  const Op& op = work.node >= 0 ? work.entry->graph->nodes[work.node].op : work.entry->op;
  lk.unlock();
  if (work.delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(work.delay_us));
  std::string error;
  bool failed = false;
  bool done = false;
  int64_t t0 = tracing ? now_ns() : 0;
  try {
    if (work.tile < 0) {
      done = op.poll();
    } else if (work.run) {
      op.tile(work.tile);
    }
  } catch (const std::exception& ex) {
    failed = true;
    error = ex.what();
  } catch (...) {
    failed = true;
    error = "unknown exception";
  }
  int64_t t1 = tracing ? now_ns() : 0;
  lk.lock();
  if (work.tile < 0 && work.node >= 0) {
    finish_graph_poll(work, done, failed ? &error : nullptr);
  } else if (work.tile < 0) {
    finish_poll(work, done, failed ? &error : nullptr);
  } else if (work.node >= 0) {
    finish_graph_tile(work, worker, t0, t1, failed ? &error : nullptr);
  } else {
    finish_tile(work, worker, t0, t1, failed ? &error : nullptr);
  }
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

void CpuCore::finish_tile(const CpuWork& work, int worker, int64_t t0, int64_t t1, const std::string* error) {
  CpuStream& s = *work.stream;
  CpuEntry& e = *work.entry;
  if (error) fail(s, e.seq, "op '" + e.op.name + "'", *error);
  if (e.trace && work.run) e.trace->tiles.push_back(TileRecord{work.tile, worker, t0, t1});
  if (++e.tiles_done < e.op.num_tiles) return;
  if (e.op.poll && !s.error) {
    e.poll_phase = true;
    ++num_poll_heads_;
    bump();
    return;
  }
  complete_head(s);
}

void CpuCore::finish_poll(const CpuWork& work, bool done, const std::string* error) {
  CpuStream& s = *work.stream;
  CpuEntry& e = *work.entry;
  e.polling = false;
  if (error) fail(s, e.seq, "op '" + e.op.name + "'", *error);
  if (done || error) {
    --num_poll_heads_;
    complete_head(s);
  } else {
    e.next_poll_ns = now_ns() + kPollIntervalNs;
  }
}

// Pops the head op that a worker finished, then lets every stream move on.
void CpuCore::complete_head(CpuStream& s) {
  CpuEntry& e = s.queue.front();
  if (e.trace) {
    e.trace->end_ns = now_ns();
    trace_.ops.push_back(std::move(*e.trace));
  }
  if (serial_owner_ == &s) serial_owner_ = nullptr;
  uint64_t seq = e.seq;
  s.queue.pop_front();
  s.completed.store(seq, std::memory_order_release);
  advance_all();
  bump();
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
        if (e.op.num_tiles > 0) break;
        if (e.op.poll) {
          e.poll_phase = true;
          ++num_poll_heads_;
          break;
        }
        if (e.trace) {  // an empty op: done the moment it is ready
          e.trace->start_ns = e.trace->end_ns = now_ns();
          trace_.ops.push_back(std::move(*e.trace));
        }
      }
    }
    uint64_t seq = e.seq;
    s.queue.pop_front();
    s.completed.store(seq, std::memory_order_release);
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
