// Graph mode, backend-neutral part: stream capture (building the DAG from launch/record/wait calls), the
// join check at end_capture, and instantiation (dependency counts and successor lists computed once). The
// CPU device runs a replay in cpu_graph.cpp.
#include <algorithm>
#include <stdexcept>

#include "runtime/graph_capture.h"

namespace moe::rt {

namespace {

std::string stream_label(const StreamImpl& s) { return "stream '" + s.name + "' (id " + std::to_string(s.id) + ")"; }

void merge_deps(std::vector<int>& into, const std::vector<int>& from) {
  into.insert(into.end(), from.begin(), from.end());
  std::sort(into.begin(), into.end());
  into.erase(std::unique(into.begin(), into.end()), into.end());
}

// Every stream leaves capture mode; the device accepts a new capture.
void close_capture(CaptureState& cap) {
  for (auto& w : cap.members) {
    if (auto s = w.lock()) {
      s->capture.reset();
      s->capture_deps.clear();
      s->capture_last = -1;
    }
  }
  cap.ended = true;
  cap.core->active_capture.reset();
}

// The nodes that are not ancestors of the origin's current position: work forked off and never joined back.
std::vector<int> unjoined_nodes(const CaptureState& cap, const StreamImpl& origin) {
  std::vector<char> reached(cap.nodes.size(), 0);
  std::vector<int> stack(origin.capture_deps.begin(), origin.capture_deps.end());
  while (!stack.empty()) {
    int n = stack.back();
    stack.pop_back();
    if (reached[n]) continue;
    reached[n] = 1;
    for (int d : cap.nodes[n].deps) stack.push_back(d);
  }
  std::vector<int> out;
  for (size_t i = 0; i < reached.size(); ++i) {
    if (!reached[i]) out.push_back(static_cast<int>(i));
  }
  return out;
}

}  // namespace

// ---- capture -------------------------------------------------------------------------------------------

void begin_capture(Stream& origin) {
  if (!origin) throw std::logic_error("begin_capture on a null Stream");
  StreamImpl& s = *origin.impl();
  auto core = lock_core(s);
  if (core->active_capture) {
    auto o = core->active_capture->origin.lock();
    throw std::logic_error("begin_capture on " + stream_label(s) + ": a capture started on " +
                           (o ? stream_label(*o) : std::string("another stream")) +
                           " is still running on this device (one capture at a time; end_capture it first)");
  }
  auto cap = std::make_shared<CaptureState>();
  cap->core = core.get();
  cap->origin = origin.impl();
  cap->members.push_back(origin.impl());
  s.capture = cap;
  s.capture_deps.clear();
  s.capture_last = -1;
  core->active_capture = cap;
}

Graph end_capture(Stream& origin) {
  if (!origin) throw std::logic_error("end_capture on a null Stream");
  StreamImpl& s = *origin.impl();
  if (!s.capture) throw std::logic_error("end_capture on " + stream_label(s) + ", which is not capturing");
  std::shared_ptr<CaptureState> cap = s.capture;
  auto o = cap->origin.lock();
  if (o.get() != &s) {
    throw std::logic_error("end_capture on " + stream_label(s) + ", which joined the capture started on " +
                           (o ? stream_label(*o) : std::string("another stream")) +
                           "; end the capture on its origin");
  }
  std::vector<int> unjoined = unjoined_nodes(*cap, s);
  close_capture(*cap);
  if (!unjoined.empty()) {
    const GraphNode& n = cap->nodes[unjoined.front()];
    throw std::logic_error("end_capture on " + stream_label(s) + ": unjoined fork: operation '" + n.op.name +
                           "' captured on stream '" + n.stream_name + "' (and " +
                           std::to_string(unjoined.size() - 1) +
                           " more) is not joined back into the origin; record an event on that stream after "
                           "its last operation and wait on it from the origin before end_capture. The capture "
                           "is discarded.");
  }
  Graph g;
  g.nodes_ = std::move(cap->nodes);
  g.device_ = s.device;
  return g;
}

bool is_capturing(const Stream& s) { return s && s.impl()->capture != nullptr; }

void capture_launch(DeviceCore& core, const std::shared_ptr<StreamImpl>& s, Op&& op) {
  CaptureState& cap = *s->capture;
  GraphNode node;
  node.op = std::move(op);
  node.stream_id = s->id;
  node.stream_name = s->name;
  node.deps = s->capture_deps;
  node.stream_prev = s->capture_last;
  int idx = static_cast<int>(cap.nodes.size());
  cap.nodes.push_back(std::move(node));
  s->capture_deps.assign(1, idx);
  s->capture_last = idx;
}

void capture_record(DeviceCore& core, const std::shared_ptr<StreamImpl>& s, EventImpl& event) {
  EventBinding b;
  b.capture = s->capture;
  b.capture_nodes = s->capture_deps;
  event.set(std::move(b));
}

void capture_wait(DeviceCore& core, const std::shared_ptr<StreamImpl>& s, const EventBinding& b) {
  if (b.capture && b.capture->ended) {
    throw std::logic_error("Stream::wait on " + stream_label(*s) +
                           ": the event was recorded inside a graph capture that has ended; record it again");
  }
  if (s->capture) {
    if (!b.capture) {
      if (!b.stream) return;  // never recorded: a no-op, as outside capture
      throw std::logic_error("Stream::wait on " + stream_label(*s) +
                             " during graph capture: the event was recorded outside the capture (on stream '" +
                             b.stream->name + "'); a captured graph may only wait on events recorded inside it. "
                             "Synchronize that work before begin_capture, or record the event inside the capture");
    }
    if (b.capture != s->capture) {
      throw std::logic_error("Stream::wait on " + stream_label(*s) + ": the event belongs to another capture");
    }
    merge_deps(s->capture_deps, b.capture_nodes);
    return;
  }
  // A stream outside the capture waits on an event recorded inside it: the stream joins the capture.
  if (b.capture->core != &core) {
    throw std::logic_error("Stream::wait on " + stream_label(*s) + ": the event was captured on another device");
  }
  s->capture = b.capture;
  s->capture_deps = b.capture_nodes;
  s->capture_last = -1;
  b.capture->members.push_back(s);
}

// ---- instantiate and launch ----------------------------------------------------------------------------

GraphExec Graph::instantiate(const GraphOptions& options) const {
  auto impl = std::make_shared<GraphExecImpl>();
  impl->device = device_;
  impl->nodes = nodes_;
  const int n = static_cast<int>(nodes_.size());
  std::vector<std::vector<int>> deps(n);
  for (int i = 0; i < n; ++i) {
    const GraphNode& node = nodes_[i];
    deps[i] = node.deps;
    if (!options.stream_fusion && node.stream_prev >= 0) merge_deps(deps[i], {node.stream_prev});
  }
  impl->num_deps.resize(n);
  impl->succ_offsets.assign(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    impl->num_deps[i] = static_cast<int>(deps[i].size());
    if (deps[i].empty()) impl->roots.push_back(i);
    for (int d : deps[i]) impl->succ_offsets[d + 1]++;
  }
  for (int i = 0; i < n; ++i) impl->succ_offsets[i + 1] += impl->succ_offsets[i];
  impl->succ.resize(impl->succ_offsets[n]);
  std::vector<int> fill(impl->succ_offsets.begin(), impl->succ_offsets.end() - 1);
  for (int i = 0; i < n; ++i) {
    for (int d : deps[i]) impl->succ[fill[d]++] = i;
  }
  impl->pending.resize(n);
  impl->next_tile.resize(n);
  impl->tiles_done.resize(n);
  impl->ready.resize(n);
  impl->empty_stack.reserve(n);
  impl->polls.reserve(std::count_if(nodes_.begin(), nodes_.end(), [](const GraphNode& g) { return bool(g.op.poll); }));
  impl->next_poll_ns.resize(n);
  impl->polling.resize(n);
  GraphExec exec;
  exec.impl_ = std::move(impl);
  return exec;
}

void GraphExec::launch(Stream& stream) const {
  if (!impl_) throw std::logic_error("GraphExec::launch on an empty GraphExec (instantiate a Graph first)");
  if (!stream) throw std::logic_error("GraphExec::launch on a null Stream");
  StreamImpl& s = *stream.impl();
  auto core = lock_core(s);
  if (s.device != impl_->device) {
    throw std::logic_error("GraphExec::launch on " + stream_label(s) + " of another device than the capture's");
  }
  if (s.capture) {
    throw std::logic_error("GraphExec::launch on " + stream_label(s) + " while it is capturing (graphs do not nest)");
  }
  std::lock_guard host(s.host_mu);  // the position the observers see is the one the replay gets
  if (!core->observers.empty()) {
    uint64_t seq = s.enqueued.load(std::memory_order_relaxed) + 1;
    for (auto& o : core->observers) o->on_graph_launch(stream, seq, *this);
  }
  core->enqueue_graph(stream.impl(), impl_);
}

size_t GraphExec::num_nodes() const { return impl_ ? impl_->nodes.size() : 0; }

const std::vector<GraphNode>& GraphExec::nodes() const {
  if (!impl_) throw std::logic_error("GraphExec::nodes on an empty GraphExec");
  return impl_->nodes;
}

}  // namespace moe::rt
