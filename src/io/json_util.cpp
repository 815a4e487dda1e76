#include "io/json_util.h"

#include <set>
#include <stdexcept>
#include <vector>

namespace moe {

namespace {

class DuplicateKey : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace

nlohmann::json parse_json_strict(std::string_view text) {
  // One key set per open object; the callback sees object_start/key/object_end in document order.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      open_objects.emplace_back();
    } else if (event == Event::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Event::key && !open_objects.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second) throw DuplicateKey("duplicate key \"" + key + "\"");
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of input and would accept "{}\0garbage"; valid JSON text
  // never holds a raw NUL (not even inside strings), so reject it outright.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw std::runtime_error("invalid JSON: NUL byte at offset " + std::to_string(nul));
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const DuplicateKey&) {
    throw;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("invalid JSON: ") + e.what());
  }
}

std::string json_type_name(const nlohmann::json& v) {
  if (v.is_number_integer()) return v.is_number_unsigned() || v.get<int64_t>() >= 0 ? "integer" : "negative integer";
  if (v.is_number_float()) return "number with a fraction";
  return v.type_name();
}

}  // namespace moe
