// Graph mode: capture a multi-stream sequence of operations once, replay it many times with no per-operation
// host work (CUDA graphs, torch.cuda.graph, ACL graphs).
//
// Example:
//   Stream main = dev->default_stream(), side = dev->stream_for("11");
//   moe::rt::begin_capture(main);                 // main is the origin; nothing executes from here on
//   Event fork, join;
//   main.record(fork); side.wait(fork);           // side joins the capture
//   side.launch(shared_expert);  main.launch(routed);
//   side.record(join); main.wait(join);           // side joined back: required before end_capture
//   main.launch(combine);
//   moe::rt::Graph g = moe::rt::end_capture(main);
//   moe::rt::GraphExec exec = g.instantiate();
//   for (...) { write_inputs(); exec.launch(main); main.synchronize(); }
//
// Rules (CUDA's stream capture):
//   - while a stream is capturing, launch/record/wait on it append to the graph instead of running;
//   - a stream joins the capture by waiting on an event recorded inside it, and every captured operation
//     must be joined back into the origin (an event recorded after it, waited on by the origin, directly or
//     through other streams) before end_capture; otherwise end_capture throws (unjoined fork);
//   - errors, each a std::logic_error naming the stream: waiting inside a capture on an event recorded outside
//     it; synchronizing a capturing stream, an event recorded inside a capture, or the device; allocating
//     (Device::notify_alloc) during a capture; a second capture on the same device while one is running;
//     end_capture on a stream that is not the origin. A call that throws has no effect on the capture.
//   - observers see nothing during capture; a replay reports Observer::on_graph_launch.
//
// Replay: GraphExec::launch(stream) is one entry on `stream`: it starts after all prior work of the stream,
// and later work on the stream waits for the whole graph. The nodes keep their tile functions, so a replay
// reads and writes the buffers captured by those functions: write new inputs into the same buffers. One
// GraphExec runs one replay at a time; a second launch waits for the first to finish.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace moe::rt {

struct GraphExecImpl;

// One captured operation.
struct GraphNode {
  Op op;
  int stream_id = 0;        // the stream it was captured on
  std::string stream_name;
  std::vector<int> deps;    // earlier nodes it waits for: stream order and event edges, no duplicates
  int stream_prev = -1;     // the previous node captured on the same stream (-1: none)
};

struct GraphOptions {
  // true: the nodes of all streams form one DAG and a node is ready when its captured dependencies are done
  // ("stream fusion"). false: each node also waits for the previous node of its original stream (per-stream
  // order, as eager execution would run them).
  bool stream_fusion = true;
};

class GraphExec {
 public:
  GraphExec() = default;
  // Enqueue one replay of the graph on `stream`. Asynchronous, like Stream::launch.
  void launch(Stream& stream) const;
  size_t num_nodes() const;
  const std::vector<GraphNode>& nodes() const;
  explicit operator bool() const { return impl_ != nullptr; }
  const std::shared_ptr<GraphExecImpl>& impl() const { return impl_; }

 private:
  friend class Graph;
  std::shared_ptr<GraphExecImpl> impl_;
};

class Graph {
 public:
  Graph() = default;
  const std::vector<GraphNode>& nodes() const { return nodes_; }
  size_t num_nodes() const { return nodes_.size(); }
  // Precomputes the replay: dependency counts, successor lists, root nodes.
  GraphExec instantiate(const GraphOptions& options = {}) const;

 private:
  friend Graph end_capture(Stream& origin);
  std::vector<GraphNode> nodes_;
  Device* device_ = nullptr;
};

// Start capturing on `origin`. Throws if a capture is already running on the device or origin is null.
void begin_capture(Stream& origin);
// End the capture started on `origin` and return the graph. Throws on an unjoined fork (the capture is
// discarded and every stream leaves capture mode) or when `origin` is not the capture's origin.
Graph end_capture(Stream& origin);
// True while `s` is part of a capture (the origin or a stream that joined).
bool is_capturing(const Stream& s);

}  // namespace moe::rt
