// Process memory figures for reports (not for timed tests).
#pragma once

#include <cstdint>

namespace moe {

// Peak resident set size of this process since it started or since the last reset_peak_rss() (VmHWM of
// /proc/self/status; getrusage's ru_maxrss where that is unavailable), in bytes.
int64_t peak_rss_bytes();
// Starts a new peak from the current RSS (writes 5 to /proc/self/clear_refs), so that a report can leave a
// large temporary buffer out (bench's bandwidth probe). Returns false where the kernel does not allow it.
bool reset_peak_rss();
// Current resident set size (/proc/self/statm), in bytes; -1 if unavailable.
int64_t current_rss_bytes();

}  // namespace moe
