// Process memory figures for reports (not for timed tests).
#pragma once

#include <cstdint>

namespace moe {

// Peak resident set size of this process so far (getrusage ru_maxrss), in bytes.
int64_t peak_rss_bytes();
// Current resident set size (/proc/self/statm), in bytes; -1 if unavailable.
int64_t current_rss_bytes();

}  // namespace moe
