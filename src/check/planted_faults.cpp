#include "check/planted_faults.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace moe {

std::string_view fault_name(PlantedFault f) {
  switch (f) {
    case PlantedFault::kDropForkWait: return "drop_fork_wait";
    case PlantedFault::kDropJoinWait: return "drop_join_wait";
    case PlantedFault::kSharedUsesRoutedWorkspace: return "shared_uses_routed_workspace";
    case PlantedFault::kReleaseSharedOutputEarly: return "release_shared_output_early";
    case PlantedFault::kSkipSegmentWait1: return "skip_segment_wait_1";
    case PlantedFault::kSkipSegmentWait2: return "skip_segment_wait_2";
    case PlantedFault::kSkipSegmentWait3: return "skip_segment_wait_3";
  }
  return "?";
}

bool breaks_ordering(PlantedFault f) {
  return f != PlantedFault::kSkipSegmentWait2 && f != PlantedFault::kSkipSegmentWait3;
}

bool applies(PlantedFault f, Schedule s) {
  switch (f) {
    case PlantedFault::kDropForkWait: return s == Schedule::kDual;
    case PlantedFault::kDropJoinWait:
    case PlantedFault::kSharedUsesRoutedWorkspace:
    case PlantedFault::kReleaseSharedOutputEarly: return s == Schedule::kDual || s == Schedule::kPhased;
    case PlantedFault::kSkipSegmentWait1:
    case PlantedFault::kSkipSegmentWait2:
    case PlantedFault::kSkipSegmentWait3: return s == Schedule::kPhased;
  }
  return false;
}

namespace {

using Kind = PlacedAction::Kind;

// Removes the one wait on `event` by `stream`.
void drop_wait(ForwardPlan& p, StreamRole stream, int event) {
  auto it = std::find_if(p.actions.begin(), p.actions.end(), [&](const PlacedAction& a) {
    return a.kind == Kind::kWait && a.stream == stream && a.event == event;
  });
  if (it == p.actions.end()) throw std::logic_error("plant: the placement has no such wait");
  p.actions.erase(it);
}

}  // namespace

ForwardPlan plant(const ForwardPlan& plan, PlantedFault f) {
  if (!applies(f, plan.schedule))
    throw std::invalid_argument("plant: fault '" + std::string(fault_name(f)) + "' does not apply to schedule '" +
                                std::string(schedule_name(plan.schedule)) + "'");
  ForwardPlan p = plan;
  switch (f) {
    case PlantedFault::kDropForkWait: drop_wait(p, StreamRole::kSide, kForkEvent); break;
    case PlantedFault::kDropJoinWait: drop_wait(p, StreamRole::kMain, kJoinEvent); break;
    case PlantedFault::kSharedUsesRoutedWorkspace: p.shared_in_routed_workspace = true; break;
    case PlantedFault::kReleaseSharedOutputEarly: {
      auto it = std::find_if(p.actions.begin(), p.actions.end(), [](const PlacedAction& a) {
        return a.kind == Kind::kRecord && a.stream == StreamRole::kSide && a.event == kJoinEvent;
      });
      if (it == p.actions.end()) throw std::logic_error("plant: the placement has no join");
      p.actions.insert(it + 1, PlacedAction{.kind = Kind::kReuse, .stream = StreamRole::kSide,
                                            .buffer = ForwardBuffer::kSharedOutput});
      break;
    }
    case PlantedFault::kSkipSegmentWait1: drop_wait(p, StreamRole::kSide, kSegmentEvent1); break;
    case PlantedFault::kSkipSegmentWait2: drop_wait(p, StreamRole::kSide, kSegmentEvent2); break;
    case PlantedFault::kSkipSegmentWait3: drop_wait(p, StreamRole::kSide, kSegmentEvent3); break;
  }
  return p;
}

}  // namespace moe
