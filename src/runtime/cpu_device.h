// Internal: the CPU device. A pool of worker threads acts as a GPU's multiprocessors; every stream is an
// in-order queue of entries (ops, event records, event waits) and the scheduler hands free workers tiles of
// the ready head op of every stream, highest priority (lowest number) first.
//
// Invariants (all under CpuCore::mu_):
//   - a stream's queue holds its entries not yet completed, in order; `completed` is the seq of the last
//     entry popped, so an event bound to (stream, seq) is complete exactly when completed >= seq;
//   - records, satisfied waits, empty ops and ops of a stream in the error state never stay at the head:
//     advance() completes them as soon as they get there, so a worker only ever sees ops with work to do
//     and unsatisfied waits, which it skips (no worker ever blocks on an event).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "runtime/stream_impl.h"

namespace moe::rt {

struct CpuEntry {
  enum class Kind : uint8_t { kOp, kRecord, kWait, kGraph };
  Kind kind = Kind::kOp;
  uint64_t seq = 0;
  Op op;
  // kWait: the binding captured at wait time (null stream: never recorded, a no-op).
  std::shared_ptr<StreamImpl> wait_stream;
  uint64_t wait_seq = 0;
  // kOp progress.
  int next_tile = 0;
  int tiles_done = 0;
  bool started = false;
  bool polling = false;     // a worker is inside poll() now
  bool poll_phase = false;  // tiles done, polling until poll() returns true
  int64_t next_poll_ns = 0;
  std::vector<int> tile_order;        // shuffled tile order (fuzzing only)
  std::unique_ptr<OpRecord> trace;    // tracing only
  // kGraph: one replay of an instantiated graph (cpu_graph.cpp); its nodes are scheduled as one DAG.
  std::shared_ptr<GraphExecImpl> graph;
  std::vector<OpRecord> node_traces;  // tracing only, one per node
};

// Recycles a stream queue's node blocks: a queue that fills and drains (a forward enqueues a dozen
// entries, the workers retire them) then costs no heap allocation per entry, where std::deque would take
// and free a block every entry or two. Used under CpuCore::mu_ only, like the queue itself.
class BlockPool {
 public:
  BlockPool() = default;
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool();
  void* get(size_t bytes);
  void put(void* block, size_t bytes);

