#include "trace_export.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "output_file.h"

namespace moe::tools {

namespace {

double us(int64_t ns, int64_t t0) { return static_cast<double>(ns - t0) / 1000.0; }

int64_t trace_start(const rt::Trace& t) {
  int64_t t0 = INT64_MAX;
  for (const auto& op : t.ops) t0 = std::min(t0, op.enqueue_ns);
  return t0 == INT64_MAX ? 0 : t0;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A stable colour per operation family (the part of the name before the first dot).
const char* colour_for(const std::string& name) {
  static const char* const kColours[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                         "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  const std::string family = name.substr(0, name.find('.'));
  return kColours[std::hash<std::string>{}(family) % 10];
}

}  // namespace

void write_chrome_trace(const rt::Trace& trace, const std::string& path) {
  using nlohmann::json;
  const int64_t t0 = trace_start(trace);
  json events = json::array();
  std::map<int, std::string> streams;
  for (const auto& op : trace.ops) {
    streams[op.stream_id] = op.stream_name;
    events.push_back({{"name", op.name}, {"cat", "op"}, {"ph", "X"}, {"pid", 1}, {"tid", op.stream_id},
                      {"ts", us(op.start_ns, t0)}, {"dur", us(op.end_ns, op.start_ns)},
                      {"args", {{"seq", op.seq}, {"tiles", op.tiles.size()}, {"enqueued_us", us(op.enqueue_ns, t0)}}}});
    for (const auto& tile : op.tiles)
      events.push_back({{"name", op.name}, {"cat", "tile"}, {"ph", "X"}, {"pid", 2}, {"tid", tile.worker},
                        {"ts", us(tile.start_ns, t0)}, {"dur", us(tile.end_ns, tile.start_ns)},
                        {"args", {{"tile", tile.tile}, {"stream", op.stream_id}}}});
  }
  int flow = 0;
  for (const auto& e : trace.edges) {
    ++flow;
    events.push_back({{"name", "event"}, {"cat", "event"}, {"ph", "s"}, {"id", flow}, {"pid", 1},
                      {"tid", e.from_stream}, {"ts", us(e.time_ns, t0)}});
    events.push_back({{"name", "event"}, {"cat", "event"}, {"ph", "f"}, {"bp", "e"}, {"id", flow}, {"pid", 1},
                      {"tid", e.to_stream}, {"ts", us(e.time_ns, t0)}});
  }
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "streams"}}}});
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 2}, {"args", {{"name", "workers"}}}});
  for (const auto& [id, name] : streams)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", id},
                      {"args", {{"name", "stream " + std::to_string(id) + (name.empty() ? "" : " (" + name + ")")}}}});
  for (int w = 0; w < trace.num_workers; ++w)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 2}, {"tid", w},
                      {"args", {{"name", "worker " + std::to_string(w)}}}});
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ns"}};
  write_file_atomically(path, doc.dump(1));
}

void write_timeline_svg(const rt::Trace& trace, const std::string& title, const std::string& path) {
  const int64_t t0 = trace_start(trace);
  int64_t t1 = t0 + 1;
  std::map<int, std::string> streams;
  std::map<std::pair<int, uint64_t>, const rt::OpRecord*> by_seq;
  for (const auto& op : trace.ops) {
    t1 = std::max(t1, op.end_ns);
    streams[op.stream_id] = op.stream_name;
    by_seq[{op.stream_id, op.seq}] = &op;
  }
  std::map<int, int> stream_lane;
  int lanes = 0;
  for (const auto& [id, name] : streams) stream_lane[id] = lanes++;
  const int worker_lane0 = lanes;
  lanes += trace.num_workers;

  const double left = 150, width = 1100, lane_h = 34, top = 50;
  const double span = static_cast<double>(t1 - t0);
  auto x = [&](int64_t ns) { return left + width * static_cast<double>(ns - t0) / span; };
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  const double height = top + lane_h * lanes + 40;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << left + width + 20 << "' height='" << height
    << "' font-family='sans-serif' font-size='11'>\n"
    << "<defs><marker id='arrow' markerWidth='8' markerHeight='8' refX='7' refY='3' orient='auto'>"
    << "<path d='M0,0 L7,3 L0,6 z' fill='#333'/></marker></defs>\n"
    << "<rect width='100%' height='100%' fill='white'/>\n"
    << "<text x='10' y='20' font-size='14'>" << xml_escape(title) << "</text>\n";
  for (const auto& [id, lane] : stream_lane) {
    const std::string& name = streams[id];
    s << "<text x='10' y='" << top + lane_h * lane + 20 << "'>stream " << id
      << (name.empty() ? "" : " (" + xml_escape(name) + ")") << "</text>\n";
  }
  for (int w = 0; w < trace.num_workers; ++w)
    s << "<text x='10' y='" << top + lane_h * (worker_lane0 + w) + 20 << "' fill='#555'>worker " << w << "</text>\n";
  for (int l = 0; l <= lanes; ++l)
    s << "<line x1='" << left << "' x2='" << left + width << "' y1='" << top + lane_h * l << "' y2='"
      << top + lane_h * l << "' stroke='#ddd'/>\n";
  auto box = [&](double y, int64_t a, int64_t b, const std::string& name, bool label) {
    const double x0 = x(a), w = std::max(0.5, x(b) - x0);
    s << "<rect x='" << x0 << "' y='" << y + 3 << "' width='" << w << "' height='" << lane_h - 6 << "' fill='"
      << colour_for(name) << "' stroke='#222' stroke-width='0.3'><title>" << xml_escape(name) << " "
      << static_cast<double>(b - a) / 1000.0 << " us</title></rect>\n";
    if (label && w > 6.0 * static_cast<double>(name.size()))
      s << "<text x='" << x0 + 2 << "' y='" << y + lane_h / 2 + 4 << "' fill='white'>" << xml_escape(name)
        << "</text>\n";
  };
  for (const auto& op : trace.ops) {
    box(top + lane_h * stream_lane[op.stream_id], op.start_ns, op.end_ns, op.name, true);
    for (const auto& tile : op.tiles) box(top + lane_h * (worker_lane0 + tile.worker), tile.start_ns, tile.end_ns, op.name, false);
  }
  // Event edges: from the end of the recorded work on one stream to the waiting stream's lane.
  for (const auto& e : trace.edges) {
    auto from = stream_lane.find(e.from_stream);
    auto to = stream_lane.find(e.to_stream);
    if (from == stream_lane.end() || to == stream_lane.end()) continue;
    const double y0 = top + lane_h * from->second + lane_h / 2, y1 = top + lane_h * to->second + lane_h / 2;
    const double xa = x(e.time_ns);
    s << "<line x1='" << xa << "' y1='" << y0 << "' x2='" << xa << "' y2='" << (y1 > y0 ? y1 - 8 : y1 + 8)
      << "' stroke='#333' stroke-width='1' marker-end='url(#arrow)'/>\n";
  }
  // Time axis.
  const double axis_y = top + lane_h * lanes + 15;
  for (int i = 0; i <= 10; ++i) {
    const double xi = left + width * i / 10.0;
    s << "<line x1='" << xi << "' x2='" << xi << "' y1='" << axis_y - 10 << "' y2='" << axis_y - 5
      << "' stroke='#333'/><text x='" << xi - 10 << "' y='" << axis_y + 8 << "'>" << span / 1000.0 * i / 10.0
      << " us</text>\n";
  }
  s << "</svg>\n";
  write_file_atomically(path, s.str());
}

}  // namespace moe::tools
