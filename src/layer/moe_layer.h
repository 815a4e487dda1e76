// The MoE feed-forward layer on the stream runtime, for every family of docs/model-families.md, with the
// serial / dual / phased / fused schedules of layer/schedule.h, each a placement of one description of the
// forward (layer/forward_plan.h).
//
// Example:
//   auto dev = moe::rt::make_cpu_device({.num_workers = 2});
//   moe::LayerWeights w = moe::make_random_weights(config, {.dtype = moe::DType::kBF16, .seed = 1});
//   moe::MoeLayer layer(config, w, *dev, {.max_tokens = 64});
//   layer.forward(x, tokens, y, {.schedule = moe::Schedule::kDual});   // enqueued on current_stream(*dev)
//   moe::rt::current_stream(*dev).synchronize();                        // y is ready; rethrows op errors
//
// A failure in any operation of a call, on either stream, reaches the caller's stream (runtime.h, "Errors"):
// synchronize() throws StreamError naming the operation and its stream, and y is not valid; the layer stays
// usable for the next call.
//
// Contract:
//   - forward() enqueues on the caller's current stream and returns without waiting (like a GPU layer). x must
//     be ready on that stream (or produced by earlier work on it); y is ready once the stream reaches the end
//     of the call. The layer never writes x, so the side stream reads it directly (no clone).
//   - Workspaces are allocated once, at construction, for max_tokens: one for the routed path (main stream),
//     one for the shared branch (side stream under dual/phased). They are never shared between streams, and
//     consecutive calls on the same main stream are ordered by the fork/join events.
//   - The weights (and the device) must outlive the layer; the layer must outlive the work it enqueued (the
//     destructor waits for the device). One forward at a time per layer (not thread-safe).
//   - The side stream is device.stream_for(side_stream_tag): one process-wide side stream, never one per layer.
//     Its priority defaults to the main stream's (kPriorityDefault): the routed path is the critical path
//     (a chain of ops with few tiles at decode), and the shared expert should fill the workers it leaves idle,
//     not take them from it; on CUDA the default is also the lowest priority, so the side stream cannot be
//     placed below it. The priority applies where the tag's stream is first created. The default tag "11"
//     is the one the serving recipes this layer follows use for the shared expert's stream: any layer that
//     asks for it gets the same stream, so a model of many layers still has one side stream.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "layer/forward_plan.h"
#include "layer/ops/ops.h"
#include "layer/schedule.h"
#include "model/config.h"
#include "model/host_buffer.h"
#include "model/weights.h"
#include "runtime/graph.h"
#include "runtime/runtime.h"

namespace moe {

struct LayerOptions {
  int64_t max_tokens = 512;  // workspaces are sized for this many tokens
  // When multi-stream schedules fall back to serial. A program that follows the serving engines' environment
  // switches passes OverlapPolicy::from_env() here (the tools do); the default reads nothing.
  OverlapPolicy policy;
  // The kernels every operation runs: the best exact fp32 ISA of this CPU by default; Isa::kAvx512Bf16 opts in
  // to bf16 dot products for the expert matrices (kernels/linear.h). Checked at construction.
  Isa isa = best_isa();
  std::string side_stream_tag = "11";
  int side_priority = rt::kPriorityDefault;
  TuningTable tuning;  // resolves Schedule::kAuto; empty: auto runs serial
  // Expert parallelism: the ranks of the job (null: one process). This rank's weights must hold exactly its
  // expert range (ep::first_expert); the router and the shared expert are replicated; tokens are this
  // rank's own (data parallel). Every rank builds its layer (a collective check of what they agree on) and
  // calls forward() the same number of times, with 0 tokens where it has none. Not owned.
  ep::Communicator* comm = nullptr;
  ep::ExchangeMode ep_mode = ep::ExchangeMode::kLowLatency;
};

struct ForwardOptions {
  Schedule schedule = Schedule::kDual;  // requested; see MoeLayer::effective_schedule
  bool prefill = false;                 // a prefill call stays serial under the decode-only policy
  // Scan x on the stream before anything reads it; a non-finite value fails the stream with an error naming
  // the token and column (rethrown by synchronize()). Costs one pass over x; the tools turn it on.
  bool check_input = false;
};

class MoeLayer;

// One captured forward (graph mode) for one token-count bucket: the schedule and policies were decided at
// capture, and the replay reads x and writes y at the captured addresses. Replays go through
// MoeLayer::replay(), which refuses anything that differs from the capture (no silent re-capture).
class LayerGraph {
 public:
  LayerGraph() = default;
  int64_t tokens() const { return tokens_; }
  const float* input() const { return x_; }
  float* output() const { return y_; }
  const ScheduleDecision& decision() const { return decision_; }
  const rt::GraphExec& exec() const { return exec_; }
  size_t num_nodes() const { return exec_ ? exec_.num_nodes() : 0; }
  explicit operator bool() const { return layer_ != nullptr; }