 private:
  std::vector<std::pair<size_t, std::vector<void*>>> free_;  // by block size (a deque uses two)
};

template <class T>
struct PoolAllocator {
  using value_type = T;
  BlockPool* pool;
  explicit PoolAllocator(BlockPool* p) : pool(p) {}
  template <class U>
  PoolAllocator(const PoolAllocator<U>& o) : pool(o.pool) {}  // NOLINT: rebinding must be implicit
  T* allocate(size_t n) { return static_cast<T*>(pool->get(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { pool->put(p, n * sizeof(T)); }
  friend bool operator==(const PoolAllocator& a, const PoolAllocator& b) { return a.pool == b.pool; }
};

// A failed operation, as reported: the message names the operation, its position and its stream.
struct CpuFailure {
  std::string message;
  const StreamImpl* origin = nullptr;  // the stream it failed on
};

struct CpuStream : StreamImpl {
  BlockPool pool;  // before the queue: outlives it
  std::deque<CpuEntry, PoolAllocator<CpuEntry>> queue{PoolAllocator<CpuEntry>(&pool)};
  // The error state: set by a failed op or inherited through a wait (error_via: the wait's position, 0 for
  // the stream's own); cleared when synchronize() reports it. Entries completed while it is set are skipped.
  std::shared_ptr<const CpuFailure> error;
  uint64_t error_from = 0;  // the first position the error covers
  uint64_t error_via = 0;
  // The positions [cleared_from, cleared_to] that the last reported error covered: a wait evaluated after
  // the report still inherits it when it waits on a skipped entry.
  std::shared_ptr<const CpuFailure> cleared;
  uint64_t cleared_from = 0, cleared_to = 0;
};

// What a worker took from the scheduler: one tile, or one poll() call.
struct CpuWork {
  CpuStream* stream = nullptr;
  CpuEntry* entry = nullptr;
  int tile = -1;  // -1: a poll
  int node = -1;  // >= 0: a tile of this node of the graph entry
  bool run = true;  // false: the stream failed meanwhile; count the tile without running it
  int delay_us = 0;
};

class CpuCore : public DeviceCore {
 public:
  CpuCore(Device* dev, const CpuDeviceOptions& options);
  ~CpuCore() override;
  void start();  // spawns the workers (after the core is owned by a shared_ptr)
  void shutdown();  // drains every stream, then stops and joins the workers

  std::shared_ptr<CpuStream> create_stream(int priority, std::string name, std::weak_ptr<DeviceCore> self);
  void synchronize_all();
  void set_tracing(bool on);
  Trace take_trace();
  int num_workers() const { return num_workers_; }

  uint64_t enqueue_op(const std::shared_ptr<StreamImpl>& s, Op&& op) override;
  uint64_t enqueue_record(const std::shared_ptr<StreamImpl>& s, EventImpl& event) override;
  uint64_t enqueue_wait(const std::shared_ptr<StreamImpl>& s, const EventBinding& binding) override;
  uint64_t enqueue_graph(const std::shared_ptr<StreamImpl>& s, const std::shared_ptr<GraphExecImpl>& g) override;
  void synchronize_stream(StreamImpl& s) override;
  void wait_host(StreamImpl& s, uint64_t seq) override;

 private:
  int64_t now_ns() const;
  CpuEntry& push_entry(CpuStream& s, CpuEntry::Kind kind);
  void after_push(CpuStream& s);
  // Scheduler (cpu_scheduler.cpp).
  void worker_main(int worker);
  bool pick(CpuWork& work);
  bool pick_from(CpuStream& s, CpuWork& work, int64_t now);
  void run_work(const CpuWork& work, int worker, std::unique_lock<std::mutex>& lk);
  void finish_tile(const CpuWork& work, int worker, int64_t t0, int64_t t1, const std::string* error);
  void finish_poll(const CpuWork& work, bool done, const std::string* error);
  void fail(CpuStream& s, uint64_t seq, const std::string& op_name, const std::string& what);
  // A satisfied wait at `seq` of `s` on position `wait_seq` of `from`: inherits from's error if that covers it.
  void inherit_error(CpuStream& s, uint64_t seq, const CpuStream& from, uint64_t wait_seq);
  // Reports s's error and clears it on every stream that holds it.
  [[noreturn]] void throw_error(CpuStream& s);
  // Graph replay (cpu_graph.cpp).
  bool start_graph(CpuStream& s, CpuEntry& e);
  bool pick_graph(CpuStream& s, CpuEntry& e, CpuWork& work, int64_t now);
  void graph_node_done(CpuStream& s, CpuEntry& e, int node);
  // A node whose dependencies are done: to the ready queue (tiles), its poll phase, or done (nothing to run).
  void graph_node_ready(CpuStream& s, CpuEntry& e, int node);
  void graph_start_poll(CpuEntry& e, int node);
  void finish_graph_tile(const CpuWork& work, int worker, int64_t t0, int64_t t1, const std::string* error);
  void finish_graph_poll(const CpuWork& work, bool done, const std::string* error);
  void finish_graph_if_done(CpuStream& s, CpuEntry& e);
  void complete_head(CpuStream& s);
  bool advance(CpuStream& s);
  void advance_all();
  void bump();
  void idle(std::unique_lock<std::mutex>& lk);
  void pin_workers();
  void wait_until(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done);
  bool all_idle() const;

  const CpuDeviceOptions options_;
  const int num_workers_;
  const std::chrono::steady_clock::time_point t0_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // idle workers
  // A host thread asleep in synchronize: woken only once its condition holds, so that completing an op does
  // not wake (and steal a core for) a host thread whose stream is not done yet.
  struct HostWaiter {
    const std::function<bool()>* done;
    std::condition_variable cv;
  };
  std::vector<HostWaiter*> host_waiters_;
  std::atomic<uint64_t> gen_{0};     // bumped on every scheduling change; idle workers spin on it
  int num_sleepers_ = 0;
  // How often an op (or graph node) in its poll phase is polled when nothing else is ready.
  static constexpr int64_t kPollIntervalNs = 20'000;
  int num_poll_heads_ = 0;  // ops in their poll phase: sleeping workers must wake up to poll them
  bool stop_ = false;

  std::vector<std::shared_ptr<CpuStream>> streams_;  // creation order; owns the streams
  std::vector<CpuStream*> order_;                    // scheduling order: priority, then creation
  CpuStream* serial_owner_ = nullptr;  // fuzz.serialize_streams: the stream whose op is running
  std::mt19937_64 rng_;
  bool tracing_ = false;
  Trace trace_;
  std::vector<std::thread> workers_;
};

}  // namespace moe::rt
