// The MPI transport of expert parallelism (Open MPI from Debian: openmpi-bin, libopenmpi-dev).
//
// Thread level: MPI is called from the device's worker threads (the exchanges' polls) and from the host
// thread (set-up, the tools' gathers), never from two at once: every call here holds the communicator's
// mutex. So MPI_THREAD_SERIALIZED is what this relies on; init() requests it and fails when the library
// gives less. Only the main stream's operations communicate; the side stream never calls MPI.
//
// Example:
//   auto comm = moe::ep::MpiCommunicator::init(&argc, &argv, std::chrono::seconds(10));
//   MoeLayer layer(config, weights, *dev, {.max_tokens = 64, .comm = comm.get()});
#pragma once

#include <memory>
#include <mutex>

#include "ep/communicator.h"

namespace moe::ep {

class MpiCommunicator final : public Communicator {
 public:
  // MPI_Init_thread (once per process) on MPI_COMM_WORLD; MPI_Finalize when the last one is destroyed.
  static std::unique_ptr<MpiCommunicator> init(int* argc, char*** argv, std::chrono::milliseconds timeout);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void start(Transfer& t) override;
  bool test(Transfer& t) override;
  std::vector<std::string> allgather(const std::string& mine) override;
  void gather_floats(const std::vector<float>& mine, std::vector<float>& out, int root) override;
  [[noreturn]] void abort(int code) override;

 protected:
  std::unique_ptr<TransferState> new_state(TransferShape shape) override;

 private:
  MpiCommunicator(int rank, int size, std::chrono::milliseconds timeout);
  std::mutex mu_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
};

}  // namespace moe::ep
