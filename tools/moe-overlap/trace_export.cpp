#include "trace_export.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "output_file.h"

namespace moe::tools {

namespace {

double us(int64_t ns, int64_t t0) { return static_cast<double>(ns - t0) / 1000.0; }

int64_t trace_start(const std::vector<TracePart>& parts) {
  int64_t t0 = INT64_MAX;
  for (const TracePart& p : parts)
    for (const auto& op : p.trace.ops) t0 = std::min(t0, op.enqueue_ns);
  return t0 == INT64_MAX ? 0 : t0;
}

// The end of the last op (at least t0 + 1).
int64_t trace_end(const std::vector<TracePart>& parts, int64_t t0) {
  int64_t t1 = t0 + 1;
  for (const TracePart& p : parts)
    for (const auto& op : p.trace.ops) t1 = std::max(t1, op.end_ns);
  return t1;
}

// A sleep as both exports show it: within the ops' span [t0, t1) (a sleep begun before the first op was
// enqueued from there, one still open when the trace was taken up to the last op's end); false if none of it is.
bool sleep_span(const rt::SleepRecord& z, int64_t t0, int64_t t1, int64_t* start, int64_t* end) {
  *start = std::max(z.start_ns, t0);
  *end = std::min(z.end_ns, t1);
  return *end > *start;
}

// Worker lanes' thread ids in the JSON, above any stream id.
constexpr int kWorkerTid0 = 1000;

std::string stream_label(const std::string& prefix, int id, const std::string& name) {
  return prefix + "stream " + std::to_string(id) + (name.empty() ? "" : " (" + name + ")");
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

void write_chrome_trace(const std::vector<TracePart>& parts, const std::string& path) {
  using nlohmann::json;
  const int64_t t0 = trace_start(parts), t1 = trace_end(parts, t0);
  json events = json::array();
  int flow = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const rt::Trace& trace = parts[i].trace;
    const int pid = static_cast<int>(i) + 1;
    std::map<int, std::string> streams;
    for (const auto& op : trace.ops) {
      streams[op.stream_id] = op.stream_name;
      events.push_back({{"name", op.name}, {"cat", "op"}, {"ph", "X"}, {"pid", pid}, {"tid", op.stream_id},
                        {"ts", us(op.start_ns, t0)}, {"dur", us(op.end_ns, op.start_ns)},
                        {"args", {{"seq", op.seq}, {"tiles", op.tiles.size()}, {"enqueued_us", us(op.enqueue_ns, t0)}}}});
      for (const auto& tile : op.tiles)
        events.push_back({{"name", op.name}, {"cat", "tile"}, {"ph", "X"}, {"pid", pid},
                          {"tid", kWorkerTid0 + tile.worker}, {"ts", us(tile.start_ns, t0)},
                          {"dur", us(tile.end_ns, tile.start_ns)}, {"args", {{"tile", tile.tile}, {"stream", op.stream_id}}}});
    }
    for (const auto& e : trace.edges) {
      ++flow;
      events.push_back({{"name", "event"}, {"cat", "event"}, {"ph", "s"}, {"id", flow}, {"pid", pid},
                        {"tid", e.from_stream}, {"ts", us(e.time_ns, t0)}});
      events.push_back({{"name", "event"}, {"cat", "event"}, {"ph", "f"}, {"bp", "e"}, {"id", flow}, {"pid", pid},
                        {"tid", e.to_stream}, {"ts", us(e.time_ns, t0)}});
    }
    // A worker asleep: it had to be woken (a system call on the waker's side) before it could run more.
    for (const auto& z : trace.sleeps) {
      int64_t start, end;
      if (!sleep_span(z, t0, t1, &start, &end)) continue;
      events.push_back({{"name", "asleep"}, {"cat", "sleep"}, {"ph", "X"}, {"pid", pid},
                        {"tid", kWorkerTid0 + z.worker}, {"ts", us(start, t0)}, {"dur", us(end, start)}});
    }
    const std::string label = parts[i].label.empty() ? "moe-overlap" : parts[i].label;
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", label}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    for (const auto& [id, name] : streams)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", id},
                        {"args", {{"name", stream_label("", id, name)}}}});
    for (int w = 0; w < trace.num_workers; ++w)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", kWorkerTid0 + w},
                        {"args", {{"name", "worker " + std::to_string(w)}}}});
  }
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ns"}};
  write_file_atomically(path, doc.dump(1));
}

