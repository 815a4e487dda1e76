// Internal: the CPU device. A pool of worker threads acts as a GPU's multiprocessors; every stream is an
// in-order queue of entries (ops, event records, event waits, graph replays) and the scheduler hands free
// workers the ready head op of every stream, highest priority (lowest number) first.
//
// Invariants under CpuCore::mu_ (the queues and everything that changes what is ready):
//   - a stream's queue holds its entries not yet completed, in order; `completed` is the seq of the last
//     entry popped, so an event bound to (stream, seq) is complete exactly when completed >= seq;
//   - records, satisfied waits, empty ops and ops of a stream in the error state never stay at the head:
//     advance() completes them as soon as they get there, so a worker only ever sees ops with work to do
//     and unsatisfied waits, which it skips (no worker ever blocks on an event);
//   - enqueue, advance, poll phases, event waits, errors and graph node readiness all change under it.
//
// Tiles are claimed without the lock, as a GPU's block scheduler hands out blocks. Each op (and each graph
// node) has two counters, accessed through std::atomic_ref: `next_tile`, the next tile index to claim
// (fetch_add), and `tiles_done`, the tiles finished or skipped. A worker claims an op's first tile under
// the lock (pick), then unlocks and claims the following ones with fetch_add until they run out, the
// scheduling state changes (gen_: a higher-priority op may have become ready) or a poll falls due; it adds
// its tiles to `tiles_done` once, and the worker whose addition reaches num_tiles takes the lock and retires
// the op (its poll phase, or completion and advance). A worker touches the counters unlocked only while it
// holds a tile it has not counted yet, so the op cannot be retired (nor its entry popped) under it. A
// failing tile sets the entry's `failed` flag under the lock; a worker that sees it closes the counter
// (exchange to num_tiles) and counts the unclaimed tiles as skipped: no more tiles of the op run.
//
// Memory ordering: a tile's writes are sequenced before its worker's release addition to `tiles_done`, and
// the retiring worker's acq_rel addition reads the end of that release sequence, so it happens after every
// tile of the op; it then completes the op under mu_, which whoever runs or waits on a successor acquires.
// The claims are relaxed: they only need to be unique, and the op itself was published under mu_.
//
// Waking: a scheduling change bumps gen_ (spinning workers watch it) and wakes at most as many sleeping
// workers as it made tiles or polls ready (one fewer when a worker made it: that worker picks next). Host
// waiters are checked only when an entry completed, the only thing they wait for.
//
// Spinning: an idle worker spins for spin_us, and past it (up to spin_while_running_us from when it went
// idle, counted again after every scheduling change) while another worker runs tiles or a poll, when the
// process has no more workers than CPUs and no op is in its poll phase. The end of that work is what makes
// the next op ready (in a one-stream forward, always), and waking a sleeper then costs the finishing worker
// a system call on the forward's critical path: 25-30 us in a KVM guest, at every op end where a tile
// outlasted spin_us. The cap bounds what a worker spends on a core another process may need; processes
// that share CPUs (expert-parallel ranks on one machine) turn it off (tools/moe-overlap/ep_launch.cpp).
// A worker counts as running (num_busy_) from a pick until it next goes idle, so that a chain of picks
// writes the shared counter once, not twice per pick: per node of a replay of empty one-tile ops, the
// per-pick count measured slower in bench_runtime.
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
  // kOp progress. next_tile and tiles_done are the tile counters (std::atomic_ref, see the top); failed is
  // written under the lock and read without it (std::atomic_ref) by the workers running this entry's tiles.
  int next_tile = 0;
  int tiles_done = 0;
  bool failed = false;      // a tile or poll of this op (kGraph: of any node) failed: its tiles left are skipped
  bool started = false;
  bool announced = false;   // its tiles were counted once in the wake budget
  char polling = 0;         // a worker is inside poll() now
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

// What a worker took from the scheduler: the first tile it claimed of an op or graph node (it claims the
// next ones itself), or one poll() call. The same for an eager op and a graph node: only the counters'
// and the trace's addresses differ.
struct CpuWork {
  CpuStream* stream = nullptr;
  CpuEntry* entry = nullptr;
  int node = -1;  // >= 0: a node of the graph entry
  const Op* op = nullptr;
  int tile = -1;  // the claimed tile index (an index into `order` when set); -1: a poll
  int* next = nullptr;  // the op's or node's tile counters
  int* done = nullptr;
  const int* order = nullptr;  // shuffled tile order (fuzzing), or null
  OpRecord* trace = nullptr;   // tracing: its tiles slots, one per claim index
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
  void run_tiles(const CpuWork& work, int worker, std::unique_lock<std::mutex>& lk);
  void run_poll(const CpuWork& work, std::unique_lock<std::mutex>& lk);
  // Under the lock: the last tile was counted; a poll returned. One path for eager ops and graph nodes.
  void tiles_finished(const CpuWork& work);
  void finish_poll(const CpuWork& work, bool done, const std::string* error);
  void start_poll(const CpuWork& work);
  void work_done(const CpuWork& work);  // the op or node is done: complete it, release what depends on it
  void fail_work(const CpuWork& work, const std::string& what);
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
  void finish_graph_if_done(CpuStream& s, CpuEntry& e);
  void reserve_trace();  // under mu_
  static constexpr size_t kTraceReserve = 256;  // op, edge and sleep records: a forward has a few dozen at most
  void complete_head(CpuStream& s);
  void pop_head(CpuStream& s);
  bool advance(CpuStream& s);
  void advance_all();
  // After a scheduling change: bumps gen_, wakes up to wake_budget_ sleeping workers (one fewer when the
  // caller is a worker, which picks next itself) and, after a completion, the host waiters whose condition
  // now holds.
  void notify(bool from_worker);
  void idle(int worker, std::unique_lock<std::mutex>& lk);  // spins, then sleeps until gen_ changes
  void pin_workers();
  void wait_until(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done);
  void block_until(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done);
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
  std::atomic<int> num_busy_{0};  // workers not idle: between a pick and going idle (changed under mu_)
  bool spin_while_running_ = false;  // spin_while_running_us > spin_us > 0, workers <= CPUs: see "Spinning"
  int num_sleepers_ = 0;
  int wake_budget_ = 0;      // tiles and polls made ready since the last notify()
  bool host_dirty_ = false;  // an entry completed since the last notify()
  // How often an op (or graph node) in its poll phase is polled when nothing else is ready.
  static constexpr int64_t kPollIntervalNs = 20'000;
  int num_poll_heads_ = 0;  // ops in their poll phase: sleeping workers must wake up to poll them
  bool stop_ = false;

  std::vector<std::shared_ptr<CpuStream>> streams_;  // creation order; owns the streams
  std::vector<CpuStream*> order_;                    // scheduling order: priority, then creation
  CpuStream* serial_owner_ = nullptr;  // fuzz.serialize_streams: the stream whose op is running
  int host_waits_ = 0;                 // host threads inside wait_until (fuzz.hold_until_host_waits)
  std::mt19937_64 rng_;
  bool tracing_ = false;
  Trace trace_;
  uint64_t trace_epoch_ = 0;  // take_trace()s so far: a sleep record begun before one is no longer in trace_
  std::vector<std::thread> workers_;
};

}  // namespace moe::rt
