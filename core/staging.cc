#include "core/staging.h"

#include <algorithm>
#include <bit>

#include "common/cuda_driver.h"
#include "common/log.h"
#include "common/op_extents.h"
#include "common/strings.h"

namespace rdmabuf {
namespace {

constexpr uint64_t kSmallestBuffer = 64 << 10;

// The time left until `deadline`, for the pieces' own ops (rounded up, so
// that a piece never gives up before the op it is part of).
std::chrono::milliseconds time_left(Deadline deadline) {
  if (deadline == Deadline::max()) return std::chrono::milliseconds::max();
  const auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return std::chrono::milliseconds(0);
  return std::chrono::ceil<std::chrono::milliseconds>(left);
}

// Copies bytes [piece_offset, + length) of `op`'s sequence between its
// local GPU memory and `staged`, where they lie end to end: one copy per
// extent (a plain op's piece is one), queued together and waited for once.
Status copy_piece(const Op& op, uint64_t piece_offset, uint64_t length, std::byte* staged,
                  bool to_gpu) {
  std::vector<cuda::CopyRange> copies;
  uint64_t at = 0;
  for_each_extent(op, piece_offset, length, [&](const Extent& e) {
    std::byte* gpu = op.local.data() + e.local_offset;
    copies.push_back(to_gpu ? cuda::CopyRange{gpu, staged + at, e.length}
                            : cuda::CopyRange{staged + at, gpu, e.length});
    at += e.length;
  });
  return cuda::copy_all(copies, op.local.device());
}

// The op that moves a piece between the remote buffer and `staged`: a slice
// of a plain op, or the piece's ranges of a scattered one.
Result<Op> piece_op(const Op& whole, uint64_t piece_offset, uint64_t length, LocalMemory staged) {
  if (!whole.ranges) {
    RDMABUF_ASSIGN_OR_RETURN(RemoteBuffer remote, whole.remote.slice(piece_offset, length));
    return Op{whole.kind, std::move(remote), std::move(staged)};
  }
  std::vector<OpRange> ranges;
  uint64_t at = 0;
  for_each_extent(whole, piece_offset, length, [&](const Extent& e) {
    ranges.push_back(OpRange{e.remote_offset, at, e.length});
    at += e.length;
  });
  return whole.kind == OpKind::kReadIntoLocal
             ? Op::read_ranges(whole.remote, std::move(staged), std::move(ranges))
             : Op::write_ranges(whole.remote, std::move(staged), std::move(ranges));
}

}  // namespace

// One staged op. Owned by the stager's thread once handed to it.
struct Stager::StagedOp {
  std::shared_ptr<TransferState> transfer;
  uint32_t index = 0;
  uint64_t piece_bytes = 0;
  uint32_t pieces = 0;
  uint32_t next = 0;       // the first piece not started
  uint32_t in_flight = 0;  // started and not finished
  bool waiting = false;    // in waiting_, for a staging buffer
  Status failed;           // the first piece's failure: the rest are not started
};

struct Stager::Piece {
  uint64_t offset = 0;  // within the op
  uint64_t length = 0;
  LocalMemory buffer;
  std::shared_ptr<TransferState> moved;  // the piece's own op; null when it never started
  Status status;                         // when it never started: why
};

void Stager::stage(const std::shared_ptr<TransferState>& transfer, uint32_t index) {
  auto op = std::make_shared<StagedOp>();
  op->transfer = transfer;
  op->index = index;
  const uint64_t bytes = transfer->op(index).bytes();
  op->piece_bytes = std::min(bytes, kPieceBytes);
  op->pieces = static_cast<uint32_t>((bytes + op->piece_bytes - 1) / op->piece_bytes);
  if (op->pieces > 1) transfer->expect_parts(index, op->pieces);
  push(Task{std::move(op), nullptr});
}

void Stager::push(Task task) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(task));
    if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { run(); });
  }
  wake_.notify_one();
}

void Stager::stop_starting() {
  std::lock_guard lock(mu_);
  stopping_ = true;
}

void Stager::shutdown() {
  std::thread thread;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    thread.swap(thread_);
  }
  wake_.notify_one();
  if (thread.get_id() == std::this_thread::get_id()) {
    // From a callback on the stager's own thread (an on_done that shuts its
    // manager down): the thread ends once its tasks are done, and the
    // destructor joins it.
    std::lock_guard lock(mu_);
    thread_ = std::move(thread);
    return;
  }
  if (thread.joinable()) thread.join();
  // Tasks pushed after the thread ended (none, when the backends have shut
  // down first) are finished here.
  std::unique_lock lock(mu_);
  while (!tasks_.empty()) {
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    run_task(task);
    lock.lock();
  }
}

void Stager::run_task(const Task& task) {
  if (task.landed) {
    finish_piece(task.op, task.landed);
  } else {
    start_pieces(task.op);
  }
}

void Stager::run() {
  std::unique_lock lock(mu_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) {
      if (in_flight_ == 0) break;  // stopping, and every piece has come back
      wake_.wait(lock, [this] { return !tasks_.empty(); });
    }
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    run_task(task);
    lock.lock();
  }
  // Stopping: ops waiting for a staging buffer get none.
  std::vector<std::shared_ptr<StagedOp>> waiting;
  waiting.swap(waiting_);
  lock.unlock();
  for (auto& op : waiting) {
    op->waiting = false;
    start_pieces(op);
  }
}