void write_timeline_svg(const std::vector<TracePart>& parts, const std::string& title, const std::string& path) {
  const int64_t t0 = trace_start(parts), t1 = trace_end(parts, t0);
  // Lanes, top to bottom: every part's streams, then its workers.
  struct Lane {
    std::string label;
    bool worker = false;
  };
  std::vector<Lane> lanes;
  std::vector<std::map<int, int>> stream_lane(parts.size());
  std::vector<int> worker_lane0(parts.size());
  std::vector<int> first_lane(parts.size());
  bool prefixed = false;
  for (const TracePart& p : parts) prefixed |= !p.label.empty();
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string prefix = parts[i].label.empty() ? "" : parts[i].label + ": ";
    std::map<int, std::string> streams;
    for (const auto& op : parts[i].trace.ops) streams[op.stream_id] = op.stream_name;
    first_lane[i] = static_cast<int>(lanes.size());
    for (const auto& [id, name] : streams) {
      stream_lane[i][id] = static_cast<int>(lanes.size());
      lanes.push_back({stream_label(prefix, id, name), false});
    }
    worker_lane0[i] = static_cast<int>(lanes.size());
    for (int w = 0; w < parts[i].trace.num_workers; ++w) lanes.push_back({prefix + "worker " + std::to_string(w), true});
  }
  const int num_lanes = static_cast<int>(lanes.size());

  const double left = prefixed ? 210 : 150, width = 1100, lane_h = 34, top = 50;
  const double span = static_cast<double>(t1 - t0);
  auto x = [&](int64_t ns) { return left + width * static_cast<double>(ns - t0) / span; };
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  const double height = top + lane_h * num_lanes + 40;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << left + width + 20 << "' height='" << height
    << "' font-family='sans-serif' font-size='11'>\n"
    << "<defs><marker id='arrow' markerWidth='8' markerHeight='8' refX='7' refY='3' orient='auto'>"
    << "<path d='M0,0 L7,3 L0,6 z' fill='#333'/></marker></defs>\n"
    << "<rect width='100%' height='100%' fill='white'/>\n"
    << "<text x='10' y='20' font-size='14'>" << xml_escape(title) << "</text>\n";
  for (int l = 0; l < num_lanes; ++l)
    s << "<text x='10' y='" << top + lane_h * l + 20 << "'" << (lanes[l].worker ? " fill='#555'" : "") << ">"
      << xml_escape(lanes[l].label) << "</text>\n";
  for (int l = 0; l <= num_lanes; ++l) {
    // A darker rule where one part's lanes end and the next part's begin.
    const bool boundary = l > 0 && l < num_lanes && std::find(first_lane.begin(), first_lane.end(), l) != first_lane.end();
    s << "<line x1='" << (boundary ? 0.0 : left) << "' x2='" << left + width << "' y1='" << top + lane_h * l
      << "' y2='" << top + lane_h * l << "' stroke='" << (boundary ? "#888" : "#ddd") << "'/>\n";
  }
  auto box = [&](double y, int64_t a, int64_t b, const std::string& name, bool label) {
    const double x0 = x(a), w = std::max(0.5, x(b) - x0);
    s << "<rect x='" << x0 << "' y='" << y + 3 << "' width='" << w << "' height='" << lane_h - 6 << "' fill='"
      << colour_for(name) << "' stroke='#222' stroke-width='0.3'><title>" << xml_escape(name) << " "
      << static_cast<double>(b - a) / 1000.0 << " us</title></rect>\n";
    if (label && w > 6.0 * static_cast<double>(name.size()))
      s << "<text x='" << x0 + 2 << "' y='" << y + lane_h / 2 + 4 << "' fill='white'>" << xml_escape(name)
        << "</text>\n";
  };
  for (size_t i = 0; i < parts.size(); ++i) {
    for (const auto& op : parts[i].trace.ops) {
      box(top + lane_h * stream_lane[i][op.stream_id], op.start_ns, op.end_ns, op.name, true);
      for (const auto& tile : op.tiles)
        box(top + lane_h * (worker_lane0[i] + tile.worker), tile.start_ns, tile.end_ns, op.name, false);
    }
    // A worker asleep: a thin grey bar at the foot of its lane, where it had to be woken to go on.
    for (const auto& z : parts[i].trace.sleeps) {
      int64_t a, b;
      if (!sleep_span(z, t0, t1, &a, &b)) continue;
      s << "<rect x='" << x(a) << "' y='" << top + lane_h * (worker_lane0[i] + z.worker + 1) - 4 << "' width='"
        << std::max(0.5, x(b) - x(a)) << "' height='3' fill='#999'><title>asleep "
        << static_cast<double>(b - a) / 1000.0 << " us</title></rect>\n";
    }
    // Event edges: from the end of the recorded work on one stream to the waiting stream's lane.
    for (const auto& e : parts[i].trace.edges) {
      auto from = stream_lane[i].find(e.from_stream);
      auto to = stream_lane[i].find(e.to_stream);
      if (from == stream_lane[i].end() || to == stream_lane[i].end()) continue;
      const double y0 = top + lane_h * from->second + lane_h / 2, y1 = top + lane_h * to->second + lane_h / 2;
      const double xa = x(e.time_ns);
      s << "<line x1='" << xa << "' y1='" << y0 << "' x2='" << xa << "' y2='" << (y1 > y0 ? y1 - 8 : y1 + 8)
        << "' stroke='#333' stroke-width='1' marker-end='url(#arrow)'/>\n";
    }
  }
  // Time axis.
  const double axis_y = top + lane_h * num_lanes + 15;
  for (int i = 0; i <= 10; ++i) {
    const double xi = left + width * i / 10.0;
    s << "<line x1='" << xi << "' x2='" << xi << "' y1='" << axis_y - 10 << "' y2='" << axis_y - 5
      << "' stroke='#333'/><text x='" << xi - 10 << "' y='" << axis_y + 8 << "'>" << span / 1000.0 * i / 10.0
      << " us</text>\n";
  }
  s << "</svg>\n";
  write_file_atomically(path, s.str());
}

