// The CPU device: streams, the tag registry, enqueueing and host-side waiting. The worker side of the
// scheduler is in cpu_scheduler.cpp.
//
// Lifetime: the device owns its core; the core owns every stream it created. A Stream or Event handle that
// outlives its device keeps its memory (query() still answers) but launch/record/wait throw std::logic_error
// naming the stream, and synchronize() returns at once: the device drained all work when it was destroyed.
#include "runtime/cpu_device.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "runtime/cpu_affinity.h"

namespace moe::rt {

CpuCore::CpuCore(Device* dev, const CpuDeviceOptions& options)
    : options_(options),
      num_workers_(options.num_workers > 0 ? options.num_workers
                                           : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      t0_(std::chrono::steady_clock::now()),
      rng_(options.fuzz.seed) {
  device = dev;
  if (options.num_workers < 0) {
    throw std::invalid_argument("CpuDeviceOptions::num_workers must be >= 0 (0: one per core), got " +
                                std::to_string(options.num_workers));
  }
  if (options.first_cpu < 0) {
    throw std::invalid_argument("CpuDeviceOptions::first_cpu must be >= 0, got " + std::to_string(options.first_cpu));
  }
  if (options.spin_us < 0 || options.spin_while_running_us < 0 || options.fuzz.max_delay_us < 0) {
    throw std::invalid_argument("CpuDeviceOptions: spin_us, spin_while_running_us and fuzz.max_delay_us must be >= 0");
  }
  trace_.num_workers = num_workers_;
}

CpuCore::~CpuCore() { shutdown(); }

void CpuCore::start() {
  spin_while_running_ = options_.spin_us > 0 && options_.spin_while_running_us > options_.spin_us &&
                        static_cast<size_t>(num_workers_) <= allowed_cpus().size();
  workers_.reserve(num_workers_);
  for (int w = 0; w < num_workers_; ++w) workers_.emplace_back([this, w] { worker_main(w); });
  if (options_.pin_workers) pin_workers();
}

void CpuCore::shutdown() {
  std::unique_lock<std::mutex> lk(mu_);
  if (stop_) return;
  wait_until(lk, [this] { return all_idle(); });
  stop_ = true;
  gen_.fetch_add(1, std::memory_order_release);
  work_cv_.notify_all();
  lk.unlock();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

int64_t CpuCore::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
}

std::shared_ptr<CpuStream> CpuCore::create_stream(int priority, std::string name,
                                                  std::weak_ptr<DeviceCore> self) {
  auto s = std::make_shared<CpuStream>();
  s->core = std::move(self);
  s->device = device;
  s->priority = priority;
  std::lock_guard<std::mutex> lk(mu_);
  s->id = static_cast<int>(streams_.size());
  s->name = name.empty() ? "stream" + std::to_string(s->id) : std::move(name);
  streams_.push_back(s);
  order_.push_back(s.get());
  if (options_.fuzz.serialize_streams) {
    // Creation order (or its reverse) replaces priorities: the fuzzer wants both one-at-a-time orders.
    if (options_.fuzz.serialize_reverse) std::rotate(order_.begin(), order_.end() - 1, order_.end());
  } else {
    std::stable_sort(order_.begin(), order_.end(),
                     [](const CpuStream* a, const CpuStream* b) { return a->priority < b->priority; });
  }
  return s;
}

// Worker w runs on the w-th CPU this process may use (modulo their number). Unpinned, Linux may keep two
// workers on one core for hundreds of microseconds after they wake (it treats a task that just ran as
// cache-hot and does not migrate it), which halves the bandwidth of a decode step; pinned, each worker
// owns a core and the host thread floats. Failure to pin (a restricted container) is harmless.
void CpuCore::pin_workers() {
  const std::vector<int> cpus = allowed_cpus();
  for (int w = 0; w < num_workers_; ++w)
    pin_thread(workers_[static_cast<size_t>(w)].native_handle(), options_.first_cpu + w, cpus);
}

// ---- queue blocks --------------------------------------------------------------------------------------

BlockPool::~BlockPool() {
  // Unsized delete: clang before 19 declares the sized one only with -fsized-deallocation.
  for (auto& entry : free_)
    for (void* b : entry.second) ::operator delete(b);
}

void* BlockPool::get(size_t bytes) {
  for (auto& [size, blocks] : free_) {
    if (size != bytes || blocks.empty()) continue;
    void* b = blocks.back();
    blocks.pop_back();
    return b;
  }
  return ::operator new(bytes);
}

void BlockPool::put(void* block, size_t bytes) {
  for (auto& [size, blocks] : free_) {
    if (size != bytes) continue;
    blocks.push_back(block);
    return;
  }
  free_.emplace_back(bytes, std::vector<void*>{block});
}

// ---- enqueue -------------------------------------------------------------------------------------------

CpuEntry& CpuCore::push_entry(CpuStream& s, CpuEntry::Kind kind) {
  CpuEntry& e = s.queue.emplace_back();
  e.kind = kind;
  e.seq = s.enqueued.load(std::memory_order_relaxed) + 1;
  s.enqueued.store(e.seq, std::memory_order_release);
  return e;
}

// A new entry at the head of an idle stream may complete at once (a record, a satisfied wait, an empty op);
// anything else needs the workers. An entry queued behind others changes nothing the workers can act on, so
// it wakes nobody: an eager forward enqueues a dozen ops while the first runs, and waking the sleeping
// workers (and host waiters) for each costs system calls and cores.
void CpuCore::after_push(CpuStream& s) {
  if (s.queue.size() != 1) return;
  if (advance(s)) advance_all();
  notify(false);
}

uint64_t CpuCore::enqueue_op(const std::shared_ptr<StreamImpl>& si, Op&& op) {
  auto& s = static_cast<CpuStream&>(*si);
  std::lock_guard<std::mutex> lk(mu_);
  CpuEntry& e = push_entry(s, CpuEntry::Kind::kOp);
  e.op = std::move(op);
  if (options_.fuzz.shuffle_tiles && e.op.num_tiles > 1) {
    e.tile_order.resize(e.op.num_tiles);
    std::iota(e.tile_order.begin(), e.tile_order.end(), 0);
    std::shuffle(e.tile_order.begin(), e.tile_order.end(), rng_);
  }
  if (tracing_) {
    e.trace = std::make_unique<OpRecord>();
    e.trace->stream_id = s.id;
    e.trace->stream_name = s.name;
    e.trace->name = e.op.name;
    e.trace->seq = e.seq;
    e.trace->enqueue_ns = now_ns();
    e.trace->tiles.assign(e.op.num_tiles, TileRecord{-1, -1, 0, 0});  // one slot per claim, -1: not run
  }
  uint64_t seq = e.seq;
  after_push(s);
  return seq;
}

uint64_t CpuCore::enqueue_record(const std::shared_ptr<StreamImpl>& si, EventImpl& event) {
  auto& s = static_cast<CpuStream&>(*si);
  std::lock_guard<std::mutex> lk(mu_);
  CpuEntry& e = push_entry(s, CpuEntry::Kind::kRecord);
  uint64_t seq = e.seq;
  // Bind before the record can complete so that a waiter never sees a half-made binding.
  EventBinding b;
  b.stream = si;
  b.seq = seq;
  event.set(std::move(b));
  after_push(s);
  return seq;
}

uint64_t CpuCore::enqueue_wait(const std::shared_ptr<StreamImpl>& si, const EventBinding& binding) {
  auto& s = static_cast<CpuStream&>(*si);
  std::lock_guard<std::mutex> lk(mu_);
  CpuEntry& e = push_entry(s, CpuEntry::Kind::kWait);
  e.wait_stream = binding.stream;
  e.wait_seq = binding.seq;
  uint64_t seq = e.seq;
  after_push(s);
  return seq;
}

// ---- host waiting --------------------------------------------------------------------------------------

// Under fuzz.hold_until_host_waits, releases what was held for as long as it waits.
void CpuCore::wait_until(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done) {
  if (done()) return;
  const bool hold = options_.fuzz.hold_until_host_waits;
  if (hold) {
    ++host_waits_;
    gen_.fetch_add(1, std::memory_order_release);  // every idle worker picks again
    work_cv_.notify_all();
  }
  block_until(lk, done);
  if (hold) --host_waits_;
}

// Spins briefly (a finishing op usually completes within microseconds), then sleeps until `done` holds.
void CpuCore::block_until(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done) {
  if (options_.spin_us > 0) {
    uint64_t g = gen_.load(std::memory_order_acquire);  // before unlocking: a completion after it changes gen_
    lk.unlock();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(options_.spin_us);
    while (std::chrono::steady_clock::now() < deadline) {
      uint64_t g2 = gen_.load(std::memory_order_acquire);
      if (g2 != g) {
        lk.lock();
        if (done()) return;
        lk.unlock();
        g = g2;
      }
      std::this_thread::yield();
    }
    lk.lock();
  }
  HostWaiter self{&done, {}};
  host_waiters_.push_back(&self);
  self.cv.wait(lk, done);
  host_waiters_.erase(std::find(host_waiters_.begin(), host_waiters_.end(), &self));
}

void CpuCore::synchronize_stream(StreamImpl& si) {
  auto& s = static_cast<CpuStream&>(si);
  std::unique_lock<std::mutex> lk(mu_);
  wait_until(lk, [&s] { return s.queue.empty(); });
  if (s.error) throw_error(s);
}

namespace {
void clear_error(CpuStream& s) {
  s.cleared = std::move(s.error);
  s.cleared_from = s.error_from;
  s.cleared_to = s.completed.load(std::memory_order_relaxed);
  s.error.reset();
}
}  // namespace

void CpuCore::throw_error(CpuStream& s) {
  std::shared_ptr<const CpuFailure> f = s.error;
  std::string msg = f->message;
  if (f->origin != &s) {
    msg += " (reached stream '" + s.name + "' through its event wait at position " + std::to_string(s.error_via) + ")";
  }
  // Reported once: every stream that holds it (the one it failed on, those that inherited it) is cleared,
  // else their later work (the next call's share of a fork/join) would be skipped and fail every later call.
  // A wait on a position they skipped still inherits it (the cleared span).
  for (auto& o : streams_)
    if (o->error == f) clear_error(*o);
  throw StreamError(msg);
}

void CpuCore::wait_host(StreamImpl& s, uint64_t seq) {
  std::unique_lock<std::mutex> lk(mu_);
  wait_until(lk, [&s, seq] { return s.completed.load(std::memory_order_acquire) >= seq; });
}

bool CpuCore::all_idle() const {
  for (const auto& s : streams_) {
    if (!s->queue.empty()) return false;
  }
  return true;
}

void CpuCore::synchronize_all() {
  std::unique_lock<std::mutex> lk(mu_);
  wait_until(lk, [this] { return all_idle(); });
  // Every stream is reported to: the first error is thrown, the others are cleared with it.
  CpuStream* first = nullptr;
  for (const auto& s : streams_) {
    if (!s->error) continue;
    if (first == nullptr) {
      first = s.get();
    } else {
      clear_error(*s);
    }
  }
  if (first != nullptr) throw_error(*first);
}

void CpuCore::set_tracing(bool on) {
  std::lock_guard<std::mutex> lk(mu_);
  tracing_ = on;
  if (on) reserve_trace();
}

// Room for the records of a few forwards, made here on the host: the worker that retires an op appends its
// record under the scheduler lock, and growing the vectors there (a first allocation in that worker's malloc
// arena, and its page faults) put 15-25 us into traced forwards right after the 2nd, 3rd, 5th and 9th op,
// where the vector doubled: gaps that untraced forwards do not have.
void CpuCore::reserve_trace() {
  trace_.ops.reserve(trace_.ops.size() + kTraceReserve);
  trace_.edges.reserve(trace_.edges.size() + kTraceReserve);
  trace_.sleeps.reserve(trace_.sleeps.size() + kTraceReserve);
}

Trace CpuCore::take_trace() {
  std::lock_guard<std::mutex> lk(mu_);
  Trace t = std::move(trace_);
  for (SleepRecord& z : t.sleeps)
    if (z.end_ns < 0) z.end_ns = now_ns();  // still asleep
  ++trace_epoch_;  // a sleeper's record is no longer in trace_
  trace_ = Trace{};
  trace_.num_workers = num_workers_;
  if (tracing_) reserve_trace();
  t.num_workers = num_workers_;
  return t;
}

// ---- the Device ----------------------------------------------------------------------------------------

namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options) : core_(std::make_shared<CpuCore>(this, options)) {
    core_->start();
    default_ = make_stream(kPriorityDefault, "default");
  }
  ~CpuDevice() override { core_->shutdown(); }

