#include "ep/mpi_communicator.h"

#include <mpi.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace moe::ep {

namespace {

struct MpiState : TransferState {
  std::vector<MPI_Request> requests;
  std::vector<MPI_Status> statuses;
};

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw ExchangeError(std::string(call) + " failed: " + std::string(text, static_cast<size_t>(len)));
}

}  // namespace

std::unique_ptr<MpiCommunicator> MpiCommunicator::init(int* argc, char*** argv, std::chrono::milliseconds timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      throw ExchangeError("MPI provides thread level " + std::to_string(provided) +
                          "; expert parallelism needs MPI_THREAD_SERIALIZED (calls from worker threads, one at a "
                          "time)");
    }
    // Errors come back as return codes, so that a failed exchange fails its stream with a message.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(rank, size, timeout));
}

MpiCommunicator::MpiCommunicator(int rank, int size, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), timeout_(timeout) {}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::unique_ptr<TransferState> MpiCommunicator::new_state(TransferShape shape) {
  auto s = std::make_unique<MpiState>();
  s->requests.resize(shape.sends + shape.recvs, MPI_REQUEST_NULL);
  s->statuses.resize(shape.sends + shape.recvs);
  return s;
}

void MpiCommunicator::start(Transfer& t) {
  auto& s = static_cast<MpiState&>(*t.state);
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (size_t i = 0; i < t.num_recvs; ++i) {
    const Transfer::Recv& r = t.recvs[i];
    check(MPI_Irecv(r.data, static_cast<int>(r.capacity), MPI_BYTE, r.peer, r.tag, MPI_COMM_WORLD, &s.requests[n++]),
          "MPI_Irecv");
  }
  for (size_t i = 0; i < t.num_sends; ++i) {
    const Transfer::Send& m = t.sends[i];
    check(MPI_Isend(m.data, static_cast<int>(m.bytes), MPI_BYTE, m.peer, m.tag, MPI_COMM_WORLD, &s.requests[n++]),
          "MPI_Isend");
  }
  t.started = std::chrono::steady_clock::now();
  t.active = true;
}

bool MpiCommunicator::test(Transfer& t) {
  auto& s = static_cast<MpiState&>(*t.state);
  const int n = static_cast<int>(t.num_recvs + t.num_sends);
  int done = 0;
  {
    std::lock_guard lk(mu_);
    check(MPI_Testall(n, s.requests.data(), &done, s.statuses.data()), "MPI_Testall");
  }
  if (done) {
    for (size_t i = 0; i < t.num_recvs; ++i) {
      int count = 0;
      MPI_Get_count(&s.statuses[i], MPI_BYTE, &count);
      t.recvs[i].received = static_cast<size_t>(count);
    }
    t.active = false;
    return true;
  }
  if (std::chrono::steady_clock::now() - t.started < timeout_) return false;
  // Which peers are silent: the requests still pending (tested one by one, without completing the others).
  std::string peers;
  for (size_t i = 0; i < t.num_recvs + t.num_sends; ++i) {
    int flag = 0;
    {
      std::lock_guard lk(mu_);
      MPI_Request_get_status(s.requests[i], &flag, MPI_STATUS_IGNORE);
    }
    if (flag) continue;
    const bool recv = i < t.num_recvs;
    const int peer = recv ? t.recvs[i].peer : t.sends[i - t.num_recvs].peer;
    const std::string what = (recv ? "receive from rank " : "send to rank ") + std::to_string(peer);
    if (peers.find(what) == std::string::npos) peers += (peers.empty() ? "" : ", ") + what;
  }
  throw ExchangeError("exchange '" + t.what + "' on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                      " timed out after " + std::to_string(timeout_.count()) + " ms: " + peers +
                      " not complete (a peer died or stalled)");
}

std::vector<std::string> MpiCommunicator::allgather(const std::string& mine) {
  std::lock_guard lk(mu_);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size_));
  check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
  std::vector<int> displs(static_cast<size_t>(size_), 0);
  for (int r = 1; r < size_; ++r) displs[r] = displs[r - 1] + lens[r - 1];
  std::string all(static_cast<size_t>(displs.back() + lens.back()), '\0');
  check(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, MPI_COMM_WORLD),
        "MPI_Allgatherv");
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(lens[r])));
  return out;
}

void MpiCommunicator::gather_floats(const std::vector<float>& mine, std::vector<float>& out, int root) {
  std::lock_guard lk(mu_);
  int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(size_));
  check(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, root, MPI_COMM_WORLD), "MPI_Gather");
  std::vector<int> displs(static_cast<size_t>(size_), 0);
  if (rank_ == root) {
    for (int r = 1; r < size_; ++r) displs[r] = displs[r - 1] + counts[r - 1];
    out.resize(static_cast<size_t>(displs.back() + counts.back()));
  }
  check(MPI_Gatherv(mine.data(), n, MPI_FLOAT, out.data(), counts.data(), displs.data(), MPI_FLOAT, root,
                    MPI_COMM_WORLD),
        "MPI_Gatherv");
}

void MpiCommunicator::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace moe::ep
