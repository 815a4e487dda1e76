// Internal: graph capture state, the instantiated graph, and the hooks through which the public Stream calls
// reach capture (graph.cpp). A stream that is being captured appends nodes instead of enqueueing work.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/graph.h"
#include "runtime/stream_impl.h"

namespace moe::rt {

struct CaptureState {
  DeviceCore* core = nullptr;
  std::weak_ptr<StreamImpl> origin;
  // Streams in the capture, origin first. Weak: a stream owns its capture, never the reverse.
  std::vector<std::weak_ptr<StreamImpl>> members;
  std::vector<GraphNode> nodes;
  bool ended = false;
};

// An instantiated graph: the nodes plus everything a replay needs, computed once.
struct GraphExecImpl {
  Device* device = nullptr;
  std::vector<GraphNode> nodes;
  std::vector<int> num_deps;      // per node, after deduplication
  std::vector<int> succ_offsets;  // CSR successor lists: succ[succ_offsets[i] .. succ_offsets[i+1])
  std::vector<int> succ;
  std::vector<int> roots;

  // Replay state, owned by the executing device and touched only under its scheduler lock (except that its
  // workers claim and count next_tile / tiles_done through std::atomic_ref: cpu_device.h). Sized once at
  // instantiate so that a replay allocates nothing.
  bool running = false;
  std::vector<int> pending;  // unfinished dependencies per node
  std::vector<int> next_tile;
  std::vector<int> tiles_done;
  std::vector<int> ready;  // FIFO of ready nodes: each node enters once per replay
  int ready_head = 0;
  int ready_tail = 0;
  int nodes_done = 0;
  std::vector<int> empty_stack;  // reserved to the node count: nodes without tiles completing in a cascade
  // Polling nodes (Op::poll): after their tiles, polled like an eager polling op until poll() says done.
  std::vector<int> polls;             // nodes in their poll phase now (reserved to the polling node count)
  std::vector<int64_t> next_poll_ns;  // per node: when to poll again
  std::vector<char> polling;          // per node: a worker is inside poll() now
};

void capture_launch(DeviceCore& core, const std::shared_ptr<StreamImpl>& s, Op&& op);
void capture_record(DeviceCore& core, const std::shared_ptr<StreamImpl>& s, EventImpl& event);
// A wait where the stream is capturing or the event was recorded inside a capture (or both).
void capture_wait(DeviceCore& core, const std::shared_ptr<StreamImpl>& s, const EventBinding& binding);

}  // namespace moe::rt
