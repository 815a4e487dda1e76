// Process memory figures for reports (not for timed tests).
#pragma once

#include <cstdint>
#include <vector>

namespace moe {

// Peak resident set size of this process since it started or since the last reset_peak_rss() (VmHWM of
// /proc/self/status; getrusage's ru_maxrss where that is unavailable), in bytes.
int64_t peak_rss_bytes();
// Starts a new peak from the current RSS (writes 5 to /proc/self/clear_refs), so that a report can leave a
// large temporary buffer out (bench's bandwidth probe). Returns false where the kernel does not allow it.
bool reset_peak_rss();
// Current resident set size (/proc/self/statm), in bytes; -1 if unavailable.
int64_t current_rss_bytes();

// How the mappings holding some address ranges are backed: resident bytes of every mapping (VMA) that
// overlaps one of the ranges, each mapping counted once, and how many of them are in 2 MiB pages
// (FilePmdMapped, AnonHugePages, ShmemPmdMapped of /proc/self/smaps). resident_bytes is -1 where smaps
// is unavailable.
struct PageCoverage {
  int64_t resident_bytes = -1;
  int64_t huge_bytes = 0;
};
struct AddressRange {
  const void* begin = nullptr;
  uint64_t bytes = 0;
};
PageCoverage page_coverage(const std::vector<AddressRange>& ranges);

}  // namespace moe
