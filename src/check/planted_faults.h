// Faults a checker plants in a layer's placement (layer/forward_plan.h) to show that the stream sanitizer
// reports each one and the schedule fuzzer turns each into a wrong output: the checks of the real layer can
// fail. The production path knows nothing of them; MoeLayer::forward_plan() runs the altered placement.
//
// Each is a bug seen in serving engines' shared-expert overlap:
//   drop_fork_wait              dual: the side stream does not wait for the fork (a missing wait before the
//                               side stream reads: it also writes its workspace while main hands it over)
//   drop_join_wait              dual, phased: the sum does not wait for the side stream's last step
//   shared_uses_routed_workspace dual, phased: one workspace used by both streams
//   release_shared_output_early dual, phased: the side stream hands its output over (a reuse: the fuzzer's
//                               Poisoner fills it) right after producing it, before the sum on main read it
//   skip_segment_wait_1/2/3     phased: one of its three segment waits is left out. The first is phased's
//                               fork; the second and third only pace the shared expert (its segments read
//                               nothing the routed path writes), so leaving them out is NOT a bug, and the
//                               checkers must not report it.
#pragma once

#include <string_view>
#include <vector>

#include "layer/forward_plan.h"

namespace moe {

enum class PlantedFault : uint8_t {
  kDropForkWait,
  kDropJoinWait,
  kSharedUsesRoutedWorkspace,
  kReleaseSharedOutputEarly,
  kSkipSegmentWait1,
  kSkipSegmentWait2,
  kSkipSegmentWait3,
};

inline constexpr PlantedFault kAllPlantedFaults[] = {
    PlantedFault::kDropForkWait,          PlantedFault::kDropJoinWait,     PlantedFault::kSharedUsesRoutedWorkspace,
    PlantedFault::kReleaseSharedOutputEarly, PlantedFault::kSkipSegmentWait1, PlantedFault::kSkipSegmentWait2,
    PlantedFault::kSkipSegmentWait3};

std::string_view fault_name(PlantedFault f);
// Whether the fault breaks the program (false: skip_segment_wait_2/3, which only change the pacing).
bool breaks_ordering(PlantedFault f);
// Whether the fault applies to a placement of `s`.
bool applies(PlantedFault f, Schedule s);
// `plan` with the fault planted. Throws std::invalid_argument when it does not apply to the plan's schedule.
ForwardPlan plant(const ForwardPlan& plan, PlantedFault f);

}  // namespace moe
