// The wording of the stream sanitizer's reports: the names of hazards and access modes, the sites, and
// the hint that says what would order two accesses.
#include "runtime/sanitizer_report.h"

#include <cstdio>

namespace moe::rt {

const char* to_string(HazardKind kind) {
  switch (kind) {
    case HazardKind::kReadAfterWrite: return "read-after-write";
    case HazardKind::kWriteAfterRead: return "write-after-read";
    case HazardKind::kWriteAfterWrite: return "write-after-write";
    case HazardKind::kFreeWhileInUse: return "free-while-in-use";
    case HazardKind::kReuseBeforeOrdered: return "reuse-before-ordered";
    case HazardKind::kUseAfterFree: return "use-after-free";
    case HazardKind::kUninitializedRead: return "uninitialized-read";
  }
  return "?";
}

const char* to_string(AccessMode mode) {
  switch (mode) {
    case AccessMode::kRead: return "read";
    case AccessMode::kWrite: return "write";
    case AccessMode::kReadWrite: return "read-write";
  }
  return "?";
}

namespace detail {

std::string hex(uintptr_t p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(p));
  return buf;
}

std::string describe(const AccessSite& a) {
  if (a.stream_id < 0) return "'" + a.op + "' (" + to_string(a.mode) + ", host)";
  return "'" + a.op + "' (" + to_string(a.mode) + ", stream " + std::to_string(a.stream_id) + " '" +
         a.stream_name + "', seq " + std::to_string(a.seq) + ")";
}

std::string hint(const RaceReport& r) {
  const std::string& prev_stream = r.previous.stream_name;
  switch (r.kind) {
    case HazardKind::kReadAfterWrite:
    case HazardKind::kWriteAfterRead:
    case HazardKind::kWriteAfterWrite:
      return "record an event on stream '" + prev_stream + "' after '" + r.previous.op + "' and wait on it on '" +
             r.current.stream_name + "' before '" + r.current.op + "'";
    case HazardKind::kFreeWhileInUse:
      return "synchronize stream '" + prev_stream + "' (or an event recorded after '" + r.previous.op +
             "') before freeing";
    case HazardKind::kReuseBeforeOrdered:
      return "the new owner must wait for stream '" + prev_stream + "' after '" + r.previous.op +
             "', or the old owner must be synchronized before the free";
    case HazardKind::kUseAfterFree: return "the bytes were freed on the host and not reallocated";
    case HazardKind::kUninitializedRead:
      return "no operation wrote these bytes since the allocation; write them first (after a host fill, call "
             "note_host_write)";
  }
  return "";
}

}  // namespace detail
}  // namespace moe::rt
