#include "layer/moe_layer.h"

#include <cstdint>
#include <stdexcept>

#include "layer/dispatch.h"
#include "layer/routing.h"

namespace moe {

namespace {

// Hands out 64-byte aligned sub-buffers of one allocation; a first pass with base == nullptr measures.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <class T>
  T* take(int64_t count) {
    const size_t at = offset_;
    offset_ += (static_cast<size_t>(count) * sizeof(T) + 63) / 64 * 64;
    return base_ != nullptr ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  size_t size() const { return offset_; }

 private:
  char* base_;
  size_t offset_ = 0;
};

// `rows`: the most grouped rows (t * k in one process, every rank's pairs under expert parallelism).
ops::RoutedBuffers carve_routed(Carver& cv, const MoeConfig& c, int64_t local_experts, int64_t t, int64_t rows) {
  const int64_t pairs = t * c.top_k;
  ops::RoutedBuffers b;
  b.logits = cv.take<float>(t * c.num_experts);
  b.route_scratch = cv.take<float>(t * routing_scratch_floats(c));
  b.topk_weights = cv.take<float>(pairs);
  b.topk_ids = cv.take<int32_t>(pairs);
  b.pair_row = cv.take<int32_t>(pairs);
  b.counters = cv.take<int32_t>(ops::kMaxDispatchTiles * local_experts);
  b.offsets = cv.take<int32_t>(local_experts + 1);
  b.row_tiles = cv.take<int32_t>(max_row_tiles(rows, local_experts) * 3);
  b.num_row_tiles = cv.take<int32_t>(1);
  b.row_progress = cv.take<int32_t>(max_row_tiles(rows, local_experts) * 2);
  b.shared_progress = cv.take<int32_t>(ops::shared_chain_counters(c, t));
  b.xg = cv.take<float>(rows * c.hidden);
  b.hg = cv.take<float>(rows * c.moe_intermediate);
  b.og = cv.take<float>(rows * c.hidden);
  b.routed = cv.take<float>(c.has_shared_expert() ? t * c.hidden : 0);
  return b;
}

// The exchange blocks of expert parallelism (ops.h, EpBuffers): N blocks of C rows each way.
void carve_ep(Carver& cv, const MoeConfig& c, int64_t local_experts, ops::EpBuffers& e) {
  const int64_t blocks = e.ranks * e.capacity;
  e.send_meta = cv.take<int32_t>(e.ranks * (1 + e.capacity));
  e.send_rows = cv.take<float>(blocks * c.hidden);
  e.recv_meta = cv.take<int32_t>(e.ranks * (1 + e.capacity));
  e.recv_rows = cv.take<float>(blocks * c.hidden);
  e.recv_group = cv.take<int32_t>(blocks);
  e.group_cursor = cv.take<int32_t>(local_experts);
  e.back_rows = cv.take<float>(blocks * c.hidden);
  e.ret_rows = cv.take<float>(blocks * c.hidden);
}

ops::SharedBuffers carve_shared(Carver& cv, const MoeConfig& c, int64_t t) {
  ops::SharedBuffers b;
  b.gate = cv.take<float>(t);
  b.g = cv.take<float>(t * c.shared_intermediate);
  b.u = cv.take<float>(t * c.shared_intermediate);
  b.h = cv.take<float>(t * c.shared_intermediate);
  b.out = cv.take<float>(t * c.hidden);
  return b;
}

}  // namespace

MoeLayer::MoeLayer(const MoeConfig& config, const LayerWeights& weights, rt::Device& device, LayerOptions options)
    : config_(config), weights_(weights), device_(device), options_(std::move(options)) {
  config_.validate();
  weights_.validate(config_);
  options_.tuning.validate();
  require_isa(options_.isa, "LayerOptions.isa");
  if (options_.max_tokens < 1)
    throw ConfigError("LayerOptions.max_tokens must be >= 1, got " + std::to_string(options_.max_tokens));
  if (config_.has_shared_expert()) side_ = device_.stream_for(options_.side_stream_tag, options_.side_priority);
  expert_rows_ = options_.max_tokens * config_.top_k;
  if (options_.comm != nullptr) {
    set_up_expert_parallelism();
  } else if (weights_.first_expert != 0) {
    throw ConfigError("the weights hold experts from " + std::to_string(weights_.first_expert) +
                      " on: one process runs experts [0, N) (--experts N); a share elsewhere needs expert "
                      "parallelism (LayerOptions::comm)");
  }
  allocate_workspaces();
  const std::vector<ForwardStep> steps = describe_forward(config_, options_.comm != nullptr);
  for (Schedule s : kRunnableSchedules)
    plans_.push_back(s == Schedule::kSerial || config_.has_shared_expert() ? place(s, steps) : ForwardPlan{});
}

// Every rank checks that it holds exactly its share of the experts, and that all ranks agree on what the
// exchanges depend on; then sizes the exchange blocks. Collective: every rank constructs its layer.
void MoeLayer::set_up_expert_parallelism() {
  ep::Communicator& comm = *options_.comm;
  const int n = comm.size(), r = comm.rank();
  const int64_t first = ep::first_expert(config_.num_experts, n, r), last = ep::first_expert(config_.num_experts, n, r + 1);
  const bool own_share = weights_.first_expert == first && weights_.num_local_experts() == last - first;
  const DType dtype = weights_.experts.empty() ? DType::kF32 : weights_.experts[0].gate.dtype;
  // Agreed first (a rank that threw alone would leave the others waiting in the collective).
  ep::check_agreement(comm, {{"whether each holds its expert share", own_share ? "yes" : "no"},
                             {"model_type", config_.model_type},
                             {"hidden", std::to_string(config_.hidden)},
                             {"moe_intermediate", std::to_string(config_.moe_intermediate)},
                             {"num_experts", std::to_string(config_.num_experts)},
                             {"top_k", std::to_string(config_.top_k)},
                             {"shared_intermediate", std::to_string(config_.shared_intermediate)},
                             {"expert dtype", std::string(dtype_name(dtype))},
                             {"exchange mode", ep::exchange_mode_name(options_.ep_mode)},
                             {"max_tokens", std::to_string(options_.max_tokens)}});
  if (!own_share)
    throw ConfigError("expert parallelism: rank " + std::to_string(r) + " of " + std::to_string(n) + " owns experts [" +
                      std::to_string(first) + ", " + std::to_string(last) + "), but its weights hold [" +
                      std::to_string(weights_.first_expert) + ", " +
                      std::to_string(weights_.first_expert + weights_.num_local_experts()) + ")");
  ep_.comm = options_.comm;
  ep_.mode = options_.ep_mode;
  ep_.ranks = n;
  ep_.capacity = options_.max_tokens * config_.top_k;
  expert_rows_ = n * ep_.capacity;
  const size_t peers = static_cast<size_t>(n);
  counts_ = comm.make_transfer("ep.dispatch (counts)", {.sends = peers, .recvs = peers});
  dispatch_ = comm.make_transfer("ep.dispatch", {.sends = 2 * peers, .recvs = 2 * peers});
  combine_ = comm.make_transfer("ep.combine", {.sends = peers, .recvs = peers});
  ep_.counts = &counts_;
  ep_.dispatch = &dispatch_;
  ep_.combine = &combine_;
  ep_.dispatch_phase = &dispatch_phase_;
}

void MoeLayer::allocate_workspaces() {
  const int64_t t = options_.max_tokens, el = weights_.num_local_experts();
  Carver measure_routed(nullptr), measure_shared(nullptr);
  ops::EpBuffers ep = ep_;
  carve_routed(measure_routed, config_, el, t, expert_rows_);
  if (ep_.comm != nullptr) carve_ep(measure_routed, config_, el, ep);
  routed_ws_ = HostBuffer(measure_routed.size());
  Carver routed(routed_ws_.as<char>());
  routed_ = carve_routed(routed, config_, el, t, expert_rows_);
  if (ep_.comm != nullptr) carve_ep(routed, config_, el, ep_);
  device_.notify_alloc(routed_ws_.data(), routed_ws_.size());
  if (config_.has_shared_expert()) {
    carve_shared(measure_shared, config_, t);
    shared_ws_ = HostBuffer(measure_shared.size());
    Carver shared(shared_ws_.as<char>());
    shared_ = carve_shared(shared, config_, t);
    device_.notify_alloc(shared_ws_.data(), shared_ws_.size());
  }
}

MoeLayer::~MoeLayer() {
  // Wait for the last call's work without rethrowing its errors (they belong to whoever synchronizes the
  // stream): eager side work precedes the join, and done_ is recorded after every call and replay. A
  // forward() captured into a caller's graph left them recorded inside that capture: nothing of this layer
  // runs then but the graph's replays, which its owner waits for.
  for (const rt::Event* e : {&events_[kJoinEvent], &done_}) {
    try {
      e->synchronize();
    } catch (const std::logic_error&) {  // recorded inside a capture
    }
  }
  if (routed_ws_.data() != nullptr) device_.notify_free(routed_ws_.data(), routed_ws_.size());
  if (shared_ws_.data() != nullptr) device_.notify_free(shared_ws_.data(), shared_ws_.size());
}

ScheduleDecision MoeLayer::effective_schedule(const ForwardOptions& options, int64_t tokens) const {
  return decide_schedule(config_, options_.policy, options.schedule, tokens, options.prefill, &options_.tuning);
}

ops::Context MoeLayer::context(const float* x, int64_t tokens, float* y) const {
  ops::Context c;
  c.config = &config_;
  c.weights = &weights_;
  c.x = x;
  c.y = y;
  c.tokens = tokens;
  c.num_workers = device_.num_workers();
  c.isa = options_.isa;
  c.expert_rows = ep_.comm != nullptr ? expert_rows_ : tokens * config_.top_k;
  c.ep = ep_;
  c.routed = routed_;
  c.shared = shared_;
  return c;
}

void MoeLayer::check_args(const float* x, int64_t tokens, const float* y) const {
  if (tokens < 0 || tokens > options_.max_tokens)
    throw std::invalid_argument("MoeLayer::forward: tokens=" + std::to_string(tokens) + " outside [0, max_tokens=" +
                                std::to_string(options_.max_tokens) + "] (raise LayerOptions.max_tokens)");
  if (tokens == 0) return;
  if (x == nullptr || y == nullptr) throw std::invalid_argument("MoeLayer::forward: x and y must not be null");
  const size_t n = static_cast<size_t>(tokens * config_.hidden);
  if (x < y + n && y < x + n)
    throw std::invalid_argument("MoeLayer::forward: y overlaps x (the layer never writes its input)");
}

void MoeLayer::forward(const float* x, int64_t tokens, float* y, const ForwardOptions& options) {
  check_args(x, tokens, y);
  if (tokens == 0 && ep_.comm == nullptr) return;  // under expert parallelism a rank with no tokens still serves
  rt::Stream main = rt::current_stream(device_);
  const Schedule s =
      choose_schedule(config_, options_.policy, options.schedule, tokens, options.prefill, &options_.tuning).schedule;
  enqueue(plan(s), context(x, tokens, y), main, options.check_input, events_);
  main.record(done_);
}

const ForwardPlan& MoeLayer::plan(Schedule s) const {
  const size_t i = static_cast<size_t>(s);
  if (i >= plans_.size() || plans_[i].actions.empty())
    throw std::invalid_argument("MoeLayer::plan: no placement of schedule '" + std::string(schedule_name(s)) +
                                "' for this layer (" + (config_.has_shared_expert() ? "auto is resolved first" : "no shared expert: serial only") + ")");
  return plans_[i];
}

void MoeLayer::forward_plan(const ForwardPlan& p, const float* x, int64_t tokens, float* y, bool check_input) {
  check_args(x, tokens, y);
  if (tokens == 0 && ep_.comm == nullptr) return;  // under expert parallelism a rank with no tokens still serves
  ops::Context c = context(x, tokens, y);
  if (p.shared_in_routed_workspace) {
    // Over the routed path's gathered rows (floats only: a fault that corrupts values, not indices).
    char* at = reinterpret_cast<char*>(routed_.xg);
    const size_t room = routed_ws_.size() - static_cast<size_t>(at - routed_ws_.as<char>());
    Carver measure(nullptr);
    carve_shared(measure, config_, tokens);
    if (measure.size() > room)
      throw std::invalid_argument("MoeLayer::forward_plan: the shared buffers (" + std::to_string(measure.size()) +
                                  " bytes) do not fit over the routed workspace's rows (" + std::to_string(room) +
                                  " bytes)");
    Carver over(at);
    c.shared = carve_shared(over, config_, tokens);
  }
  rt::Stream main = rt::current_stream(device_);
  enqueue(p, c, main, check_input, events_);
  main.record(done_);
}

LayerGraph MoeLayer::capture(const float* x, int64_t tokens, float* y, const ForwardOptions& options) {
  check_args(x, tokens, y);
  LayerGraph g;
  g.layer_ = this;
  g.x_ = x;
  g.y_ = y;
  g.tokens_ = tokens;
  g.decision_ = effective_schedule(options, tokens);
  if (tokens == 0 && ep_.comm == nullptr) return g;
  rt::Stream main = rt::current_stream(device_);
  Events ev;
  rt::begin_capture(main);
  try {
    enqueue(plan(g.decision_.schedule), context(x, tokens, y), main, options.check_input, ev);
  } catch (...) {
    try {
      rt::end_capture(main);
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  g.exec_ = rt::end_capture(main).instantiate();
  return g;
}

void MoeLayer::replay(const LayerGraph& g, const float* x, int64_t tokens, float* y) {
  auto differs = [&](const std::string& what, const std::string& captured, const std::string& got) {
    throw std::invalid_argument("MoeLayer::replay: " + what + " differs from the capture (captured " + captured +
                                ", got " + got + "); capture a graph for it instead");
  };
  auto ptr = [](const void* p) { return std::to_string(reinterpret_cast<uintptr_t>(p)); };
  if (g.layer_ != this) throw std::invalid_argument("MoeLayer::replay: the graph was captured by another layer");
  if (tokens != g.tokens_) differs("token count", std::to_string(g.tokens_), std::to_string(tokens));
  if (x != g.x_) differs("input pointer x", ptr(g.x_), ptr(x));
  if (y != g.y_) differs("output pointer y", ptr(g.y_), ptr(y));
  if (!g.exec_) return;
  rt::Stream main = rt::current_stream(device_);
  g.exec_.launch(main);
  main.record(done_);
}

void MoeLayer::reuse(rt::Stream& s, ForwardBuffer b, const ops::Context& c) {
  const size_t t = static_cast<size_t>(c.tokens), h = static_cast<size_t>(config_.hidden);
  switch (b) {
    case ForwardBuffer::kRoutedWorkspace:
      device_.notify_reuse(s, routed_ws_.data(), routed_ws_.size(), "routed workspace");
      return;
    case ForwardBuffer::kSharedWorkspace:
      device_.notify_reuse(s, shared_ws_.data(), shared_ws_.size(), "shared workspace");
      return;
    case ForwardBuffer::kSharedOutput:
      device_.notify_reuse(s, c.shared.out, t * h * sizeof(float), "shared output");
      return;
  }
}

// Runs a placement as it is. A reuse is where a checking mode's interposer (the schedule fuzzer's Poisoner)
// fills the bytes with NaN, so that a read of scratch the call did not write changes the output.
void MoeLayer::enqueue(const ForwardPlan& p, const ops::Context& c, rt::Stream& main, bool check, Events& ev) {
  for (const PlacedAction& a : p.actions) {
    rt::Stream& s = a.stream == StreamRole::kMain ? main : side_;
    switch (a.kind) {
      case PlacedAction::Kind::kLaunch: {
        const ForwardStep& step = p.steps[a.step];
        if (step.only_when_checking && !check) break;
        s.launch((a.fused ? step.make_fused : step.make)(c));
        break;
      }
      case PlacedAction::Kind::kRecord: s.record(ev[a.event]); break;
      case PlacedAction::Kind::kWait: s.wait(ev[a.event]); break;
      case PlacedAction::Kind::kReuse: reuse(s, a.buffer, c); break;
    }
  }
}

}  // namespace moe
