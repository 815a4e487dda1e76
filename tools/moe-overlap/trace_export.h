// Exports a runtime trace: Chrome trace JSON (opens in Perfetto or chrome://tracing) and an SVG timeline with
// one lane per stream and one per worker, operations as labelled boxes and event waits as arrows. Under
// expert parallelism the traces of every rank go into one file: a process per rank in the JSON, each rank's
// lanes stacked in the SVG.
#pragma once

#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace moe::tools {

// One process's trace in a merged export. Its times must already be on a common clock (shift_trace).
struct TracePart {
  std::string label;  // "rank 1"; the process name in the JSON and the lane prefix in the SVG
  rt::Trace trace;
};

// Both throw std::runtime_error naming the path when it cannot be written; neither leaves a partial file.
void write_chrome_trace(const std::vector<TracePart>& parts, const std::string& path);
void write_timeline_svg(const std::vector<TracePart>& parts, const std::string& title, const std::string& path);
// One process: a single part without a lane prefix.
void write_chrome_trace(const rt::Trace& trace, const std::string& path);
void write_timeline_svg(const rt::Trace& trace, const std::string& title, const std::string& path);

// A trace as text and back, to send it to another rank. parse_trace throws std::invalid_argument on text
// that serialize_trace did not write.
std::string serialize_trace(const rt::Trace& trace);
rt::Trace parse_trace(const std::string& text);
// Adds `ns` to every time in `trace` (onto another process's clock).
void shift_trace(rt::Trace& trace, int64_t ns);

}  // namespace moe::tools
