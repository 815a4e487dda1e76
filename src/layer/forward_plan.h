// The layer's forward described once, and each schedule's placement of that description on streams.
//
// describe_forward() lists the operations of one call in program order: the branch each belongs to and the
// segment of the routed path it lines up with. place() turns the description into what one schedule
// enqueues: launches on the main or the side stream, records and waits of the call's events, and the points
// where the workspaces change hands. MoeLayer runs a placement as it is, so a new operation (an exchange of
// expert parallelism) is added to the description once and every schedule places it.
//
//   serial: everything on main, routed path then shared branch, then the sum;
//   dual:   fork after the input; the whole shared branch on the side stream; join before the sum;
//   phased: the shared steps of segment s start after the routed path reaches segment s (a wait on an event
//           recorded on main as it gets there): 1 = top-k and dispatch, 2 = expert compute, 3 = combine;
//   fused:  one stream; the routed experts' step runs in its fused form, which also computes the shared
//           branch's steps (ops.h: fused), so those are not placed on their own.
//
// The schedules' invariants, which the sanitizer and the schedule fuzzer check (and check/planted_faults.h
// shows they catch the breaking of each): the side stream starts after the input and the workspaces' hand-over
// (the fork, or phased's first wait); the sum starts after the side stream's last step (the join); the shared
// branch uses its own workspace. Phased's second and third waits only pace the shared expert: its segments
// read nothing the routed path writes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "layer/ops/ops.h"
#include "layer/schedule.h"
#include "model/config.h"

namespace moe {

enum class Branch : uint8_t { kInput, kRouted, kShared, kJoin };

using OpMaker = rt::Op (*)(const ops::Context&);

struct ForwardStep {
  std::string_view name;  // the operation's name, as traces show it
  Branch branch = Branch::kRouted;
  // Routed: 0 router, 1 top-k and dispatch, 2 expert compute, 3 combine. Shared: the routed segment it is
  // meant to overlap (1-3). Input and join: 0.
  int segment = 0;
  OpMaker make = nullptr;        // the step's operation
  OpMaker make_fused = nullptr;  // the routed experts' step: the fused schedule's form (also runs the shared steps)
  bool only_when_checking = false;  // check_input: placed always, launched when ForwardOptions::check_input
};

// The steps of one forward of a layer with `config`, in program order (shared steps only with a shared
// expert, shared_gate only with its gate, the sum only with a shared expert). With `expert_parallel` the
// routed path exchanges rows with the experts' owners (ops.h, ep_ops.cpp): ep.pack and ep.dispatch in
// segment 1, ep.group before the expert compute, ep.return and ep.combine in segment 3, so that phased
// lines its shared segments up with dispatch, expert compute and combine.
std::vector<ForwardStep> describe_forward(const MoeConfig& config, bool expert_parallel = false);

enum class StreamRole : uint8_t { kMain, kSide };
// The call's events: the fork, phased's three segment events, the join.
enum ForwardEvent : int { kForkEvent = 0, kSegmentEvent1 = 1, kSegmentEvent2 = 2, kSegmentEvent3 = 3, kJoinEvent = 4 };
inline constexpr int kNumForwardEvents = 5;
// Memory that changes hands (Device::notify_reuse) at a point of the placement.
enum class ForwardBuffer : uint8_t { kRoutedWorkspace, kSharedWorkspace, kSharedOutput };

struct PlacedAction {
  enum class Kind : uint8_t { kLaunch, kRecord, kWait, kReuse };
  Kind kind = Kind::kLaunch;
  StreamRole stream = StreamRole::kMain;
  int step = -1;       // kLaunch: index into ForwardPlan::steps
  bool fused = false;  // kLaunch: the step's fused form
  int event = -1;      // kRecord, kWait: a ForwardEvent
  ForwardBuffer buffer = ForwardBuffer::kRoutedWorkspace;  // kReuse
};

struct ForwardPlan {
  Schedule schedule = Schedule::kSerial;
  std::vector<ForwardStep> steps;
  std::vector<PlacedAction> actions;
  // The shared branch's buffers carved over the routed workspace: never in a placement, only in a plan a
  // checker altered to show that the sanitizer catches one workspace used by two streams.
  bool shared_in_routed_workspace = false;
};

// The placement of `steps` for `schedule` (kSerial, kDual, kPhased or kFused). Throws std::invalid_argument
// for kAuto, and for a multi-stream schedule without shared steps.
ForwardPlan place(Schedule schedule, std::vector<ForwardStep> steps);

// One line per action ("main  launch router", "side  wait segment event 1", ...), for tests and messages.
std::string to_string(const ForwardPlan& plan);

}  // namespace moe