void Stager::start_pieces(const std::shared_ptr<StagedOp>& op) {
  TransferState& t = *op->transfer;
  while (op->next < op->pieces && op->in_flight < kPiecesInFlight) {
    bool stopping;
    {
      std::lock_guard lock(mu_);
      stopping = stopping_;
    }
    if (stopping && op->failed.ok()) op->failed = Cancelled("the manager is shutting down");
    if (t.cancelled() && op->failed.ok()) op->failed = Cancelled("cancelled");
    if (!op->failed.ok()) {
      // The rest never start; each is still one part of the op.
      for (; op->next < op->pieces; ++op->next)
        t.complete_part(op->index, op->failed);
      return;
    }
    const uint64_t offset = uint64_t{op->next} * op->piece_bytes;
    const uint64_t length = std::min(op->piece_bytes, t.op(op->index).bytes() - offset);
    auto buffer = take_buffer(length);
    if (!buffer.ok()) {
      op->failed = buffer.status();
      continue;
    }
    if (!buffer->data()) {  // the pool is spent: wait for a buffer to come back
      if (!op->waiting) {
        op->waiting = true;
        std::lock_guard lock(mu_);
        waiting_.push_back(op);
      }
      return;
    }
    auto piece = std::make_shared<Piece>();
    piece->offset = offset;
    piece->length = length;
    piece->buffer = std::move(buffer).value();
    ++op->next;
    ++op->in_flight;
    {
      std::lock_guard lock(mu_);
      ++in_flight_;
    }
    start_piece(op, piece);
  }
}

void Stager::start_piece(const std::shared_ptr<StagedOp>& op, const std::shared_ptr<Piece>& piece) {
  TransferState& t = *op->transfer;
  const Op& whole = t.op(op->index);
  LocalMemory staged = piece->buffer;
  if (auto s = staged.slice(0, piece->length); s.ok()) staged = *s;
  auto moved = piece_op(whole, piece->offset, piece->length, staged);
  Status ready = moved.status();
  if (ready.ok() && whole.kind == OpKind::kWriteFromLocal) {
    ready = Cancelled("cancelled");
    if (t.begin_touch()) {  // the GPU's bytes into the staging buffer
      ready = copy_piece(whole, piece->offset, piece->length, staged.data(), /*to_gpu=*/false);
      t.end_touch();
    }
  }
  if (!ready.ok()) {
    piece->status = ready;
    push(Task{op, piece});
    return;
  }
  std::vector<Op> ops;
  ops.push_back(std::move(moved).value());
  // Its completion comes back to this thread, after this assignment.
  piece->moved = start_(std::move(ops), time_left(t.deadline()), [this, op, piece] {
    push(Task{op, piece});
  });
}

void Stager::finish_piece(const std::shared_ptr<StagedOp>& op,
                          const std::shared_ptr<Piece>& piece) {
  TransferState& t = *op->transfer;
  const Op& whole = t.op(op->index);
  Status st = piece->moved ? piece->moved->op_status(0) : piece->status;
  bool stopping;
  {
    std::lock_guard lock(mu_);
    stopping = stopping_;
  }
  // A piece the manager refused as it shut down was cancelled by it.
  if (!st.ok() && stopping) st = Cancelled("the manager is shutting down");
  if (st.ok() && whole.kind == OpKind::kReadIntoLocal) {
    st = Cancelled("cancelled");
    if (t.begin_touch()) {  // the staging buffer's bytes to the GPU
      st = copy_piece(whole, piece->offset, piece->length, piece->buffer.data(), /*to_gpu=*/true);
      t.end_touch();
    }
  }
  if (!st.ok() && op->failed.ok()) op->failed = st;
  t.complete_part(op->index, st);
  give_back(std::move(piece->buffer));
  --op->in_flight;
  {
    std::lock_guard lock(mu_);
    --in_flight_;
  }
  start_pieces(op);
  // A buffer came back: the ops waiting for one may go on.
  std::vector<std::shared_ptr<StagedOp>> waiting;
  {
    std::lock_guard lock(mu_);
    waiting.swap(waiting_);
  }
  for (auto& w : waiting) {
    w->waiting = false;
    start_pieces(w);
  }
}

Result<LocalMemory> Stager::take_buffer(uint64_t size) {
  const uint64_t want = std::bit_ceil(std::max(size, kSmallestBuffer));
  auto it = free_.lower_bound(want);
  if (it != free_.end() && it->first <= 2 * want) {
    LocalMemory buffer = std::move(it->second);
    free_.erase(it);
    return buffer;
  }
  // Room for a new one, making it by dropping free buffers of other sizes.
  while (pool_bytes_ + want > kPoolBytes && !free_.empty()) {
    pool_bytes_ -= free_.begin()->first;
    free_.erase(free_.begin());
  }
  if (pool_bytes_ + want > kPoolBytes) return LocalMemory();
  RDMABUF_ASSIGN_OR_RETURN(LocalMemory buffer, cuda::allocate_pinned(want));
  pool_bytes_ += want;
  return buffer;
}

void Stager::give_back(LocalMemory buffer) {
  if (!buffer.data()) return;
  const uint64_t size = buffer.size();
  free_.emplace(size, std::move(buffer));
}

}  // namespace rdmabuf
