// Exports a runtime trace: Chrome trace JSON (opens in Perfetto or chrome://tracing) and an SVG timeline with
// one lane per stream and one per worker, operations as labelled boxes and event waits as arrows.
#pragma once

#include <string>

#include "runtime/runtime.h"

namespace moe::tools {

// Both throw std::runtime_error naming the path when it cannot be written; neither leaves a partial file.
void write_chrome_trace(const rt::Trace& trace, const std::string& path);
void write_timeline_svg(const rt::Trace& trace, const std::string& title, const std::string& path);

}  // namespace moe::tools