void write_chrome_trace(const rt::Trace& trace, const std::string& path) {
  write_chrome_trace(std::vector<TracePart>{{"", trace}}, path);
}

void write_timeline_svg(const rt::Trace& trace, const std::string& title, const std::string& path) {
  write_timeline_svg(std::vector<TracePart>{{"", trace}}, title, path);
}

std::string serialize_trace(const rt::Trace& trace) {
  using nlohmann::json;
  json ops = json::array(), edges = json::array(), sleeps = json::array();
  for (const rt::OpRecord& op : trace.ops) {
    json tiles = json::array();
    for (const rt::TileRecord& t : op.tiles) tiles.push_back({t.tile, t.worker, t.start_ns, t.end_ns});
    ops.push_back({op.stream_id, op.stream_name, op.name, op.seq, op.enqueue_ns, op.start_ns, op.end_ns,
                   op.graph_node, tiles});
  }
  for (const rt::EdgeRecord& e : trace.edges) edges.push_back({e.from_stream, e.from_seq, e.to_stream, e.to_seq, e.time_ns});
  for (const rt::SleepRecord& z : trace.sleeps) sleeps.push_back({z.worker, z.start_ns, z.end_ns});
  return json{{"workers", trace.num_workers}, {"ops", ops}, {"edges", edges}, {"sleeps", sleeps}}.dump();
}

rt::Trace parse_trace(const std::string& text) {
  rt::Trace t;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    t.num_workers = j.at("workers").get<int>();
    for (const auto& o : j.at("ops")) {
      rt::OpRecord r{.stream_id = o.at(0).get<int>(),
                     .stream_name = o.at(1).get<std::string>(),
                     .name = o.at(2).get<std::string>(),
                     .seq = o.at(3).get<uint64_t>(),
                     .enqueue_ns = o.at(4).get<int64_t>(),
                     .start_ns = o.at(5).get<int64_t>(),
                     .end_ns = o.at(6).get<int64_t>(),
                     .graph_node = o.at(7).get<int>()};
      for (const auto& tile : o.at(8))
        r.tiles.push_back({tile.at(0).get<int>(), tile.at(1).get<int>(), tile.at(2).get<int64_t>(), tile.at(3).get<int64_t>()});
      t.ops.push_back(std::move(r));
    }
    for (const auto& e : j.at("edges"))
      t.edges.push_back({e.at(0).get<int>(), e.at(1).get<uint64_t>(), e.at(2).get<int>(), e.at(3).get<uint64_t>(),
                         e.at(4).get<int64_t>()});
    for (const auto& z : j.at("sleeps"))
      t.sleeps.push_back({z.at(0).get<int>(), z.at(1).get<int64_t>(), z.at(2).get<int64_t>()});
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("a serialized trace is malformed: ") + e.what());
  }
  return t;
}

void shift_trace(rt::Trace& trace, int64_t ns) {
  for (rt::OpRecord& op : trace.ops) {
    op.enqueue_ns += ns;
    op.start_ns += ns;
    op.end_ns += ns;
    for (rt::TileRecord& t : op.tiles) t.start_ns += ns, t.end_ns += ns;
  }
  for (rt::EdgeRecord& e : trace.edges) e.time_ns += ns;
  for (rt::SleepRecord& z : trace.sleeps) z.start_ns += ns, z.end_ns += ns;
}

}  // namespace moe::tools
