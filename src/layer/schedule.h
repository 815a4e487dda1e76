// The layer's schedules (how the shared expert is placed against the routed path) and the overlap policies
// that can force a call back to `serial`. Each is a placement of the forward's one description (forward_plan.h).
//
//   serial: every operation on the caller's stream.
//   dual:   form A. Fork after the input is ready; the whole shared expert (and its gate) on the side stream;
//           join before the final sum.
//   phased: form B. The shared expert in three segments, each released by a wait on an event recorded on the
//           main stream: (shared_gate + gate_up) during top-k/dispatch, act during the expert compute, down
//           during the combine; join before the sum.
//   fused:  the alternative to overlap that serving engines use where they can (SGLang's and vLLM's shared-
//           expert fusion): the shared expert joins the routed expert operations as one more, always-chosen
//           expert on the same stream. Its gate_up (with SiLU-and-multiply, and its gate) tiles run in one
//           operation with the routed experts' gate_up, its down tiles in one with their down (the other
//           schedules chain the routed gate_up and down by expert in one operation, "experts"): three fewer
//           operations than serial, and the shared tiles fill workers the routed ones leave idle. One stream,
//           so the overlap policies below do not apply.
//   auto:   the schedule a tuning table measured fastest on this machine for the call's token count
//           (`moe-overlap bench --tune FILE` writes one); serial when the layer has none.
// All schedules run the same arithmetic with the same reduction orders: the output is bitwise identical.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/config.h"

namespace moe {

enum class Schedule : uint8_t { kSerial, kDual, kPhased, kFused, kAuto };

// Every schedule a call can run (kAuto resolves to one of them).
inline constexpr Schedule kRunnableSchedules[] = {Schedule::kSerial, Schedule::kDual, Schedule::kPhased,
                                                  Schedule::kFused};

std::string_view schedule_name(Schedule s);
// Accepts "serial", "dual", "phased", "fused", "auto"; throws std::invalid_argument listing them otherwise.
Schedule parse_schedule(std::string_view name);

// The fastest schedule per token count, measured on this machine (`moe-overlap bench --tune FILE`).
struct TuningTable {
  std::vector<std::pair<int64_t, Schedule>> entries;  // strictly ascending token counts; never kAuto

  bool empty() const { return entries.empty(); }
  // The entry at the largest token count <= tokens, or the first one below them all; serial when empty.
  Schedule pick(int64_t tokens) const;
  // Throws std::invalid_argument naming the entry when the counts are not strictly ascending or an entry
  // is kAuto.
  void validate() const;
};

// When a multi-stream schedule falls back to serial. Every field is an explicit argument; from_env() only
// supplies the defaults:
//   MOE_OVERLAP_MULTI_STREAM    0/1, default 1  (the recipes' on/off switch: 0 = always serial)
//   MOE_OVERLAP_DECODE_ONLY     0/1, default 1  (a call marked prefill stays serial, as form A does)
//   MOE_OVERLAP_TOKEN_THRESHOLD integer >= 0, default 256 (more tokens than this: serial; 0 = no limit;
//                               256 is vLLM's VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD)
struct OverlapPolicy {
  bool multi_stream = true;
  bool decode_only = true;
  int64_t token_threshold = 256;

  // Reads the variables above; throws std::invalid_argument naming the variable when one is malformed.
  static OverlapPolicy from_env();
  // Never falls back (tests and tools that want exactly the schedule they ask for).
  static OverlapPolicy always();
};

struct ScheduleDecision {
  Schedule schedule = Schedule::kSerial;
  std::string reason;  // why it differs from the request; empty when it does not
};

// Why a call runs serial instead of what was asked.
enum class Fallback : uint8_t { kNone, kNoTuningTable, kNoSharedExpert, kMultiStreamOff, kPrefill, kTokenThreshold };

struct ScheduleChoice {
  Schedule schedule = Schedule::kSerial;   // what runs
  Schedule requested = Schedule::kSerial;  // what was asked, with auto resolved through the table
  Fallback fallback = Fallback::kNone;
  bool from_table = false;                 // the request was auto
};

// The schedule a call actually runs: kAuto is resolved through `tuning` (may be null) first, then the
// policies apply to dual and phased. A model without a shared expert (qwen3_moe) always runs serial.
// choose_schedule allocates nothing (forward() calls it every time); decide_schedule adds the reason in words.
ScheduleChoice choose_schedule(const MoeConfig& config, const OverlapPolicy& policy, Schedule requested,
                               int64_t tokens, bool prefill, const TuningTable* tuning = nullptr);
ScheduleDecision decide_schedule(const MoeConfig& config, const OverlapPolicy& policy, Schedule requested,
                                 int64_t tokens, bool prefill, const TuningTable* tuning = nullptr);

}  // namespace moe
