// Writes a whole file or nothing: content goes to PATH.tmp, renamed over PATH once complete.
#pragma once

#include <string>
#include <string_view>

namespace moe::tools {

// Throws std::runtime_error naming the path on any failure; the temporary file is removed.
void write_file_atomically(const std::string& path, std::string_view content);

}  // namespace moe::tools