 private:
  friend class MoeLayer;
  const MoeLayer* layer_ = nullptr;
  const float* x_ = nullptr;
  float* y_ = nullptr;
  int64_t tokens_ = 0;
  ScheduleDecision decision_;
  rt::GraphExec exec_;
};

class MoeLayer {
 public:
  // Validates the config and the weights against it (ConfigError naming the field or tensor), gets the side
  // stream and allocates the workspaces.
  MoeLayer(const MoeConfig& config, const LayerWeights& weights, rt::Device& device, LayerOptions options = {});
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // y [tokens, H] = MoE(x [tokens, H]). Throws std::invalid_argument for tokens outside [0, max_tokens], null
  // or overlapping x/y. tokens == 0 enqueues nothing.
  void forward(const float* x, int64_t tokens, float* y, const ForwardOptions& options = {});

  // Graph mode. capture() records the forward of exactly `tokens` tokens from x into y (nothing executes) on
  // the current stream, with the fork/join of the schedule inside the capture, and returns the graph of that
  // bucket. replay() enqueues it on the current stream after the caller has written the new input into x:
  // x, tokens and y must be those of the capture, else std::invalid_argument naming what differs. Replays and
  // eager calls share the layer's workspaces: issue them on the same stream (or order them with events).
  LayerGraph capture(const float* x, int64_t tokens, float* y, const ForwardOptions& options = {});
  void replay(const LayerGraph& graph, const float* x, int64_t tokens, float* y);

  // The schedule forward() runs for these options and token count, and why it differs from the request.
  ScheduleDecision effective_schedule(const ForwardOptions& options, int64_t tokens) const;

  // The placement forward() enqueues for a schedule (kSerial, and with a shared expert kDual, kPhased and
  // kFused); std::invalid_argument otherwise.
  const ForwardPlan& plan(Schedule s) const;
  // The checking interface: enqueues `plan` (this layer's placement, possibly altered by a checker to plant
  // a fault, check/planted_faults.h) instead of a schedule's own, with the same argument checks as forward().
  // The overlap policies do not apply. Not for serving: forward() is.
  void forward_plan(const ForwardPlan& plan, const float* x, int64_t tokens, float* y, bool check_input = false);

  const MoeConfig& config() const { return config_; }
  const LayerOptions& options() const { return options_; }
  int64_t max_tokens() const { return options_.max_tokens; }
  rt::Device& device() const { return device_; }
  rt::Stream side_stream() const { return side_; }  // null without a shared expert
  size_t workspace_bytes() const { return routed_ws_.size() + shared_ws_.size(); }

 private:
  // The events of one call (ForwardEvent). Eager calls use the member; a capture uses its own, so that the
  // destructor never synchronizes an event recorded inside a capture.
  using Events = std::array<rt::Event, kNumForwardEvents>;
  void check_args(const float* x, int64_t tokens, const float* y) const;
  ops::Context context(const float* x, int64_t tokens, float* y) const;
  void enqueue(const ForwardPlan& plan, const ops::Context& c, rt::Stream& main, bool check, Events& ev);
  void reuse(rt::Stream& s, ForwardBuffer b, const ops::Context& c);
  void allocate_workspaces();
  void set_up_expert_parallelism();

  MoeConfig config_;
  const LayerWeights& weights_;
  rt::Device& device_;
  LayerOptions options_;
  rt::Stream side_;
  HostBuffer routed_ws_;
  HostBuffer shared_ws_;
  ops::RoutedBuffers routed_;
  ops::SharedBuffers shared_;
  int64_t expert_rows_ = 0;  // the most grouped rows the expert ops see (ops::Context::expert_rows)
  ops::EpBuffers ep_;        // expert parallelism's blocks (carved in routed_ws_) and exchanges
  ep::Transfer counts_, dispatch_, combine_;
  int dispatch_phase_ = 0;
  std::vector<ForwardPlan> plans_;  // indexed by Schedule, built at construction (serial only without shared)
  Events events_;
  rt::Event done_;  // recorded at the end of every eager call and replay
};

}  // namespace moe
