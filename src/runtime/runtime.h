// The stream runtime: devices, streams and events with CUDA's semantics.
//
// Every piece of the project runs on this interface: the MoE layer enqueues its operations here, graph mode
// captures them, the sanitizer checks them. The CPU device behaves like a GPU with several streams: a pool of
// worker threads (the "multiprocessors") takes tiles of the ready head operation of every stream, higher
// priority first.
//
// Example:
//   auto dev = moe::rt::make_cpu_device({.num_workers = 2});
//   moe::rt::Stream main = dev->default_stream();
//   moe::rt::Stream side = dev->stream_for("11");        // same tag, same stream, process-wide
//   moe::rt::Event fork, join;
//   main.record(fork);  side.wait(fork);                   // side sees all work enqueued on main so far
//   side.launch({.name = "shared_expert", .num_tiles = 8, .tile = [&](int t) { ... }});
//   side.record(join);  main.wait(join);
//   main.synchronize();                                    // rethrows a tile's exception, with the op name
//
// Event rules (exactly CUDA's):
//   - record(e) captures the work enqueued on the stream so far; re-recording overwrites the capture;
//   - wait(e) binds to the latest record at the time of the wait; a later re-record does not move it;
//   - waiting on a never-recorded event is a no-op; query() of a never-recorded event is true;
//   - every call here is asynchronous to the host except synchronize().
//
// Errors (a failure anywhere in a program reaches whoever waits for its result):
//   - an operation whose tile or poll throws fails; its stream enters the error state and skips the
//     operations after it (they never run on bad data) until the error is reported;
//   - a stream that waits on an event recorded at or after a failed (or skipped) position inherits the
//     error: in a fork/join, a failure on the side stream fails the main stream at the join, so the caller's
//     synchronize() throws even though it never touched the side stream. CUDA makes such errors sticky for
//     the whole context; here they stick along dependencies only, so unrelated streams go on;
//   - synchronize() reports the error once (StreamError naming the failed operation, its position and its
//     stream) and clears it on every stream that holds it, so the program runs again; a later wait on a
//     position that was skipped still inherits it. A graph replay is one entry of the stream it was
//     launched on: a failure in any of its nodes fails that stream.
//
// Priorities follow CUDA: a LOWER number is a HIGHER priority (kPriorityHigh = -1 < kPriorityDefault = 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/small_function.h"
#include "runtime/small_vector.h"

namespace moe::rt {

class Device;
class Graph;
class GraphExec;
struct StreamImpl;
struct EventImpl;

inline constexpr int kPriorityDefault = 0;
inline constexpr int kPriorityHigh = -1;

// A byte range an operation reads or writes. Declared on every operation so that the sanitizer can check
// cross-stream ordering and graph mode can check that a replay uses the captured buffers.
enum class AccessMode : uint8_t { kRead, kWrite, kReadWrite };
struct Access {
  const void* ptr = nullptr;
  size_t bytes = 0;
  AccessMode mode = AccessMode::kRead;
};
inline Access reads(const void* p, size_t bytes) { return {p, bytes, AccessMode::kRead}; }
inline Access writes(const void* p, size_t bytes) { return {p, bytes, AccessMode::kWrite}; }
inline Access updates(const void* p, size_t bytes) { return {p, bytes, AccessMode::kReadWrite}; }

// One operation: a grid of independent tiles. tile(t) is called exactly once for every t in [0, num_tiles),
// on any worker, possibly concurrently with other tiles of the same operation. An operation with
// num_tiles == 0 completes at once (an empty expert costs nothing).
//
// A polling operation (poll set, tile empty) models work that happens elsewhere (a network transfer): the
// scheduler calls poll() from time to time, never concurrently with itself, until it returns true. It never
// occupies a worker between polls.
//
// Launching an operation allocates nothing when its name fits std::string's in-place buffer (15 chars),
// its tile function's captures fit kTileInlineBytes and it declares at most kInlineAccesses ranges: a
// serving loop's eager calls stay off the heap (graph replays never touch it).
inline constexpr size_t kTileInlineBytes = 256;
inline constexpr size_t kInlineAccesses = 13;  // the fused schedule's one operation declares 13
using TileFunction = SmallFunction<void(int tile), kTileInlineBytes>;
using AccessList = SmallVector<Access, kInlineAccesses>;

struct Op {
  std::string name;
  int num_tiles = 1;
  TileFunction tile;
  std::function<bool()> poll;
  AccessList accesses;
  // The operation writes garbage on purpose (a checking mode's NaN fill of reused memory): the sanitizer
  // treats the bytes it writes as uninitialised afterwards.
  bool fills_garbage = false;
};

// Raised by synchronize() when an operation the stream depends on threw: one of its own, or one on another
// stream whose failure reached it through an event wait. what() names the operation and its stream.
class StreamError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An event handle. Copies share the same event (like cudaEvent_t).
class Event {
 public:
  Event();
  // True when the captured work is complete, or the event was never recorded.
  bool query() const;
  // Blocks the host until query() is true. Does not rethrow stream errors (synchronize the stream for that).
  void synchronize() const;
  bool recorded() const;
  const std::shared_ptr<EventImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<EventImpl> impl_;
};

// A stream handle. Copies share the same stream (like cudaStream_t). A default-constructed Stream is null.
class Stream {
 public:
  Stream() = default;
  explicit Stream(std::shared_ptr<StreamImpl> impl) : impl_(std::move(impl)) {}

