// Internal: what a Stream or Event handle points at, and the interface a backend (the CPU device, later
// CUDA) implements under the public handles. Not part of the public API; only src/runtime includes it.
//
// The public handles (stream.cpp) do the backend-neutral work in program order on the calling thread:
// observers, graph capture, argument checks; then they hand the entry to the backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace moe::rt {

class DeviceCore;
struct CaptureState;
struct GraphExecImpl;

// Where an event's latest record points: a position on a stream (eager), or a node of a graph being captured.
struct EventBinding {
  std::shared_ptr<StreamImpl> stream;  // null: never recorded
  uint64_t seq = 0;                    // the record's position on `stream`
  std::shared_ptr<CaptureState> capture;  // set when recorded inside a capture
  std::vector<int> capture_nodes;         // the captured nodes the record follows (a waiter depends on them)
};

struct EventImpl {
  mutable std::mutex mu;
  EventBinding binding;

  EventBinding get() const {
    std::lock_guard<std::mutex> lk(mu);
    return binding;
  }
  void set(EventBinding b) {
    std::lock_guard<std::mutex> lk(mu);
    binding = std::move(b);
  }
};

// A stream as the backend keeps it. Backends derive from it to add their queue.
struct StreamImpl {
  virtual ~StreamImpl() = default;

  std::weak_ptr<DeviceCore> core;  // expired once the device is destroyed
  Device* device = nullptr;
  int id = 0;
  int priority = kPriorityDefault;
  std::string name;
  // Entries (ops, records, waits) enqueued and completed so far. `completed` only grows, in order, so an
  // event bound to (stream, seq) is complete exactly when completed >= seq.
  std::atomic<uint64_t> enqueued{0};
  std::atomic<uint64_t> completed{0};
  // Held by the public handles from the observers' callbacks through the enqueue, so that host threads
  // sharing a stream (two layers' side work on the one process-wide side stream) report to the observers
  // the positions, and the order, the stream really gets.
  std::mutex host_mu;

  // Graph capture (graph.cpp). Touched only by the host threads that drive the capture.
  std::shared_ptr<CaptureState> capture;
  std::vector<int> capture_deps;  // nodes the next captured node of this stream depends on
  int capture_last = -1;          // last node captured on this stream (-1: none since it joined)
};

// The backend interface under the public handles. Every function is called on the host thread in program
// order; none blocks except the synchronize/wait functions.
class DeviceCore {
 public:
  virtual ~DeviceCore() = default;

  // Enqueue; each returns the entry's position on the stream.
  virtual uint64_t enqueue_op(const std::shared_ptr<StreamImpl>& s, Op&& op) = 0;
  virtual uint64_t enqueue_record(const std::shared_ptr<StreamImpl>& s, EventImpl& event) = 0;
  virtual uint64_t enqueue_wait(const std::shared_ptr<StreamImpl>& s, const EventBinding& binding) = 0;
  // Blocks until the stream has completed everything enqueued; rethrows (and clears) its error.
  virtual void synchronize_stream(StreamImpl& s) = 0;
  // Enqueue one replay of an instantiated graph.
  virtual uint64_t enqueue_graph(const std::shared_ptr<StreamImpl>& s, const std::shared_ptr<GraphExecImpl>& g) = 0;
  // Blocks until s->completed >= seq.
  virtual void wait_host(StreamImpl& s, uint64_t seq) = 0;

  Device* device = nullptr;
  std::vector<std::shared_ptr<Observer>> observers;
  std::vector<std::shared_ptr<Interposer>> interposers;

  // The capture in progress on this device, if any (graph.cpp). One at a time.
  std::shared_ptr<CaptureState> active_capture;
};

// The core of a live stream, or an error naming the stream when its device is gone.
std::shared_ptr<DeviceCore> lock_core(const StreamImpl& s);

}  // namespace moe::rt
