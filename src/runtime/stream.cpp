// The public Stream, Event and StreamGuard handles: backend-neutral work done on the calling thread in
// program order (argument checks, observers, graph capture), then a hand-off to the device's backend.
#include <stdexcept>

#include "runtime/graph_capture.h"
#include "runtime/stream_impl.h"

namespace moe::rt {

std::shared_ptr<DeviceCore> lock_core(const StreamImpl& s) {
  auto core = s.core.lock();
  if (!core) {
    throw std::logic_error("stream '" + s.name + "' (id " + std::to_string(s.id) +
                           ") used after its device was destroyed");
  }
  return core;
}

namespace {

StreamImpl& checked(const std::shared_ptr<StreamImpl>& impl, const char* what) {
  if (!impl) throw std::logic_error(std::string("Stream::") + what + " called on a null Stream");
  return *impl;
}

void check_op(const Op& op, const StreamImpl& s) {
  if (op.num_tiles < 0) {
    throw std::invalid_argument("Op '" + op.name + "' on stream '" + s.name + "': num_tiles must be >= 0, got " +
                                std::to_string(op.num_tiles));
  }
  if (op.num_tiles > 0 && !op.tile && !op.poll) {
    throw std::invalid_argument("Op '" + op.name + "' on stream '" + s.name + "': num_tiles = " +
                                std::to_string(op.num_tiles) + " but no tile function (set Op::tile or Op::poll)");
  }
}

// The next position on the stream, for observers that must run before the entry is enqueued (so that an
// observer that throws stops the entry).
uint64_t next_seq(const StreamImpl& s) { return s.enqueued.load(std::memory_order_relaxed) + 1; }

}  // namespace

// ---- Stream --------------------------------------------------------------------------------------------

void Stream::launch(Op op) {
  StreamImpl& s = checked(impl_, "launch");
  check_op(op, s);
  if (!op.tile) op.num_tiles = 0;  // a pure polling op (check_op made sure it has poll): no tile to run
  auto core = lock_core(s);
  std::lock_guard host(s.host_mu);
  for (auto& i : core->interposers) i->before_launch(*this, op);
  if (s.capture) {
    for (auto& o : core->observers) o->on_capture(*this, op);
    capture_launch(*core, impl_, std::move(op));
    return;
  }
  if (!core->observers.empty()) {
    uint64_t seq = next_seq(s);
    for (auto& o : core->observers) o->on_launch(*this, seq, op);
  }
  core->enqueue_op(impl_, std::move(op));
}

void Stream::record(Event& event) {
  StreamImpl& s = checked(impl_, "record");
  auto core = lock_core(s);
  std::lock_guard host(s.host_mu);
  if (s.capture) {
    capture_record(*core, impl_, *event.impl());
    return;
  }
  if (!core->observers.empty()) {
    uint64_t seq = next_seq(s);
    for (auto& o : core->observers) o->on_record(*this, seq, event);
  }
  core->enqueue_record(impl_, *event.impl());
}

void Stream::wait(const Event& event) {
  StreamImpl& s = checked(impl_, "wait");
  auto core = lock_core(s);
  std::lock_guard host(s.host_mu);
  EventBinding b = event.impl()->get();
  if (s.capture || b.capture) {
    capture_wait(*core, impl_, b);
    return;
  }
  if (b.stream && b.stream->core.lock() != core) {
    throw std::invalid_argument("Stream::wait on stream '" + s.name + "': the event was recorded on stream '" +
                                b.stream->name + "' of another device");
  }
  if (!core->observers.empty()) {
    uint64_t seq = next_seq(s);
    for (auto& o : core->observers) o->on_wait(*this, seq, event);
  }
  core->enqueue_wait(impl_, b);
}

void Stream::wait_stream(Stream& other) {
  Event e;
  other.record(e);
  wait(e);
}

void Stream::synchronize() {
  StreamImpl& s = checked(impl_, "synchronize");
  auto core = s.core.lock();
  if (!core) return;  // the device drained everything when it was destroyed
  if (s.capture) {
    throw std::logic_error("Stream::synchronize on stream '" + s.name +
                           "' while it is being captured into a graph (nothing runs during capture; "
                           "synchronize after end_capture)");
  }
  for (auto& o : core->observers) o->on_stream_synchronize(*this);
  core->synchronize_stream(s);
}

bool Stream::query() const {
  const StreamImpl& s = checked(impl_, "query");
  return s.completed.load(std::memory_order_acquire) >= s.enqueued.load(std::memory_order_acquire);
}

int Stream::priority() const { return checked(impl_, "priority").priority; }
int Stream::id() const { return checked(impl_, "id").id; }
const std::string& Stream::name() const { return checked(impl_, "name").name; }
Device& Stream::device() const {
  const StreamImpl& s = checked(impl_, "device");
  lock_core(s);
  return *s.device;
}

// ---- Event ---------------------------------------------------------------------------------------------

Event::Event() : impl_(std::make_shared<EventImpl>()) {}

bool Event::query() const {
  EventBinding b = impl_->get();
  if (!b.stream) return true;
  return b.stream->completed.load(std::memory_order_acquire) >= b.seq;
}

void Event::synchronize() const {
  EventBinding b = impl_->get();
  if (b.capture) {
    throw std::logic_error("Event::synchronize on an event recorded inside a graph capture (nothing runs "
                           "during capture)");
  }
  if (!b.stream) return;
  auto core = b.stream->core.lock();
  if (!core) return;
  for (auto& o : core->observers) o->on_event_synchronize(*this);
  core->wait_host(*b.stream, b.seq);
}

bool Event::recorded() const {
  EventBinding b = impl_->get();
  return b.stream != nullptr || b.capture != nullptr;
}

// ---- current stream ------------------------------------------------------------------------------------

namespace {
thread_local Stream t_current;
}

Stream current_stream(Device& device) {
  if (t_current && t_current.impl()->device == &device && !t_current.impl()->core.expired()) return t_current;
  return device.default_stream();
}

StreamGuard::StreamGuard(Stream s) : previous_(std::move(t_current)) { t_current = std::move(s); }
StreamGuard::~StreamGuard() { t_current = std::move(previous_); }

}  // namespace moe::rt