  // Enqueue an operation; returns at once. On a stream in the error state the operation is skipped.
  //
  // Errors follow the dependencies (see "Errors" above): an operation that throws puts its stream in the
  // error state; a wait on an event recorded after the failure puts the waiting stream in the same state.
  void launch(Op op);
  void record(Event& event);
  void wait(const Event& event);
  // wait on a fresh event recorded on `other` now.
  void wait_stream(Stream& other);
  // Blocks until all enqueued work is done. Rethrows the first error this stream holds as StreamError, its
  // own or one inherited through a wait, once: afterwards every stream that held it is usable again.
  void synchronize();
  // True when all enqueued work is done.
  bool query() const;

  int priority() const;
  int id() const;
  const std::string& name() const;
  Device& device() const;
  explicit operator bool() const { return impl_ != nullptr; }
  bool operator==(const Stream& o) const { return impl_ == o.impl_; }
  const std::shared_ptr<StreamImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<StreamImpl> impl_;
};

// What tracing records for one tile and for one operation. Times are nanoseconds since the device started.
struct TileRecord {
  int tile = 0;
  int worker = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};
struct OpRecord {
  int stream_id = 0;
  std::string stream_name;
  std::string name;
  uint64_t seq = 0;  // position of the operation on its stream (1-based, counts ops, records and waits)
  int64_t enqueue_ns = 0;
  int64_t start_ns = 0;  // first tile start (or first poll)
  int64_t end_ns = 0;    // completion
  std::vector<TileRecord> tiles;
  int graph_node = -1;  // index of the node in a replayed graph (graph.h); -1 for an eager operation
};
// An event edge as traced: `record` on one stream released a `wait` on another.
struct EdgeRecord {
  int from_stream = 0;
  uint64_t from_seq = 0;  // the stream position the event captured
  int to_stream = 0;
  uint64_t to_seq = 0;  // the position of the wait on the waiting stream
  int64_t time_ns = 0;
};
// A worker asleep (blocked until woken) while tracing: time it ran nothing and had to be woken to run more.
// One still asleep when the trace is taken ends at that moment.
struct SleepRecord {
  int worker = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};
struct Trace {
  std::vector<OpRecord> ops;
  std::vector<EdgeRecord> edges;
  std::vector<SleepRecord> sleeps;
  int num_workers = 0;
};

// Schedule fuzzing (off by default): perturbs timing and order without changing any dependency, so a correct
// program gives the same output under every setting.
struct FuzzOptions {
  uint64_t seed = 0;              // 0: off
  int max_delay_us = 0;           // random sleep before a tile, in [0, max_delay_us]
  bool shuffle_tiles = false;     // hand out the tiles of an operation in a random order
  // Run one stream at a time: a stream's ready operation starts only when no operation of another stream
  // is running. With `serialize_reverse`, streams created later are preferred (the other order).
  bool serialize_streams = false;
  bool serialize_reverse = false;
  // Start nothing until the host waits (a synchronize of the device, a stream or an event; while it waits,
  // the work runs as usual). So everything the host issued before it waits is queued before any of it runs,
  // as when a GPU's host runs far ahead of the device, and the serialized orders no longer depend on how far
  // the host got before the workers picked. A host that spins on query() without waiting never sees progress.
  bool hold_until_host_waits = false;
};

struct CpuDeviceOptions {
  int num_workers = 0;  // 0: one per core
  int spin_us = 50;     // how long an idle worker spins before it sleeps (0: it never spins)
  // ... and up to how long while another worker runs tiles or a poll, if this process has no more workers
  // than CPUs (a sleeper woken at an op's end costs its waker a system call; decode tiles run 10-300 us).
  // 0 (or not above spin_us): off. Processes sharing the CPUs should turn it off: each would spin on a
  // core another needs.
  int spin_while_running_us = 1000;
  bool pin_workers = true;  // worker w on the w-th allowed CPU: each worker keeps a core of its own
  // With pin_workers: worker w on allowed CPU (first_cpu + w) mod their number. Processes sharing a machine
  // (expert-parallel ranks) give each its own range, or every rank's worker 0 would share one core.
  int first_cpu = 0;
  FuzzOptions fuzz;
};

// Host-side hooks called in program order at enqueue time (not at execution), from the thread that called
// the stream API, like the callbacks PyTorch's CUDA sanitizer uses. The sanitizer (runtime/sanitizer.h) is one.
// `seq` is the position on the stream. Callbacks may throw; the exception propagates to the caller of the API.
class Observer {
 public:
  virtual ~Observer() = default;
  virtual void on_stream_created(const Stream& s) {}
  virtual void on_launch(const Stream& s, uint64_t seq, const Op& op) {}
  // An operation recorded into a graph under capture (graph.h) instead of launched; it runs at each replay.
  virtual void on_capture(const Stream& s, const Op& op) {}
  virtual void on_record(const Stream& s, uint64_t seq, const Event& e) {}
  // `e` as bound at the time of the wait (a no-op wait on a never-recorded event is still reported).
  virtual void on_wait(const Stream& s, uint64_t seq, const Event& e) {}
  virtual void on_stream_synchronize(const Stream& s) {}
  virtual void on_event_synchronize(const Event& e) {}
  virtual void on_device_synchronize() {}
  // A replay of a captured graph (graph.h) enqueued at position `seq` of `s`: its nodes run as one entry.
  virtual void on_graph_launch(const Stream& s, uint64_t seq, const GraphExec& exec) {}
  // A buffer's lifetime as the allocator sees it: after on_free, a later on_alloc may return the same bytes.
  virtual void on_alloc(const void* p, size_t bytes) {}
  virtual void on_free(const void* p, size_t bytes) {}
};

// What a checking mode installs on a device to change what runs. Observers only watch; an interposer is
// the one interface allowed to alter the program: the declaration check (declaration_check.h) wraps every
// operation's tiles, the schedule fuzzer (schedule_fuzz.h) fills fresh and reused memory with NaN. Called on
// the host thread in program order, before the observers, so they see what will run.
class Interposer {
 public:
  virtual ~Interposer() = default;
  // `op` is about to be enqueued on `s`, or captured into a graph on it; may rewrite it.
  virtual void before_launch(const Stream& s, Op& op) {}
  // A buffer announced with Device::notify_alloc, before its owner initialises it.
  virtual void after_alloc(void* p, size_t bytes) {}
  // Device::notify_reuse: the bytes change hands at this point of `s`'s program; may enqueue work on `s`.
  virtual void on_reuse(Stream& s, void* p, size_t bytes, const char* what) {}
};

class Device {
 public:
  virtual ~Device() = default;
  virtual Stream default_stream() = 0;
  virtual Stream create_stream(int priority = kPriorityDefault, std::string name = "") = 0;
  // The process-wide tag registry of this device: the same tag always returns the same stream.
  virtual Stream stream_for(const std::string& tag, int priority = kPriorityDefault) = 0;
  virtual int num_workers() const = 0;
  // Blocks until every stream is idle.
  virtual void synchronize() = 0;

