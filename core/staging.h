// Ops whose local memory is on a GPU, carried by a backend that moves host
// memory only (tcp; the memory backend to an owner whose buffer is in host
// memory; ibverbs where the NIC cannot register the GPU memory): the stager
// runs each as pieces through pinned host memory.
//
// A read piece is read into a staging buffer by an op of its own (a host
// op, routed as any other), then copied to the GPU; a write piece is copied
// from the GPU into a staging buffer, then written. Up to kPiecesInFlight
// pieces of an op move at once, so the copy of one overlaps the transport's
// work on the next. Each piece is one part of the op (expect_parts).
//
// The contracts of Transfer hold: every copy to or from the op's local
// memory runs inside the transfer's begin_touch/end_touch bracket, on the
// stager's thread, and is finished when the bracket closes, so once a wait
// has returned an error no byte reaches the GPU memory any more. The pieces'
// own ops carry the op's deadline.
//
// Thread-safe. One thread of its own (started on first use) does the copies
// and starts the pieces.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "rdmabuf/backend.h"

namespace rdmabuf {

class Stager {
 public:
  // Starts host-memory ops and calls `on_done` once they finish (as
  // ManagerImpl::start does).
  using Start = std::function<std::shared_ptr<TransferState>(
      std::vector<Op> ops, std::chrono::milliseconds timeout, std::function<void()> on_done)>;

  static constexpr uint64_t kPieceBytes = 4 << 20;
  static constexpr uint32_t kPiecesInFlight = 4;
  // Pinned memory kept for staging, in all: more pieces wait for some.
  static constexpr uint64_t kPoolBytes = 64 << 20;

  explicit Stager(Start start) : start_(std::move(start)) {}
  ~Stager() { shutdown(); }
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // Runs op `index` of `transfer` (routed, not yet handed to a backend)
  // through staging. `why`: why the backend cannot take its local memory,
  // added to the op's note.
  void stage(const std::shared_ptr<TransferState>& transfer, uint32_t index);
  // Starts no more pieces: the rest of every staged op fails with
  // kCancelled. Call as the manager begins to shut down.
  void stop_starting();
  // stop_starting(), then waits for the pieces under way and joins the
  // thread. Call after the backends have shut down (so that every piece
  // has finished). On the stager's own thread (a callback), it only asks
  // the thread to end; the destructor joins it.
  void shutdown();

 private:
  struct StagedOp;
  struct Piece;
  struct Task {
    std::shared_ptr<StagedOp> op;
    std::shared_ptr<Piece> landed;  // null: start pieces of `op`
  };

  void run();
  // A task popped from tasks_, run without mu_ held.
  void run_task(const Task& task);
  void start_pieces(const std::shared_ptr<StagedOp>& op);
  void start_piece(const std::shared_ptr<StagedOp>& op, const std::shared_ptr<Piece>& piece);
  void finish_piece(const std::shared_ptr<StagedOp>& op, const std::shared_ptr<Piece>& piece);
  void complete(StagedOp& op, const Status& status);
  // A staging buffer of at least `size` bytes, or an empty one when the
  // pool is spent (then the piece waits for one to come back).
  Result<LocalMemory> take_buffer(uint64_t size);
  void give_back(LocalMemory buffer);
  void push(Task task);

  const Start start_;

  std::mutex mu_;  // guards the members up to thread_
  std::condition_variable wake_;
  std::deque<Task> tasks_;
  std::vector<std::shared_ptr<StagedOp>> waiting_;  // for a staging buffer
  size_t in_flight_ = 0;                            // pieces started, not finished
  bool stopping_ = false;
  std::thread thread_;

  // Owned by the thread that runs the tasks (the stager's own, or
  // shutdown()'s caller once it has joined it).
  std::multimap<uint64_t, LocalMemory> free_;  // by size
  uint64_t pool_bytes_ = 0;                    // allocated, free or not
};

}  // namespace rdmabuf
