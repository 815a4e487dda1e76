// The MoE feed-forward layer on the stream runtime, for every family of ../shared/docs/moe-spec.md, with the
// serial / dual / phased schedules of layer/schedule.h.
//
// Example:
//   auto dev = moe::rt::make_cpu_device({.num_workers = 2});
//   moe::LayerWeights w = moe::make_random_weights(config, {.dtype = moe::DType::kBF16, .seed = 1});
//   moe::MoeLayer layer(config, w, *dev, {.max_tokens = 64});
//   layer.forward(x, tokens, y, {.schedule = moe::Schedule::kDual});   // enqueued on current_stream(*dev)
//   moe::rt::current_stream(*dev).synchronize();                        // y is ready; rethrows op errors
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
//     placed below it. The priority applies where the tag's stream is first created.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "layer/ops/ops.h"
#include "layer/schedule.h"
#include "model/config.h"
#include "model/host_buffer.h"
#include "model/weights.h"
#include "runtime/runtime.h"

namespace moe {

struct LayerOptions {
  int64_t max_tokens = 512;                           // workspaces are sized for this many tokens
  OverlapPolicy policy = OverlapPolicy::from_env();   // when multi-stream schedules fall back to serial
  std::string side_stream_tag = "11";
  int side_priority = rt::kPriorityDefault;
};

struct ForwardOptions {
  Schedule schedule = Schedule::kDual;  // requested; see MoeLayer::effective_schedule
  bool prefill = false;                 // a prefill call stays serial under the decode-only policy
  // Scan x on the stream before anything reads it; a non-finite value fails the stream with an error naming
  // the token and column (rethrown by synchronize()). Costs one pass over x; the tools turn it on.
  bool check_input = false;
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

  // The schedule forward() runs for these options and token count, and why it differs from the request.
  ScheduleDecision effective_schedule(const ForwardOptions& options, int64_t tokens) const;

  const MoeConfig& config() const { return config_; }
  const LayerOptions& options() const { return options_; }
  int64_t max_tokens() const { return options_.max_tokens; }
  rt::Device& device() const { return device_; }
  rt::Stream side_stream() const { return side_; }  // null without a shared expert
  size_t workspace_bytes() const { return routed_ws_.size() + shared_ws_.size(); }

 private:
  ops::Context context(const float* x, int64_t tokens, float* y) const;
  void enqueue_serial(const ops::Context& c, rt::Stream& main, bool check);
  void enqueue_dual(const ops::Context& c, rt::Stream& main, bool check);
  void enqueue_phased(const ops::Context& c, rt::Stream& main, bool check);
  void allocate_workspaces();

  MoeConfig config_;
  const LayerWeights& weights_;
  rt::Device& device_;
  LayerOptions options_;
  rt::Stream side_;
  HostBuffer routed_ws_;
  HostBuffer shared_ws_;
  ops::RoutedBuffers routed_;
  ops::SharedBuffers shared_;
  std::vector<rt::Access> expert_up_weights_;
  std::vector<rt::Access> expert_down_weights_;
  rt::Event fork_, join_, done_;
  std::array<rt::Event, 3> phase_;
};

}  // namespace moe
