#include "io/rss.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace moe {

int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:  1234 kB"
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

int64_t current_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return -1;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

PageCoverage page_coverage(const std::vector<AddressRange>& ranges) {
  std::ifstream smaps("/proc/self/smaps");
  PageCoverage c;
  if (!smaps) return c;
  c.resident_bytes = 0;
  bool counted = false;  // whether the current mapping overlaps a range
  for (std::string line; std::getline(smaps, line);) {
    // A mapping's first line is "lo-hi perms offset dev inode path"; its fields follow as "Name:  value".
    const std::string first = line.substr(0, line.find(' '));
    unsigned long lo = 0, hi = 0;
    if (first.find(':') == std::string::npos && std::sscanf(first.c_str(), "%lx-%lx", &lo, &hi) == 2) {
      counted = false;
      for (const AddressRange& r : ranges) {
        const auto b = reinterpret_cast<uintptr_t>(r.begin);
        counted |= r.bytes > 0 && b < hi && b + r.bytes > lo;
      }
      continue;
    }
    if (!counted) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, colon);
    const int64_t bytes = std::atoll(line.c_str() + colon + 1) * 1024;  // "Rss:   1234 kB"
    if (key == "Rss") c.resident_bytes += bytes;
    if (key == "FilePmdMapped" || key == "AnonHugePages" || key == "ShmemPmdMapped") c.huge_bytes += bytes;
  }
  return c;
}

}  // namespace moe
