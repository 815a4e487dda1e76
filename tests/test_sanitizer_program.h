// A small runtime program shaped like the MoE layer's dual schedule, with switches that plant the bugs of
// the field (design.md, "Failure classes from the field"). Shared by the sanitizer and schedule fuzz tests.
//
//   main: produce_x -> record(fork) -> routed_up -> routed_down -> wait(join) -> combine
//   side:              wait(fork)   -> shared_up -> shared_down  -> record(join)
//
// x, the workspace and the outputs are announced with notify_alloc, so uninitialised reads are tracked. Under
// run_fuzzed's Poisoner each stream fills its scratch and outputs with NaN before using them.
#pragma once

#include <cstring>
#include <vector>

#include "runtime/runtime.h"
#include "runtime/schedule_fuzz.h"

namespace moe::test {

struct PlantedBugs {
  bool no_fork_wait = false;      // side reads x before main's producer is ordered before it
  bool no_join = false;           // combine reads the shared output without waiting for the side stream
  bool routed_in_place = false;   // the routed path updates x in place while the side stream reads it
  bool shared_workspace = false;  // both streams use the same half of the workspace
  bool partial_scratch = false;   // shared_up writes half the side scratch; shared_down reads all of it
};

class MiniLayer {
 public:
  static constexpr int kTokens = 4;
  static constexpr int kHidden = 16;
  static constexpr int kElems = kTokens * kHidden;
  static constexpr size_t kBytes = kElems * sizeof(float);

  explicit MiniLayer(rt::Device& dev) : dev_(dev), x_(kElems), ws_(2 * kElems), routed_(kElems), shared_(kElems), out_(kElems) {
    for (auto* v : {&x_, &ws_, &routed_, &shared_, &out_}) dev_.notify_alloc(v->data(), v->size() * sizeof(float));
  }
  ~MiniLayer() {
    dev_.synchronize();
    for (auto* v : {&x_, &ws_, &routed_, &shared_, &out_}) dev_.notify_free(v->data(), v->size() * sizeof(float));
  }

  float* x() { return x_.data(); }
  float* workspace() { return ws_.data(); }
  float* shared_out() { return shared_.data(); }
  const std::vector<float>& out() const { return out_; }

  // Enqueues one forward pass; does not synchronize.
  void run(const PlantedBugs& bugs = {}) {
    rt::Stream main = dev_.default_stream();
    rt::Stream side = dev_.stream_for("11");
    float* x = x_.data();
    float* ws_main = ws_.data();
    float* ws_side = bugs.shared_workspace ? ws_.data() : ws_.data() + kElems;
    dev_.notify_reuse(main, ws_main, kBytes, "main scratch");
    dev_.notify_reuse(main, routed_.data(), kBytes, "routed output");
    main.launch(rows("produce_x", {rt::writes(x, kBytes)}, [x](int i) { x[i] = 0.25f * static_cast<float>(i % 13) - 1.0f; }));
    rt::Event fork, join;
    main.record(fork);
    if (!bugs.no_fork_wait) side.wait(fork);
    dev_.notify_reuse(side, ws_side, kBytes, "side scratch");
    dev_.notify_reuse(side, shared_.data(), kBytes, "shared output");
    int up_rows = bugs.partial_scratch ? kTokens / 2 : kTokens;
    side.launch(rows_n("shared_up", up_rows, {rt::reads(x, kBytes), rt::writes(ws_side, up_rows * kHidden * sizeof(float))},
                       [x, ws_side](int i) { ws_side[i] = 2.0f * x[i] + 1.0f; }));
    float* shared = shared_.data();
    side.launch(rows("shared_down", {rt::reads(ws_side, kBytes), rt::writes(shared, kBytes)},
                     [ws_side, shared](int i) { shared[i] = ws_side[i] * 0.5f; }));
    if (bugs.routed_in_place) {
      main.launch(rows("routed_up", {rt::updates(x, kBytes)}, [x](int i) { x[i] = 3.0f * x[i]; }));
      ws_main = x;
    } else {
      main.launch(rows("routed_up", {rt::reads(x, kBytes), rt::writes(ws_main, kBytes)},
                       [x, ws_main](int i) { ws_main[i] = 3.0f * x[i]; }));
    }
    float* routed = routed_.data();
    main.launch(rows("routed_down", {rt::reads(ws_main, kBytes), rt::writes(routed, kBytes)},
                     [ws_main, routed](int i) { routed[i] = ws_main[i] - 0.5f; }));
    side.record(join);
    if (!bugs.no_join) main.wait(join);
    float* out = out_.data();
    main.launch(rows("combine", {rt::reads(routed, kBytes), rt::reads(shared, kBytes), rt::writes(out, kBytes)},
                     [routed, shared, out](int i) { out[i] = routed[i] + shared[i]; }));
  }

 private:
  // One tile per token row; `f` is called for every element of the row.
  template <typename F>
  static rt::Op rows_n(const char* name, int num_rows, std::vector<rt::Access> acc, F f) {
    return {.name = name, .num_tiles = num_rows, .tile = [f](int t) {
              for (int j = 0; j < kHidden; ++j) f(t * kHidden + j);
            },
            .accesses = std::move(acc)};
  }
  template <typename F>
  static rt::Op rows(const char* name, std::vector<rt::Access> acc, F f) {
    return rows_n(name, kTokens, std::move(acc), f);
  }

  rt::Device& dev_;
  std::vector<float> x_, ws_, routed_, shared_, out_;
};

}  // namespace moe::test
