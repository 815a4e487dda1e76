// Internal to the stream sanitizer (sanitizer.cpp, sanitizer_graph.cpp): the wording of its reports.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/sanitizer.h"

namespace moe::rt::detail {

inline bool reads_of(AccessMode m) { return m != AccessMode::kWrite; }
inline bool writes_of(AccessMode m) { return m != AccessMode::kRead; }

// 0x-prefixed hex of an address.
std::string hex(uintptr_t p);
// "'op' (mode, stream id 'name', seq n)", or "'op' (mode, host)".
std::string describe(const AccessSite& a);
// What would order the two accesses of a report (or, for the kinds with one access, what went wrong).
std::string hint(const RaceReport& r);

}  // namespace moe::rt::detail
