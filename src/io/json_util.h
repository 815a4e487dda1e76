// JSON parsing shared by the safetensors header, the shard index and config.json: nlohmann::json with
// duplicate keys rejected (nlohmann silently keeps the last one, and a file with two entries for one tensor
// name must not load whichever came last).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace moe {

// Parses `text` as one JSON value (trailing whitespace allowed). On bad syntax, invalid UTF-8 or a duplicate
// key anywhere, throws std::runtime_error whose message says what and where (byte offset / key); callers wrap
// it into their own error type with the file name.
nlohmann::json parse_json_strict(std::string_view text);

// "string", "number", "object", ... for messages.
std::string json_type_name(const nlohmann::json& v);

}  // namespace moe
