#include "tuning_file.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "output_file.h"

namespace moe::tools {

TuningTable read_tuning_file(const std::string& path) {
  TuningTable table;
  if (path.empty()) return table;
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("tuning file " + path + ": cannot be opened");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const std::string at = "tuning file " + path + ": ";
  if (j.is_discarded() || !j.is_object()) throw std::invalid_argument(at + "not a JSON object");
  if (!j.contains("table") || !j["table"].is_array()) throw std::invalid_argument(at + "expected an array 'table'");
  for (size_t i = 0; i < j["table"].size(); ++i) {
    const nlohmann::json& e = j["table"][i];
    const std::string field = at + "table[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("tokens") || !e["tokens"].is_number_integer() || !e.contains("schedule") ||
        !e["schedule"].is_string())
      throw std::invalid_argument(field + ": expected {\"tokens\": integer, \"schedule\": name}");
    Schedule s;
    try {
      s = parse_schedule(e["schedule"].get<std::string>());
    } catch (const std::invalid_argument& err) {
      throw std::invalid_argument(field + ".schedule: " + err.what());
    }
    table.entries.emplace_back(e["tokens"].get<int64_t>(), s);
  }
  try {
    table.validate();
  } catch (const std::invalid_argument& err) {
    throw std::invalid_argument(at + err.what());
  }
  return table;
}

void write_tuning_file(const std::string& path, const BenchReport& report) {
  std::map<int64_t, const BenchResult*> best;
  for (const BenchResult& b : report.results) {
    if (b.effective.find("+graph") != std::string::npos) continue;  // eager calls only
    const BenchResult*& cur = best[b.tokens];
    if (cur == nullptr || b.median_us < cur->median_us) cur = &b;
  }
  std::vector<TuningEntry> entries;
  for (const auto& [tokens, b] : best) entries.push_back({tokens, b->effective, b->speedup_vs_serial});
  write_tuning_file(path, report.model, report.machine.cpu, report.machine.threads, report.machine.isa, entries);
}

void write_tuning_file(const std::string& path, const std::string& model, const std::string& cpu, int threads,
                       const std::string& isa, const std::vector<TuningEntry>& entries) {
  nlohmann::json table = nlohmann::json::array();
  for (const TuningEntry& e : entries)
    table.push_back({{"tokens", e.tokens}, {"schedule", e.schedule}, {"speedup_vs_serial", e.speedup_vs_serial}});
  const nlohmann::json j = {{"model", model}, {"cpu", cpu}, {"threads", threads}, {"isa", isa}, {"table", table}};
  write_file_atomically(path, j.dump(1));
}

}  // namespace moe::tools
