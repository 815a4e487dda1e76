// Graph replay on the CPU device ("stream fusion"): one stream entry runs a whole instantiated graph. The
// nodes of all captured streams form one DAG: a node is ready when its dependencies are done, and free
// workers take tiles of the ready nodes in the order they became ready. A polling node, once its tiles are
// done, is polled like an eager polling op (when no tile is ready, at the same interval) until it is done.
// A node's tiles are claimed and counted like an eager op's (cpu_scheduler.cpp), on the node's counters;
// its completion takes the same path. Nothing here allocates: the replay state was sized at instantiate
// (graph.cpp). Everything here runs under CpuCore::mu_.
#include <algorithm>
#include <atomic>

#include "runtime/cpu_device.h"
#include "runtime/graph_capture.h"

namespace moe::rt {

uint64_t CpuCore::enqueue_graph(const std::shared_ptr<StreamImpl>& si, const std::shared_ptr<GraphExecImpl>& g) {
  auto& s = static_cast<CpuStream&>(*si);
  std::lock_guard<std::mutex> lk(mu_);
  CpuEntry& e = push_entry(s, CpuEntry::Kind::kGraph);
  e.graph = g;
  if (tracing_) {
    int64_t now = now_ns();
    e.node_traces.resize(g->nodes.size());
    for (size_t i = 0; i < g->nodes.size(); ++i) {
      OpRecord& r = e.node_traces[i];
      r.stream_id = g->nodes[i].stream_id;  // the original stream, so a replay's trace shows every stream
      r.stream_name = g->nodes[i].stream_name;
      r.name = g->nodes[i].op.name;
      r.seq = e.seq;
      r.enqueue_ns = now;
      r.graph_node = static_cast<int>(i);
      r.tiles.assign(g->nodes[i].op.num_tiles, TileRecord{-1, -1, 0, 0});  // one slot per claim, -1: not run
    }
  }
  uint64_t seq = e.seq;
  after_push(s);
  return seq;
}

// Resets the replay state and releases the roots. Returns true when the graph is already complete (no node
// has tiles), in which case it is not running.
bool CpuCore::start_graph(CpuStream& s, CpuEntry& e) {
  GraphExecImpl& g = *e.graph;
  g.running = true;
  e.started = true;
  std::copy(g.num_deps.begin(), g.num_deps.end(), g.pending.begin());
  std::fill(g.next_tile.begin(), g.next_tile.end(), 0);
  std::fill(g.tiles_done.begin(), g.tiles_done.end(), 0);
  g.ready_head = g.ready_tail = 0;
  g.nodes_done = 0;
  g.polls.clear();
  for (int r : g.roots) graph_node_ready(s, e, r);
  graph_node_done(s, e, -1);  // the roots with nothing to run, and what they release
  if (g.nodes_done == static_cast<int>(g.nodes.size())) {
    g.running = false;
    for (auto& r : e.node_traces) trace_.ops.push_back(std::move(r));
    return true;
  }
  return false;
}

bool CpuCore::pick_graph(CpuStream& s, CpuEntry& e, CpuWork& work, int64_t now) {
  GraphExecImpl& g = *e.graph;
  work.stream = &s;
  work.entry = &e;
  work.delay_us = 0;
  work.order = nullptr;
  // A polling node whose time has come goes first: a poll is short, and handing out compute tiles while
  // one is due would hold back the exchange it progresses until the ready nodes run dry.
  for (int i : g.polls) {
    if (g.polling[i] || now < g.next_poll_ns[i]) continue;
    g.polling[i] = 1;
    work.node = i;
    work.op = &g.nodes[i].op;
    work.tile = -1;
    return true;
  }
  // The first ready node with a tile left. Its first claim is made here, under the lock: tile 0 is always
  // claimed here, and the node cannot complete before this worker counts its tile.
  while (g.ready_head != g.ready_tail) {
    const int i = g.ready[g.ready_head];
    const int n = g.nodes[i].op.num_tiles;
    std::atomic_ref<int> next(g.next_tile[i]);
    const int t = next.load(std::memory_order_relaxed) < n ? next.fetch_add(1, std::memory_order_relaxed) : n;
    if (t >= n) {  // all handed out: the node leaves the ready queue
      ++g.ready_head;
      continue;
    }
    if (t == 0 && !e.node_traces.empty()) e.node_traces[i].start_ns = now_ns();
    work.node = i;
    work.op = &g.nodes[i].op;
    work.tile = t;
    work.next = &g.next_tile[i];
    work.done = &g.tiles_done[i];
    work.trace = e.node_traces.empty() ? nullptr : &e.node_traces[i];
    if (options_.fuzz.max_delay_us > 0)
      work.delay_us = std::uniform_int_distribution<int>(0, options_.fuzz.max_delay_us)(rng_);
    return true;
  }
  return false;
}

void CpuCore::graph_node_ready(CpuStream& s, CpuEntry& e, int node) {
  GraphExecImpl& g = *e.graph;
  const Op& op = g.nodes[node].op;
  if (op.num_tiles > 0) {
    g.ready[g.ready_tail++] = node;
    wake_budget_ += op.num_tiles;
  } else if (op.poll && !s.error) {
    graph_start_poll(e, node);
  } else {
    g.empty_stack.push_back(node);  // done at once; graph_node_done takes it from there
  }
}

void CpuCore::graph_start_poll(CpuEntry& e, int node) {
  GraphExecImpl& g = *e.graph;
  g.polls.push_back(node);
  g.next_poll_ns[node] = 0;  // poll at once
  g.polling[node] = 0;
  ++num_poll_heads_;
  ++wake_budget_;
  if (!e.node_traces.empty() && e.node_traces[node].start_ns == 0) e.node_traces[node].start_ns = now_ns();
}

// Marks `node` (-1: none, only the nodes already on the stack) done and releases its successors; those with
// nothing to run complete at once, through an explicit stack (reserved at instantiate) so that a long chain
// of empty nodes cannot overflow the call stack.
void CpuCore::graph_node_done(CpuStream& s, CpuEntry& e, int node) {
  GraphExecImpl& g = *e.graph;
  const bool tracing = !e.node_traces.empty();
  if (node >= 0) g.empty_stack.push_back(node);
  while (!g.empty_stack.empty()) {
    int k = g.empty_stack.back();
    g.empty_stack.pop_back();
    ++g.nodes_done;
    if (tracing) {
      int64_t now = now_ns();
      if (e.node_traces[k].start_ns == 0) e.node_traces[k].start_ns = now;  // nothing ran
      e.node_traces[k].end_ns = now;
    }
    for (int j = g.succ_offsets[k]; j < g.succ_offsets[k + 1]; ++j) {
      int n = g.succ[j];
      if (--g.pending[n] == 0) graph_node_ready(s, e, n);
    }
  }
}

void CpuCore::finish_graph_if_done(CpuStream& s, CpuEntry& e) {
  GraphExecImpl& g = *e.graph;
  if (g.nodes_done < static_cast<int>(g.nodes.size())) {
    notify(true);  // new ready nodes for the idle workers
    return;
  }
  g.running = false;
  for (auto& r : e.node_traces) trace_.ops.push_back(std::move(r));
  complete_head(s);
}

}  // namespace moe::rt
