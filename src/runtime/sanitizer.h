// The stream sanitizer: finds operations on different streams that touch the same bytes without an event
// (or a host synchronisation) ordering them, and memory freed or reused while another stream may still use it.
//
// The algorithm is PyTorch's CUDA sanitizer (torch.cuda._sanitizer): every stream keeps a vector clock; a
// launch ticks the stream's own component; record copies the stream's clock into the event; wait merges the
// event's clock into the stream's; stream, event and device synchronisation merge into a host clock, and
// every stream's view then includes the host's. Two accesses conflict when their byte ranges overlap, at
// least one writes, and the earlier is not ordered before the later by the clocks. Extended where that tool is
// blind:
//   - byte ranges instead of base pointers (a view at an offset conflicts with the overlapping bytes only);
//     the state lives in an interval map, so an access costs O(log n + ranges it overlaps), not history;
//   - allocation epochs (Device::notify_alloc / notify_free): a host free while an operation that is not yet
//     ordered before the host still uses the bytes, a reallocation whose first use is not ordered after the
//     previous owner's accesses, an access to freed bytes, and a read of bytes of a fresh allocation that no
//     operation (nor the host, see note_host_write) has written.
// Graph replays (graph.h) are checked too: the captured DAG on its own, and each replay against other streams.
//
// Example:
//   auto dev = moe::rt::make_cpu_device();
//   auto san = moe::rt::enable_sanitizer(*dev);               // throws RaceError at the racing launch
//   auto col = moe::rt::enable_sanitizer(*dev, {.throw_on_first = false});  // or collect: col->reports()
//
// Off (no observer registered) it costs the runtime one empty-vector check per call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/runtime.h"

namespace moe::rt {

class GraphExec;
struct GraphNode;

enum class HazardKind : uint8_t {
  kReadAfterWrite,      // a read not ordered after another stream's write
  kWriteAfterRead,      // a write not ordered after another stream's read
  kWriteAfterWrite,     // a write not ordered after another stream's write
  kFreeWhileInUse,      // a host free while an access is not ordered before the host
  kReuseBeforeOrdered,  // a reallocation's use not ordered after the previous allocation's access
  kUseAfterFree,        // an access to freed bytes (not reallocated since)
  kUninitializedRead,   // a read of bytes of a fresh allocation nothing has written
};
const char* to_string(HazardKind kind);

// An operation with Op::fills_garbage (schedule_fuzz.h's launch_poison) is checked like any write, but
// leaves the bytes it writes uninitialised.
const char* to_string(AccessMode mode);

// One side of a hazard. For the host, stream_id is -1 and stream_name "host".
struct AccessSite {
  std::string op;
  int stream_id = -1;
  std::string stream_name;
  uint64_t seq = 0;  // the operation's position on its stream
  AccessMode mode = AccessMode::kRead;
};

struct RaceReport {
  HazardKind kind = HazardKind::kReadAfterWrite;
  AccessSite current;   // the later access (the one that found the hazard)
  AccessSite previous;  // the earlier access; for kUninitializedRead/kUseAfterFree, the allocation
  const void* ptr = nullptr;  // the conflicting bytes [ptr, ptr + bytes)
  size_t bytes = 0;
  const void* buffer = nullptr;  // the announced allocation holding them (null: never announced)
  size_t buffer_bytes = 0;
  std::string message;  // all of the above in one line, with a hint
};

class RaceError : public std::runtime_error {
 public:
  explicit RaceError(RaceReport report) : std::runtime_error(report.message), report_(std::move(report)) {}
  const RaceReport& report() const { return report_; }

 private:
  RaceReport report_;
};

struct SanitizerOptions {
  // Throw RaceError from the API call that found the first hazard (the operation is then not enqueued), or
  // collect every hazard in reports().
  bool throw_on_first = true;
  // A host free must be ordered after every access (the CPU device's memory is really freed). Off: frees are
  // stream-ordered like a caching allocator's, and only the reuse is checked.
  bool host_ordered_free = true;
  bool check_uninitialized = true;
};

class Sanitizer : public Observer {
 public:
  explicit Sanitizer(SanitizerOptions options = {});
  ~Sanitizer() override;

  std::vector<RaceReport> reports() const;
  std::vector<RaceReport> take_reports();
  size_t num_reports() const;
  // Ranges in the interval map (diagnostics: adjacent ranges in the same state are merged).
  size_t num_ranges() const;
  // Forget all streams, events and ranges (between independent programs on one device).
  void reset();