  Stream default_stream() override { return default_; }
  Stream create_stream(int priority, std::string name) override { return make_stream(priority, std::move(name)); }
  Stream stream_for(const std::string& tag, int priority) override {
    std::lock_guard<std::mutex> lk(tag_mu_);
    auto it = tags_.find(tag);
    if (it != tags_.end()) return it->second;
    Stream s = make_stream(priority, tag);
    tags_.emplace(tag, s);
    return s;
  }
  int num_workers() const override { return core_->num_workers(); }
  void synchronize() override {
    if (core_->active_capture) {
      throw std::logic_error("Device::synchronize during graph capture (nothing runs while capturing; "
                             "synchronize after end_capture)");
    }
    for (auto& o : core_->observers) o->on_device_synchronize();
    core_->synchronize_all();
  }
  void set_tracing(bool on) override { core_->set_tracing(on); }
  Trace take_trace() override { return core_->take_trace(); }
  std::string kind() const override { return "cpu"; }

  void add_observer(std::shared_ptr<Observer> observer) override {
    if (!observer) throw std::invalid_argument("Device::add_observer: null observer");
    core_->observers.push_back(std::move(observer));
  }
  void remove_observer(const Observer* observer) override {
    auto& v = core_->observers;
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& o) { return o.get() == observer; }), v.end());
  }
  void add_interposer(std::shared_ptr<Interposer> interposer) override {
    if (!interposer) throw std::invalid_argument("Device::add_interposer: null interposer");
    core_->interposers.push_back(std::move(interposer));
  }
  void remove_interposer(const Interposer* interposer) override {
    auto& v = core_->interposers;
    v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& i) { return i.get() == interposer; }), v.end());
  }
  void notify_alloc(void* p, size_t bytes) override;
  void notify_free(const void* p, size_t bytes) override {
    for (auto& o : core_->observers) o->on_free(p, bytes);
  }
  void notify_reuse(Stream& s, void* p, size_t bytes, const char* what) override {
    for (auto& i : core_->interposers) i->on_reuse(s, p, bytes, what);
  }

 private:
  Stream make_stream(int priority, std::string name) {
    auto s = core_->create_stream(priority, std::move(name), core_);
    Stream handle(s);
    for (auto& o : core_->observers) o->on_stream_created(handle);
    return handle;
  }

  std::shared_ptr<CpuCore> core_;
  Stream default_;
  std::mutex tag_mu_;
  std::map<std::string, Stream> tags_;
};

void CpuDevice::notify_alloc(void* p, size_t bytes) {
  if (core_->active_capture) {
    throw std::logic_error("Device::notify_alloc of " + std::to_string(bytes) +
                           " bytes during graph capture: allocate every buffer before begin_capture (a replay "
                           "reuses the captured pointers)");
  }
  for (auto& i : core_->interposers) i->after_alloc(p, bytes);
  for (auto& o : core_->observers) o->on_alloc(p, bytes);
}

}  // namespace

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

}  // namespace moe::rt
