// Expert parallelism's transport: the ranks of one job and the non-blocking exchanges between them.
//
// The layer never calls a transport directly: its dispatch and combine exchanges are polling operations on
// the main stream (layer/ops/ep_ops.cpp) that start() a Transfer and test() it from their poll until it is
// complete, so a worker never blocks and the shared expert runs on the side stream while rows travel. The
// side stream never communicates. The MPI implementation is ep/mpi_communicator.h; this header names no
// transport.
//
// Example (two ranks swapping one int):
//   ep::Transfer t = comm.make_transfer("swap", {.sends = 1, .recvs = 1});
//   t.sends[0] = {.peer = 1 - comm.rank(), .data = &mine, .bytes = 4, .tag = 7};
//   t.recvs[0] = {.peer = 1 - comm.rank(), .data = &theirs, .capacity = 4, .tag = 7};
//   comm.start(t);
//   while (!comm.test(t)) {}          // throws ExchangeError after the timeout, naming the silent peers
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace moe::ep {

// normal: a round of counts, then rows of exactly those sizes (DeepEP's normal mode). low-latency: one round
// into receive buffers sized for the most rows, the count travelling with the rows (no round trip).
enum class ExchangeMode : uint8_t { kNormal, kLowLatency };
inline const char* exchange_mode_name(ExchangeMode m) { return m == ExchangeMode::kNormal ? "normal" : "low-latency"; }

// An exchange that failed or timed out. what() names the exchange, this rank and the peers it waited for.
class ExchangeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The implementation's request state of one Transfer (MPI requests); opaque here.
struct TransferState {
  virtual ~TransferState() = default;
};

// The messages of one exchange. Built once (make_transfer sizes it) and reused every call: the pointers
// and sizes are rewritten before each start(), which allocates nothing.
struct Transfer {
  struct Send {
    int peer = 0;
    const void* data = nullptr;
    size_t bytes = 0;
    int tag = 0;
  };
  struct Recv {
    int peer = 0;
    void* data = nullptr;
    size_t capacity = 0;   // the message may be shorter (low-latency receive buffers are sized for the most)
    int tag = 0;
    size_t received = 0;   // set when the transfer completes
  };
  std::string what;  // the exchange's name, for errors ("ep.dispatch")
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  size_t num_sends = 0, num_recvs = 0;  // the entries in use this call (<= the vectors' sizes)
  std::unique_ptr<TransferState> state;
  std::chrono::steady_clock::time_point started;
  bool active = false;
};

struct TransferShape {
  size_t sends = 0, recvs = 0;  // the most messages of either kind one call posts
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // How long test() waits for a transfer before it throws ExchangeError (a dead or stalled peer).
  virtual std::chrono::milliseconds timeout() const = 0;

  Transfer make_transfer(std::string what, TransferShape shape) {
    Transfer t;
    t.what = std::move(what);
    t.sends.resize(shape.sends);
    t.recvs.resize(shape.recvs);
    t.state = new_state(shape);
    return t;
  }
  // Posts the first num_sends sends and num_recvs receives of `t`. The buffers must stay untouched until
  // test() returns true.
  virtual void start(Transfer& t) = 0;
  // Progresses `t`; true once every message is complete (then Recv::received holds the sizes). Throws
  // ExchangeError when the timeout passes first, naming the peers whose messages are not done.
  virtual bool test(Transfer& t) = 0;

  // Blocking collectives for set-up and the tools (never inside a forward): every rank's string, in rank
  // order; every rank's rows gathered at `root` in rank order (`out` is resized there).
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;
  virtual void gather_floats(const std::vector<float>& mine, std::vector<float>& out, int root) = 0;
  // Ends the whole job at once with `code` (an unrecoverable exchange failure: peers may be mid-transfer).
  [[noreturn]] virtual void abort(int code) = 0;

 protected:
  virtual std::unique_ptr<TransferState> new_state(TransferShape shape) = 0;
};

// Every rank passes the same named values in the same order; throws ExchangeError on every rank, naming the
// first value that differs and what each rank has, when they do not agree (collective).
inline void check_agreement(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& values) {
  std::string mine;
  for (const auto& [name, value] : values) mine += value + '\n';
  const std::vector<std::string> all = comm.allgather(mine);
  std::vector<std::vector<std::string>> lines(all.size());  // per rank, one value per line
  for (size_t r = 0; r < all.size(); ++r)
    for (size_t at = 0, end; (end = all[r].find('\n', at)) != std::string::npos; at = end + 1)
      lines[r].push_back(all[r].substr(at, end - at));
  for (size_t i = 0; i < values.size(); ++i) {
    bool differ = false;
    for (const auto& l : lines) differ |= l.size() <= i || l[i] != lines[0][i];
    if (!differ) continue;
    std::string seen;
    for (size_t r = 0; r < lines.size(); ++r)
      seen += (r ? ", rank " : "rank ") + std::to_string(r) + ": " + (lines[r].size() > i ? lines[r][i] : "?");
    throw ExchangeError("expert-parallel ranks disagree on " + values[i].first + " (" + seen + ")");
  }
}

// Rank r of n owns experts [first_expert(r), first_expert(r + 1)): E split as evenly as possible, the
// first E % n ranks one more.
inline int64_t first_expert(int64_t num_experts, int n, int r) {
  const int64_t base = num_experts / n, extra = num_experts % n;
  return r * base + std::min<int64_t>(r, extra);
}

}  // namespace moe::ep
