#include "layer/schedule.h"

#include <cstdlib>
#include <stdexcept>

namespace moe {

std::string_view schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kSerial: return "serial";
    case Schedule::kDual: return "dual";
    case Schedule::kPhased: return "phased";
    case Schedule::kFused: return "fused";
    case Schedule::kAuto: return "auto";
  }
  return "?";
}

Schedule parse_schedule(std::string_view name) {
  for (Schedule s : kRunnableSchedules)
    if (schedule_name(s) == name) return s;
  if (name == schedule_name(Schedule::kAuto)) return Schedule::kAuto;
  throw std::invalid_argument("unknown schedule '" + std::string(name) +
                              "' (expected serial, dual, phased, fused or auto)");
}

Schedule TuningTable::pick(int64_t tokens) const {
  if (entries.empty()) return Schedule::kSerial;
  Schedule s = entries.front().second;
  for (const auto& [t, schedule] : entries)
    if (t <= tokens) s = schedule;
  return s;
}

void TuningTable::validate() const {
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string at = "tuning entry " + std::to_string(i) + " (" + std::to_string(entries[i].first) + " tokens)";
    if (entries[i].second == Schedule::kAuto) throw std::invalid_argument(at + ": schedule 'auto' cannot be an entry");
    if (entries[i].first < 0) throw std::invalid_argument(at + ": token count must be >= 0");
    if (i > 0 && entries[i].first <= entries[i - 1].first)
      throw std::invalid_argument(at + ": token counts must be strictly ascending");
  }
}

namespace {

int64_t env_int(const char* var, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi)
    throw std::invalid_argument(std::string("environment variable ") + var + "='" + v + "': expected an integer in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

}  // namespace

OverlapPolicy OverlapPolicy::from_env() {
  OverlapPolicy p;
  p.multi_stream = env_int("MOE_OVERLAP_MULTI_STREAM", 1, 0, 1) != 0;
  p.decode_only = env_int("MOE_OVERLAP_DECODE_ONLY", 1, 0, 1) != 0;
  p.token_threshold = env_int("MOE_OVERLAP_TOKEN_THRESHOLD", 256, 0, int64_t{1} << 40);
  return p;
}

OverlapPolicy OverlapPolicy::always() { return {.multi_stream = true, .decode_only = false, .token_threshold = 0}; }

ScheduleChoice choose_schedule(const MoeConfig& config, const OverlapPolicy& policy, Schedule requested,
                               int64_t tokens, bool prefill, const TuningTable* tuning) {
  ScheduleChoice c{.from_table = requested == Schedule::kAuto};
  if (c.from_table) {
    if (tuning == nullptr || tuning->empty()) {
      c.fallback = Fallback::kNoTuningTable;
      return c;
    }
    requested = tuning->pick(tokens);
  }
  c.requested = requested;
  if (requested == Schedule::kSerial) return c;
  if (!config.has_shared_expert()) c.fallback = Fallback::kNoSharedExpert;
  else if (requested == Schedule::kFused) c.schedule = requested;  // one stream: no overlap policy applies
  else if (!policy.multi_stream) c.fallback = Fallback::kMultiStreamOff;
  else if (policy.decode_only && prefill) c.fallback = Fallback::kPrefill;
  else if (policy.token_threshold > 0 && tokens > policy.token_threshold) c.fallback = Fallback::kTokenThreshold;
  else c.schedule = requested;
  return c;
}

ScheduleDecision decide_schedule(const MoeConfig& config, const OverlapPolicy& policy, Schedule requested,
                                 int64_t tokens, bool prefill, const TuningTable* tuning) {
  const ScheduleChoice c = choose_schedule(config, policy, requested, tokens, prefill, tuning);
  std::string why;
  switch (c.fallback) {
    case Fallback::kNone: break;
    case Fallback::kNoTuningTable:
      why = "auto without a tuning table (moe-overlap bench --tune FILE measures one)";
      break;
    case Fallback::kNoSharedExpert:
      why = "model_type " + config.model_type + " has no shared expert: nothing to overlap";
      break;
    case Fallback::kMultiStreamOff: why = "multi-stream overlap is off (MOE_OVERLAP_MULTI_STREAM=0)"; break;
    case Fallback::kPrefill: why = "prefill call under the decode-only policy"; break;
    case Fallback::kTokenThreshold:
      why = std::to_string(tokens) + " tokens > token threshold " + std::to_string(policy.token_threshold);
      break;
  }
  if (c.from_table && c.fallback != Fallback::kNoTuningTable) {
    const std::string chose = "auto: " + std::string(schedule_name(c.requested)) + " from the tuning table";
    why = why.empty() ? chose : chose + ", then " + why;
  }
  return {c.schedule, why};
}

}  // namespace moe
