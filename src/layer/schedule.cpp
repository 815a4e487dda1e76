#include "layer/schedule.h"

#include <cstdlib>
#include <stdexcept>

namespace moe {

std::string_view schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kSerial: return "serial";
    case Schedule::kDual: return "dual";
    case Schedule::kPhased: return "phased";
  }
  return "?";
}

Schedule parse_schedule(std::string_view name) {
  for (Schedule s : {Schedule::kSerial, Schedule::kDual, Schedule::kPhased})
    if (schedule_name(s) == name) return s;
  throw std::invalid_argument("unknown schedule '" + std::string(name) + "' (expected serial, dual or phased)");
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

ScheduleDecision decide_schedule(const MoeConfig& config, const OverlapPolicy& policy, Schedule requested,
                                 int64_t tokens, bool prefill) {
  if (requested == Schedule::kSerial) return {Schedule::kSerial, ""};
  if (!config.has_shared_expert())
    return {Schedule::kSerial, "model_type " + config.model_type + " has no shared expert: nothing to overlap"};
  if (!policy.multi_stream) return {Schedule::kSerial, "multi-stream overlap is off (MOE_OVERLAP_MULTI_STREAM=0)"};
  if (policy.decode_only && prefill) return {Schedule::kSerial, "prefill call under the decode-only policy"};
  if (policy.token_threshold > 0 && tokens > policy.token_threshold)
    return {Schedule::kSerial, std::to_string(tokens) + " tokens > token threshold " +
                                   std::to_string(policy.token_threshold)};
  return {requested, ""};
}

}  // namespace moe