  // Host accesses the runtime cannot see (a memcpy into a buffer, a host-side fill). A host write must be
  // ordered after every earlier access; every later launch is ordered after it.
  void host_write(const void* p, size_t bytes);
  void host_read(const void* p, size_t bytes);

  void on_stream_created(const Stream& s) override;
  void on_launch(const Stream& s, uint64_t seq, const Op& op) override;
  void on_record(const Stream& s, uint64_t seq, const Event& e) override;
  void on_wait(const Stream& s, uint64_t seq, const Event& e) override;
  void on_stream_synchronize(const Stream& s) override;
  void on_event_synchronize(const Event& e) override;
  void on_device_synchronize() override;
  void on_alloc(const void* p, size_t bytes) override;
  void on_free(const void* p, size_t bytes) override;
  // A replay: its nodes are checked once against each other (check_graph), and every replay as one access
  // set at (s, seq) against the eager work of other streams.
  void on_graph_launch(const Stream& s, uint64_t seq, const GraphExec& exec) override;

 private:
  using Clock = std::vector<uint64_t>;  // indexed by the sanitizer's stream index
  static constexpr uint32_t kHost = UINT32_MAX;

  struct Record {  // one access as remembered in the interval map
    uint32_t stream = kHost;
    uint32_t name = 0;
    uint64_t seq = 0;
    uint32_t alloc = 0;  // the allocation the bytes belonged to at the time (0: none announced)
    AccessMode mode = AccessMode::kRead;
    bool operator==(const Record&) const = default;
  };
  struct Segment {  // the bytes [begin, end); begin is the map key
    uintptr_t end = 0;
    bool has_write = false;
    Record write;
    std::vector<Record> reads;  // the latest read of each stream since the write
    uint32_t alloc = 0;
    bool initialized = true;
    bool freed = false;
    bool same_state(const Segment& o) const;
  };
  struct StreamState {
    Clock clock;
    int id = 0;
    std::string name;
  };
  struct EventState {
    std::weak_ptr<EventImpl> owner;  // an event freed and its address reused starts afresh
    Clock clock;
  };
  struct Allocation {
    uintptr_t begin = 0;
    size_t bytes = 0;
  };
  struct Pending;  // hazards of one access, merged per earlier access

  uint32_t stream_index(const Stream& s);
  uint32_t intern(const std::string& name);
  bool ordered(const Record& earlier, uint32_t later_stream) const;
  bool host_ordered(const Record& earlier) const;
  static void merge(Clock& into, const Clock& from);
  void host_merge(const Clock& from);

  using SegIt = std::map<uintptr_t, Segment>::iterator;
  void split_at(uintptr_t at);
  SegIt cover(uintptr_t begin, uintptr_t end);  // splits and fills gaps; first segment of [begin, end)
  void coalesce(uintptr_t begin, uintptr_t end);
  void check_access(const Access& a, const Record& cur, std::vector<Pending>& out);
  void check_segment(uintptr_t begin, const Segment& seg, const Record& cur, std::vector<Pending>& out);
  void apply_access(const Access& a, const Record& cur, bool poison);
  void emit(std::vector<Pending>& pending, const Record& cur);
  AccessSite site(const Record& r) const;
  RaceReport make_report(const Pending& p, const Record& cur) const;

  const SanitizerOptions options_;
  mutable std::mutex mu_;
  std::unordered_map<const StreamImpl*, uint32_t> stream_ids_;
  std::vector<StreamState> streams_;
  std::unordered_map<const EventImpl*, EventState> events_;
  Clock host_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t> name_ids_;
  std::map<uintptr_t, Segment> segments_;
  std::vector<Allocation> allocs_;  // allocation id - 1
  std::vector<RaceReport> reports_;
  std::vector<std::weak_ptr<const void>> checked_graphs_;
};

// A captured graph on its own: any two nodes whose declared accesses conflict (overlap, one writes) must be
// ordered by the nodes' dependencies, transitively. Returns one report per unordered pair of nodes.
std::vector<RaceReport> check_graph(const std::vector<GraphNode>& nodes);

// Registers a sanitizer as an observer of `device` and returns it (keep it to read reports; it stays
// registered until disable_sanitizer or the device's end).
std::shared_ptr<Sanitizer> enable_sanitizer(Device& device, SanitizerOptions options = {});
void disable_sanitizer(Device& device, const Sanitizer& sanitizer);
// For code that fills memory on the host (the layer's inputs, a zeroed accumulator): tells the sanitizers of
// `device`, if any, that the host wrote these bytes. One atomic load when no sanitizer exists.
void note_host_write(Device& device, const void* p, size_t bytes);

}  // namespace moe::rt