  // Tracing costs one branch per operation when off.
  virtual void set_tracing(bool on) = 0;
  virtual Trace take_trace() = 0;
  virtual std::string kind() const = 0;

  // Observers see every later API call on this device. Not thread-safe against concurrent API calls.
  virtual void add_observer(std::shared_ptr<Observer> observer) = 0;
  virtual void remove_observer(const Observer* observer) = 0;
  // Interposers change later API calls on this device (see Interposer). Not thread-safe against concurrent
  // API calls; none is installed unless a checking mode asks for it.
  virtual void add_interposer(std::shared_ptr<Interposer> interposer) = 0;
  virtual void remove_interposer(const Interposer* interposer) = 0;
  // Buffer lifetimes reported to the observers and interposers by whoever owns the memory (workspaces,
  // the layer's outputs).
  virtual void notify_alloc(void* p, size_t bytes) = 0;
  virtual void notify_free(const void* p, size_t bytes) = 0;
  // Memory that a new user takes over at this point of `s` (a layer's workspace at the start of a call,
  // whatever the previous call left in it). Costs one empty-vector check without interposers.
  virtual void notify_reuse(Stream& s, void* p, size_t bytes, const char* what) = 0;
};

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& options = {});

// The scoped "current stream" of the calling thread (PyTorch's `with torch.cuda.stream(s):`).
Stream current_stream(Device& device);  // the guard's stream, or the device's default stream
class StreamGuard {
 public:
  explicit StreamGuard(Stream s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

}  // namespace moe::rt
