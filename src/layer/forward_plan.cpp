#include "layer/forward_plan.h"

#include <stdexcept>

namespace moe {

std::vector<ForwardStep> describe_forward(const MoeConfig& c, bool expert_parallel) {
  // The routed experts: one operation, gate_up and down chained by row tile; the fused schedule's form
  // also runs the shared expert's steps.
  const ForwardStep experts{.name = "experts", .branch = Branch::kRouted, .segment = 2,
                            .make = ops::make_experts_op, .make_fused = ops::make_fused_op};
  std::vector<ForwardStep> s = {
      {.name = "check_input", .branch = Branch::kInput, .make = ops::make_check_input_op, .only_when_checking = true},
      {.name = "router", .branch = Branch::kRouted, .segment = 0, .make = ops::make_router_op},
      {.name = "topk", .branch = Branch::kRouted, .segment = 1, .make = ops::make_topk_op},
  };
  if (expert_parallel) {
    s.push_back({.name = "ep.pack", .branch = Branch::kRouted, .segment = 1, .make = ops::make_ep_pack_op});
    s.push_back({.name = "ep.dispatch", .branch = Branch::kRouted, .segment = 1, .make = ops::make_ep_dispatch_op});
    s.push_back({.name = "ep.group", .branch = Branch::kRouted, .segment = 2, .make = ops::make_ep_group_op});
    s.push_back(experts);
    s.push_back({.name = "ep.return", .branch = Branch::kRouted, .segment = 3, .make = ops::make_ep_return_op});
    s.push_back({.name = "ep.combine", .branch = Branch::kRouted, .segment = 3, .make = ops::make_ep_combine_op});
  } else {
    s.push_back({.name = "dispatch", .branch = Branch::kRouted, .segment = 1, .make = ops::make_dispatch_op});
    s.push_back(experts);
  }
  s.push_back({.name = "combine", .branch = Branch::kRouted, .segment = 3, .make = ops::make_combine_op});
  if (!c.has_shared_expert()) return s;
  if (c.shared_expert_gate)
    s.push_back({.name = "shared_gate", .branch = Branch::kShared, .segment = 1, .make = ops::make_shared_gate_op});
  s.push_back({.name = "shared.gate_up", .branch = Branch::kShared, .segment = 1, .make = ops::make_shared_gate_up_op});
  s.push_back({.name = "shared.act", .branch = Branch::kShared, .segment = 2, .make = ops::make_shared_act_op});
  s.push_back({.name = "shared.down", .branch = Branch::kShared, .segment = 3, .make = ops::make_shared_down_op});
  s.push_back({.name = "sum", .branch = Branch::kJoin, .make = ops::make_sum_op});
  return s;
}

namespace {

class Placer {
 public:
  explicit Placer(ForwardPlan& p) : p_(p) {}

  void launch_all(Branch b, StreamRole s, int segment = -1, bool fused = false) {
    for (size_t i = 0; i < p_.steps.size(); ++i) {
      const ForwardStep& st = p_.steps[i];
      if (st.branch != b || (segment >= 0 && st.segment != segment)) continue;
      const bool fused_form = fused && st.make_fused != nullptr;
      p_.actions.push_back({.kind = PlacedAction::Kind::kLaunch, .stream = s, .step = static_cast<int>(i),
                            .fused = fused_form});
    }
  }
  void record(StreamRole s, int event) {
    p_.actions.push_back({.kind = PlacedAction::Kind::kRecord, .stream = s, .event = event});
  }
  void wait(StreamRole s, int event) { p_.actions.push_back({.kind = PlacedAction::Kind::kWait, .stream = s, .event = event}); }
  void reuse(StreamRole s, ForwardBuffer b) {
    p_.actions.push_back({.kind = PlacedAction::Kind::kReuse, .stream = s, .buffer = b});
  }
  bool has(Branch b) const {
    for (const ForwardStep& st : p_.steps)
      if (st.branch == b) return true;
    return false;
  }

 private:
  ForwardPlan& p_;
};

constexpr StreamRole kMain = StreamRole::kMain, kSide = StreamRole::kSide;

}  // namespace

ForwardPlan place(Schedule schedule, std::vector<ForwardStep> steps) {
  ForwardPlan p{.schedule = schedule, .steps = std::move(steps)};
  Placer at(p);
  const bool shared = at.has(Branch::kShared);
  if ((schedule == Schedule::kDual || schedule == Schedule::kPhased) && !shared)
    throw std::invalid_argument("place: schedule '" + std::string(schedule_name(schedule)) +
                                "' needs a shared expert (a layer without one runs serial)");
  // The workspaces change hands on main before anything else: the side stream's use is ordered after it,
  // and the previous call's side work before it (by that call's join).
  at.reuse(kMain, ForwardBuffer::kRoutedWorkspace);
  if (shared) at.reuse(kMain, ForwardBuffer::kSharedWorkspace);
  at.launch_all(Branch::kInput, kMain);
  switch (schedule) {
    case Schedule::kSerial:
      at.launch_all(Branch::kRouted, kMain);
      at.launch_all(Branch::kShared, kMain);
      break;
    case Schedule::kFused:
      at.launch_all(Branch::kRouted, kMain, -1, /*fused=*/true);  // the shared steps run inside the fused ones
      break;
    case Schedule::kDual:
      at.record(kMain, kForkEvent);  // x is ready once main gets here
      at.wait(kSide, kForkEvent);
      at.launch_all(Branch::kShared, kSide);  // before the routed path: issued after it, it would overlap nothing
      at.record(kSide, kJoinEvent);
      at.launch_all(Branch::kRouted, kMain);
      at.wait(kMain, kJoinEvent);
      break;
    case Schedule::kPhased:
      at.launch_all(Branch::kRouted, kMain, 0);
      for (int seg = 1; seg <= 3; ++seg) {
        at.record(kMain, seg);  // kSegmentEvent1..3
        at.wait(kSide, seg);
        at.launch_all(Branch::kShared, kSide, seg);
        if (seg == 3) at.record(kSide, kJoinEvent);
        at.launch_all(Branch::kRouted, kMain, seg);
      }
      at.wait(kMain, kJoinEvent);
      break;
    case Schedule::kAuto: throw std::invalid_argument("place: 'auto' is resolved to a schedule before placing");
  }
  at.launch_all(Branch::kJoin, kMain);
  return p;
}

std::string to_string(const ForwardPlan& p) {
  static const char* const kEvents[] = {"fork", "segment 1", "segment 2", "segment 3", "join"};
  static const char* const kBuffers[] = {"routed workspace", "shared workspace", "shared output"};
  std::string s;
  for (const PlacedAction& a : p.actions) {
    s += a.stream == kMain ? "main  " : "side  ";
    switch (a.kind) {
      case PlacedAction::Kind::kLaunch:
        s += "launch " + std::string(p.steps[a.step].name) + (a.fused ? " (fused form)" : "");
        break;
      case PlacedAction::Kind::kRecord: s += std::string("record ") + kEvents[a.event]; break;
      case PlacedAction::Kind::kWait: s += std::string("wait ") + kEvents[a.event]; break;
      case PlacedAction::Kind::kReuse: s += std::string("reuse ") + kBuffers[static_cast<int>(a.buffer)]; break;
    }
    s += "\n";
  }
  return s;
}

}  // namespace moe
